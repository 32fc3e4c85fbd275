"""Refreshes the PyPI-derived facts of a framework's knowledge file from PyPI itself.

PyPI tells what a plain `pip install <package>==X` pulls on Linux x86_64: release date,
Requires-Python, the CPython versions with a manylinux wheel, and the CUDA runtime, cuDNN
and NCCL pins of that wheel's Requires-Dist. Everything else in the file (other CUDA
variants, comments, sources) is curated by hand and left exactly as it is.

- `pypi`: PyPI's JSON API and wheel metadata (retries: envbuild.net.bounded.Retries).
- `wheel_zip`: METADATA read out of a remote wheel by HTTP range.
- `facts`: from PyPI's answers to ReleaseFacts.
- `yaml_edit`: byte-preserving edits of the knowledge file, read back before they count.
- `update`: `refresh`, which compares, diffs and writes atomically.
"""

from envbuild.knowledge.refresh.errors import PypiError, PypiRejected, PypiUnreachable
from envbuild.knowledge.refresh.facts import ReleaseFacts, facts_from_metadata, fetch_release_facts
from envbuild.knowledge.refresh.pypi import PYPI_URL, PypiClient
from envbuild.knowledge.refresh.update import FRAMEWORK_PACKAGES, RefreshResult, diff, refresh
from envbuild.knowledge.refresh.yaml_edit import NEW_RELEASE_COMMENT, PYPI_SOURCE, apply_facts

__all__ = [
    "FRAMEWORK_PACKAGES",
    "NEW_RELEASE_COMMENT",
    "PYPI_SOURCE",
    "PYPI_URL",
    "PypiClient",
    "PypiError",
    "PypiRejected",
    "PypiUnreachable",
    "RefreshResult",
    "ReleaseFacts",
    "apply_facts",
    "diff",
    "facts_from_metadata",
    "fetch_release_facts",
    "refresh",
]
