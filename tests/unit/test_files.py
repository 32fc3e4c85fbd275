"""core.files: the one reader of small files a user names refuses every kind of non-file alike."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild.core.files import FileTooLarge, NotRegularFile, read_small_file

LIMIT = 64


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


def _device(path: Path) -> None:
    path.symlink_to("/dev/zero")


def _socket(path: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()  # the socket file stays


NOT_FILES: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (_fifo, "a named pipe (FIFO)"),
    "directory": (_directory, "a directory"),
    "dev-zero": (_device, "a character device"),
    "socket": (_socket, "a socket"),
}


@pytest.mark.parametrize("kind", sorted(NOT_FILES))
def test_what_is_not_a_regular_file_is_refused_by_kind_never_read(
    kind: str, tmp_path: Path
) -> None:
    make, expected = NOT_FILES[kind]
    path = tmp_path / "input"
    make(path)
    with pytest.raises(NotRegularFile) as caught:
        read_small_file(path, LIMIT)
    assert caught.value.kind == expected


@pytest.mark.parametrize("size", [LIMIT + 1, LIMIT * 10])
def test_a_file_over_the_bound_is_too_large(size: int, tmp_path: Path) -> None:
    path = tmp_path / "big"
    path.write_bytes(b"x" * size)
    with pytest.raises(FileTooLarge) as caught:
        read_small_file(path, LIMIT)
    assert caught.value.size == size


@pytest.mark.parametrize("size", [0, 1, LIMIT])
def test_a_file_within_the_bound_is_read_whole(size: int, tmp_path: Path) -> None:
    path = tmp_path / "small"
    path.write_bytes(b"y" * size)
    assert read_small_file(path, LIMIT) == b"y" * size


def test_a_link_is_followed_unless_refused(tmp_path: Path) -> None:
    (tmp_path / "real").write_bytes(b"data")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert read_small_file(tmp_path / "link", LIMIT) == b"data"
    with pytest.raises(NotRegularFile, match="symbolic link"):
        read_small_file(tmp_path / "link", LIMIT, follow_links=False)


def test_a_missing_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_small_file(tmp_path / "absent", LIMIT)
