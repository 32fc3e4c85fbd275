"""The user's places: where envbuild keeps its records (data), its locks of builds without a
matrix and its build logs (cache). Read from the environment when asked, never at import."""

from __future__ import annotations

import os
from pathlib import Path

from envbuild.core.errors import BadInput

DATA_DIR_FIX = "point ENVBUILD_DATA_DIR at a writable directory"


class StateError(BadInput):
    """envbuild's local record (results.sqlite3) cannot be read or written."""


def data_dir() -> Path:
    """ENVBUILD_DATA_DIR, else $XDG_DATA_HOME/envbuild, else ~/.local/share/envbuild."""
    explicit = os.environ.get("ENVBUILD_DATA_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_DATA_HOME")
    if not base:
        try:
            base = str(Path.home() / ".local" / "share")
        except RuntimeError:
            msg = f"cannot tell where to keep envbuild's records: HOME is not set; {DATA_DIR_FIX}"
            raise StateError(msg) from None
    return Path(base) / "envbuild"


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/envbuild, else ~/.cache/envbuild: what can be made again."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "envbuild"


def log_dir() -> Path:
    """Where the full build log of each entry is kept."""
    return cache_dir() / "logs"


def lock_cache_dir() -> Path:
    """Where locks of builds without a matrix live."""
    return cache_dir() / "locks"
