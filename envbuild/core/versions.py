"""Release strings as versions: the one sort key, the check that a string is a version, and the
short tag of a CUDA version (cu121)."""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from envbuild.core.models import CPU
from envbuild.core.yamlfile import MAX_VERSION_CHARS


def version_sort_key(text: str) -> Version:
    """Sort key that orders release strings as versions (an invalid one sorts as 0)."""
    try:
        return Version(text)
    except (InvalidVersion, ValueError):  # ValueError: a number past Python's int digit limit
        return Version("0")


def is_version(text: str) -> bool:
    """Whether `text` is a version string of sane length."""
    if len(text) > MAX_VERSION_CHARS:
        return False
    try:
        Version(text)
    except (InvalidVersion, ValueError):
        return False
    return True


def cuda_tag(cuda: str) -> str:
    """'cpu' for CPU entries, 'cu121' for CUDA 12.1."""
    return CPU if cuda == CPU else "cu" + cuda.replace(".", "")
