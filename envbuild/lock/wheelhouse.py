"""A wheelhouse (a folder of distribution files) and the framework index it can stand in for.

Used alike by `lock` (what uv resolves against) and `render` (what the build is served), so a
lock and the build that installs it always agree on where the framework comes from.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement

from envbuild.core.models import NO_FRAMEWORK_INDEX, BuildOptions, Entry

WHEEL_SUFFIXES = (".whl", ".tar.gz", ".zip")
_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-(?P<python>[^-]+)-[^-]+-[^-]+\.whl$")


def wheelhouse_files(wheelhouse: Path) -> tuple[Path, ...]:
    """The wheelhouse files a build may fetch: regular files with a distribution's suffix, never
    a link (a link planted in the wheelhouse could point anywhere on the host)."""
    found = []
    for path in sorted(wheelhouse.iterdir()):
        try:
            mode = path.lstat().st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode) and path.name.endswith(WHEEL_SUFFIXES):
            found.append(path)
    return tuple(found)


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _wanted(entry: Entry) -> tuple[str, str]:
    """The framework package's normalized name and pinned version ("torch", "2.13.0+cpu")."""
    requirement = Requirement(entry.install.requirement)
    pins = [spec.version for spec in requirement.specifier if spec.operator == "=="]
    return _normalize(requirement.name), pins[0] if pins else ""


def has_framework_wheel(entry: Entry, wheels: Iterable[Path]) -> bool:
    """Whether `wheels` hold the entry's framework wheel, of its version, for its Python."""
    package, wanted = _wanted(entry)
    python_tag = "cp" + entry.python.replace(".", "")
    for path in wheels:
        match = _WHEEL.match(path.name)
        if match and _normalize(match["name"]) == package and match["version"] == wanted:
            tags = match["python"].split(".")
            # A pure wheel (jax) fits every Python 3; a binary one must be for this Python.
            if python_tag in tags or "py3" in tags:
                return True
    return False


def framework_index(entry: Entry, options: BuildOptions) -> str | None:
    """The framework's own index (PyTorch's CPU or CUDA index), when it must be reached: the
    entry names one, the run is not offline, and the wheelhouse does not hold the wheel.
    `--framework-index` replaces it by a mirror, or by none (the --index-url serves it)."""
    if entry.install.index_url is None or options.offline:
        return None
    if options.framework_index == NO_FRAMEWORK_INDEX:
        return None
    url = options.framework_index or entry.install.index_url
    wheelhouse = options.wheelhouse
    if wheelhouse is not None and wheelhouse.is_dir():
        return None if has_framework_wheel(entry, wheelhouse_files(wheelhouse)) else url
    return url
