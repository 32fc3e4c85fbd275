"""The user's places and the places a command is told to write to (issue 27, items 7 and 9),
and the one request that tells an index that cannot be reached (item 8)."""

from __future__ import annotations

import dataclasses
import os
import pwd
import socket
import stat
import tempfile
from pathlib import Path

import pytest

from envbuild.core.errors import BadInput
from envbuild.core.models import BuildOptions, Install, Knowledge, Selection
from envbuild.core.places import (
    StateError,
    cache_base,
    cache_dir,
    check_output_file,
    check_output_folder,
    home,
    unwritable,
    uv_cache_dir,
)
from envbuild.lock.reach import Reachability
from envbuild.lock.uv import _uv_environment
from tests.support.hostile_registry import HostileRegistry
from tests.support.lock_support import the_entry


def folder_of_kind(kind: str, tmp: Path) -> tuple[Path, str | None]:
    """A folder path of a kind, and what its reason must say (None: files can be made)."""
    a_file = tmp / "a-file"
    a_file.write_text("x")
    cases: dict[str, tuple[Path, str | None]] = {
        "existing": (tmp, None),
        "new-and-nested": (tmp / "a" / "b" / "c", None),
        "a-link-to-a-folder": (tmp / "link", None),
        "a-file": (a_file, "it is not a folder"),
        "below-a-file": (a_file / "a" / "b", f"'{a_file}' is not a folder"),
        "a-dangling-link": (tmp / "dangling", "is a link to nothing"),
        "below-a-dangling-link": (tmp / "dangling" / "x", "is a link to nothing"),
        "a-link-loop": (tmp / "loop", "too many levels of symbolic links"),
        "in-proc": (Path("/proc/envbuild-unit"), "cannot make files in '/proc'"),
        "proc-itself": (Path("/proc/self"), "cannot make files"),
        "a-device": (Path("/dev/null"), "it is not a folder"),
        "name-too-long": (tmp / ("x" * 300), "file name too long"),
    }
    (tmp / "link").symlink_to(tmp, target_is_directory=True)
    (tmp / "dangling").symlink_to(tmp / "nowhere")
    (tmp / "loop").symlink_to(tmp / "loop")
    return cases[kind]


FOLDER_KINDS = ["existing", "new-and-nested", "a-link-to-a-folder",  # fine; the rest are not
                "a-file", "below-a-file",
                "a-dangling-link", "below-a-dangling-link", "a-link-loop", "in-proc",
                "proc-itself", "a-device", "name-too-long"]  # fmt: skip


@pytest.mark.parametrize("kind", FOLDER_KINDS)
def test_unwritable_says_why_and_leaves_nothing(tmp_path: Path, kind: str) -> None:
    folder, expected = folder_of_kind(kind, tmp_path)
    before = sorted(tmp_path.rglob("*"))
    problem = unwritable(folder)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None
        assert expected in problem
    assert sorted(tmp_path.rglob("*")) == before  # the probe file is gone, no folder was made


@pytest.mark.parametrize("kind", FOLDER_KINDS[3:])
def test_an_output_folder_that_cannot_be_made_is_one_bad_input(tmp_path: Path, kind: str) -> None:
    folder, _ = folder_of_kind(kind, tmp_path)
    with pytest.raises(BadInput) as caught:
        check_output_folder(folder, "-o")
    assert caught.value.message.startswith("-o ")
    assert caught.value.message.endswith("; pass a folder that can be made and written")
    assert "\n" not in caught.value.message


