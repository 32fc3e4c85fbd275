"""The one way envbuild reads a small file a user names (a matrix, a lock, a CA bundle, Docker's
config): a regular file only, opened without blocking and read up to a bound.

The errors are OSErrors with the reason in their type, so that each caller keeps its own message
(naming its option or file and its fix) and the same file is refused alike everywhere.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class NotRegularFile(OSError):
    """The path names a directory, a FIFO, a device or a socket; `kind` says which."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"is {kind}")
        self.kind = kind


class FileTooLarge(OSError):
    """The file holds more than the bound; `size` is its size when the stat told it."""

    def __init__(self, size: int | None) -> None:
        super().__init__("too large")
        self.size = size


# O_NONBLOCK: a FIFO swapped in after the check must not hang the read.
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def file_kind(mode: int) -> str | None:
    """What a stat mode names when it is not a regular file ("a directory", ...); None if it is."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    return "no regular file"


def read_small_file(path: Path, limit: int, *, follow_links: bool = True) -> bytes:
    """The bytes of the regular file at `path`, at most `limit` of them.

    Raises FileNotFoundError, NotRegularFile, FileTooLarge, or the OSError of the open or read
    (ValueError for a name with a NUL). With follow_links=False a link is refused as NotRegularFile."""
    flags = _FLAGS if follow_links else _FLAGS | os.O_NOFOLLOW
    # stat before open: opening a FIFO without blocking still succeeds, a device may have effects.
    _check(path.stat() if follow_links else path.lstat(), limit)
    fd = os.open(path, flags)
    with os.fdopen(fd, "rb") as handle:
        _check(os.fstat(handle.fileno()), limit)  # replaced since the stat
        data = handle.read(limit + 1)
    if len(data) > limit:  # grew since the stat, or a file that reports no size
        raise FileTooLarge(None)
    return data


def _check(info: os.stat_result, limit: int) -> None:
    kind = file_kind(info.st_mode)
    if kind is not None:
        raise NotRegularFile(kind)
    if info.st_size > limit:
        raise FileTooLarge(info.st_size)
