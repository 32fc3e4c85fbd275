"""Replacing a file in one step, so that a reader never sees half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, text: str, *, keep_mode: bool = False) -> None:
    """Write `text` (UTF-8) to a temporary file beside `path`, then rename it over `path`.

    With `keep_mode` the new file keeps the permissions of the file it replaces; otherwise it
    is private to the user (mkstemp's 0600). OSError reaches the caller, which names the fix;
    the temporary file never remains.
    """
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    temporary = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(text.encode("utf-8"))
        if keep_mode:
            temporary.chmod(path.stat().st_mode & 0o7777)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