def test_a_report_may_replace_a_file_or_a_link_but_no_folder_fifo_or_device(tmp_path: Path) -> None:
    (tmp_path / "old.json").write_text("{}")
    (tmp_path / "link.json").symlink_to(tmp_path / "elsewhere.json")
    for fine in ("old.json", "link.json", "new.json", "new/deeper/r.json"):
        assert check_output_file(tmp_path / fine, "--report") == tmp_path / fine
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "sock"))
        refused = {
            tmp_path / "folder": "it is a folder",
            tmp_path / "fifo": "it is not a regular file",
            tmp_path / "sock": "it is not a regular file",
            Path("/dev/null"): "it is not a regular file",
            tmp_path / "old.json" / "r.json": "is not a folder",
            Path("/proc/r.json"): "cannot make files in '/proc'",
        }
        for path, reason in refused.items():
            with pytest.raises(BadInput, match=reason):
                check_output_file(path, "--report")
    assert stat.S_ISCHR(Path("/dev/null").stat().st_mode)


def test_an_empty_home_is_the_passwd_home_and_a_relative_one_is_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HOME", "")
    assert home() == Path(pwd.getpwuid(os.getuid()).pw_dir)
    monkeypatch.delenv("HOME")
    assert home() == Path(pwd.getpwuid(os.getuid()).pw_dir)
    monkeypatch.setenv("HOME", "relative/home")
    assert home() is None


def test_a_relative_xdg_cache_home_is_ignored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative")
    assert cache_base() == tmp_path / ".cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "envbuild"


def test_without_a_home_the_cache_is_a_private_temporary_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", "not/absolute")
    private = tmp_path / f"envbuild-cache-{os.geteuid()}"
    assert cache_dir() == private
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    private.chmod(0o777)  # as another user could have left it
    with pytest.raises(StateError, match="not a private folder of this user; point XDG_CACHE"):
        cache_dir()
    private.rmdir()
    private.symlink_to(tmp_path, target_is_directory=True)  # planted, to catch our locks
    with pytest.raises(StateError, match="not a private folder"):
        cache_dir()


@pytest.mark.parametrize("kind", ["a-file", "below-a-file", "in-proc", "a-device"])
def test_uv_gets_a_cache_that_works_or_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, knowledge: Knowledge, kind: str
) -> None:
    entry = the_entry(knowledge, Selection(framework="torch", framework_version="2.13.0",
                                           cuda="cpu"))  # fmt: skip
    monkeypatch.delenv("UV_CACHE_DIR", raising=False)
    monkeypatch.delenv("UV_NO_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    env = _uv_environment(entry, BuildOptions())
    assert env["UV_CACHE_DIR"] == str(tmp_path / "xdg" / "uv")
    bad, _ = folder_of_kind(kind, tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(bad))
    env = _uv_environment(entry, BuildOptions())
    assert env["UV_NO_CACHE"] == "1"
    assert "UV_CACHE_DIR" not in env
    monkeypatch.setenv("UV_CACHE_DIR", str(bad))
    with pytest.raises(StateError, match=r"^UV_CACHE_DIR .*; point it at a writable folder"):
        uv_cache_dir()


def test_the_framework_index_out_of_reach_names_what_to_pass(knowledge: Knowledge) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with HostileRegistry() as answering:  # answers 404: reached
        entry = the_entry(knowledge, Selection(framework="torch", framework_version="2.13.0",
                                               cuda="cpu"))  # fmt: skip
        own = Install(requirement=entry.install.requirement,
                      index_url=f"http://127.0.0.1:{port}/whl/cpu")  # fmt: skip
        entry = dataclasses.replace(entry, install=own)
        options = BuildOptions(index_url=f"{answering.url}/simple")
        line = Reachability().unreachable_index(entry, options)
        assert [seen.path for seen in answering.seen] == ["/simple/torch/"]
    assert line == (
        f"torch's own index http://127.0.0.1:{port}/whl/cpu cannot be reached (the connection "
        "was refused); pass --framework-index URL (a mirror of it) or --wheelhouse DIR (a folder "
        "holding the torch wheel), or use locks committed beside the matrix (`envbuild lock -m "
        "MATRIX` where the index can be reached)"
    )
    assert Reachability().unreachable_index(entry, BuildOptions(offline=True)) is None
