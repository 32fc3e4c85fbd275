"""Hostile paths, indexes and homes through the real command line (issue 27, items 7, 8, 9).

- An output that cannot be written (a file, below a file, /proc, /sys, a device, a link to
  nothing, ...) is refused in one line naming its option, exit 2, before any network or engine
  work: the loopback index, registry and engine the command would reach next see no request.
- An index that cannot be reached (a host that does not resolve, a port that refuses, a server
  that never answers or hangs up) fails `render` and `lock` at once, in one line naming the
  index (never its credentials) and what to pass instead; a fresh lock beside the matrix needs
  no index at all.
- A HOME or cache folder that cannot be used breaks no command that needs no state.

The products run in-process (CliRunner; the tier's fixture refuses Docker); a case of each
class runs as a process, against a loopback engine, with a hang guard.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from envbuild.cli.main import main
from envbuild.core.models import BuildOptions, Entry, Knowledge, Selection
from envbuild.plan.matrix import make_plan
from envbuild.plan.matrix_file import load_matrix
from tests.support.hostile_registry import Answer, HostileRegistry
from tests.support.lock_support import fresh_lock, make_wheel

ROOT = Path(__file__).resolve().parents[2]
SECRET = "Idx-pa55-hostile-41"
ONE_ENTRY = ("--framework", "torch", "--framework-version", "2.13.0", "--cuda", "cpu",
             "--python", "3.11", "--os", "bookworm")  # fmt: skip
ENTRY_ID = "torch2.13.0-cpu-py3.11-bookworm"
IMAGE = "envbuild/torch:2.13.0-cpu-py3.11-bookworm"
ROOT_USER = os.geteuid() == 0


@pytest.fixture(autouse=True)
def _own_docker_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy from the machine's environment or Docker config, and uv's settings as given."""
    for name in list(os.environ):
        if "proxy" in name.lower() or name.startswith("UV_"):
            monkeypatch.delenv(name)
    (tmp_path / "docker-config").mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))


@pytest.fixture
def watcher() -> Iterator[HostileRegistry]:
    """A loopback server standing for the index, registry or engine a command would reach next."""
    with HostileRegistry() as server:
        yield server


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def envbuild(
    *args: str, env: dict[str, str | None] | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m envbuild ARGS` as a process, in this test's environment changed by `env`
    (None: unset)."""
    environment = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            environment.pop(name, None)
        else:
            environment[name] = value
    return subprocess.run(
        [sys.executable, "-m", "envbuild", *args],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,  # a hang guard, not a timing assertion
        check=False,
    )


def one_error_line(code: int, stdout: str, stderr: str, exit_code: int) -> str:
    """The one `envbuild: error:` line of a clean failure with exit `exit_code` (`lock` says
    first how many entries it locks)."""
    assert code == exit_code, stderr
    assert "Traceback" not in stdout + stderr
    assert SECRET not in stdout + stderr
    lines = [line for line in stderr.splitlines() if not line.startswith("locking ")]
    assert len(lines) == 1, lines
    assert lines[0].startswith("envbuild: error: ")
    return lines[0]


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# -- item 7: outputs that cannot be written, refused before the slow part -------------------


def bad_output(kind: str, tmp: Path) -> Path:
    """An output path of a hostile kind (a folder for `render -o`, a file for a report)."""
    a_file = tmp / "a-file"
    a_file.write_text("kept\n")
    dangling, loop = tmp / "dangling", tmp / "loop"
    dangling.symlink_to(tmp / "nowhere")
    loop.symlink_to(loop)
    paths = {
        "a-file": a_file,
        "under-a-file": a_file / "out",
        "deep-under-a-file": a_file / "a" / "b" / "out",
        "under-a-dangling-link": dangling / "out",
        "a-link-loop": loop,
        "under-a-link-loop": loop / "out",
        "a-device": Path("/dev/null"),
        "under-a-device": Path("/dev/null/out"),
        "under-a-fifo": tmp / "a-fifo" / "out",
        "in-proc": Path("/proc/envbuild-hostile-out"),
        "under-proc-self": Path("/proc/self/envbuild-hostile-out"),
        "in-sys": Path("/sys/envbuild-hostile-out"),
        "name-too-long": tmp / ("x" * 300),
        "a-folder": tmp / "a-folder",
        "a-fifo": tmp / "a-fifo",
        "a-link-to-a-file": tmp / "a-link-to-a-file",
        "a-dangling-link": dangling,
        "read-only": tmp / "read-only" / "out",
    }
    if kind == "a-folder":
        paths[kind].mkdir()
    elif kind in ("a-fifo", "under-a-fifo"):
        os.mkfifo(tmp / "a-fifo")
    elif kind == "a-link-to-a-file":
        paths[kind].symlink_to(a_file)
    elif kind == "read-only" and ROOT_USER:
        # Permission bits do not stop root; procfs takes no new files from anyone.
        return Path("/proc/self/fdinfo/envbuild-hostile-out")
    elif kind == "read-only":
        (tmp / "read-only").mkdir(mode=0o500)
    return paths[kind]


EVERY_OUTPUT = ["under-a-file", "deep-under-a-file", "under-a-dangling-link", "under-a-link-loop",
                "a-device", "under-a-device", "a-fifo", "under-a-fifo", "in-proc",
                "under-proc-self", "in-sys", "name-too-long", "read-only"]  # fmt: skip
# A report replaces a link in one step, so links themselves are bad only where a folder must be.
FOLDER_KINDS = [*EVERY_OUTPUT, "a-file", "a-link-to-a-file", "a-dangling-link", "a-link-loop"]
FILE_KINDS = [*EVERY_OUTPUT, "a-folder"]


def writers(path: Path, watcher: HostileRegistry) -> dict[str, tuple[str, ...]]:
    """Each command and option that writes `path`: what it would reach after its checks."""
    index = ("--index-url", f"{watcher.url}/simple", "--framework-index", f"{watcher.url}/cpu")
    publish = ("publish", "--registry", f"{watcher.host}/team", IMAGE)
    return {
        "render -o": ("render", *ONE_ENTRY, *index, "-o", str(path)),
        "build --report": ("build", "--no-smoke", *ONE_ENTRY, *index, "--report", str(path)),
        "build --junit": ("build", "--no-smoke", *ONE_ENTRY, *index, "--junit", str(path)),
        "publish --report": (*publish, "--report", str(path)),
        "bench --json": ("bench", IMAGE, "--json", str(path)),
        "bench --html": ("bench", IMAGE, "--html", str(path)),
    }


REPORTS = ["build --report", "build --junit", "publish --report", "bench --json", "bench --html"]
OUTPUT_CASES = [("render -o", kind) for kind in FOLDER_KINDS] + [
    (writer, kind) for writer in REPORTS for kind in FILE_KINDS
]


def test_the_output_corpus_is_every_writer_times_every_kind() -> None:
    assert len(OUTPUT_CASES) == len(FOLDER_KINDS) + 5 * len(FILE_KINDS) >= 80


@pytest.mark.parametrize(("writer", "kind"), OUTPUT_CASES)
def test_an_output_that_cannot_be_written_is_refused_before_any_work(
    tmp_path: Path, watcher: HostileRegistry, writer: str, kind: str
) -> None:
    path = bad_output(kind, tmp_path)
    before = files_under(tmp_path)
    result = invoke(*writers(path, watcher)[writer])
    line = one_error_line(result.exit_code, result.stdout, result.stderr, 2)
    assert line.startswith(f"envbuild: error: {writer.split()[1]} "), line
    assert watcher.seen == []  # neither index, registry nor lock resolution was reached
    assert files_under(tmp_path) == before
    assert files_under(Path(os.environ["XDG_CACHE_HOME"])) == []  # no lock resolved


@pytest.mark.parametrize(
    ("writer", "kind"),
    [("render -o", "in-proc"), ("render -o", "under-a-file"), ("build --report", "in-sys"),
     ("build --junit", "a-folder"), ("publish --report", "a-device"),
     ("bench --json", "under-a-dangling-link"), ("bench --html", "read-only")],
)  # fmt: skip
def test_as_a_process_no_engine_is_asked(
    tmp_path: Path, watcher: HostileRegistry, writer: str, kind: str
) -> None:
    path = bad_output(kind, tmp_path)
    with HostileRegistry() as engine:
        done = envbuild(
            *writers(path, watcher)[writer], env={"DOCKER_HOST": f"tcp://{engine.host}"}
        )
        assert engine.seen == []
    line = one_error_line(done.returncode, done.stdout, done.stderr, 2)
    assert line.startswith(f"envbuild: error: {writer.split()[1]} "), line
    assert watcher.seen == []


def test_writable_outputs_still_work(tmp_path: Path, knowledge: Knowledge) -> None:
    """The checks refuse only what cannot be written: a new nested folder, a folder reached
    through a link, and a report over a link are written as before."""
    entry = the_one(knowledge)
    fresh_lock(entry, BuildOptions(), knowledge)
    (tmp_path / "real").mkdir()
    (tmp_path / "via-link").symlink_to(tmp_path / "real", target_is_directory=True)
    for out in (tmp_path / "new" / "deeper", tmp_path / "via-link"):
        result = invoke("render", *ONE_ENTRY, "-o", str(out))
        assert result.exit_code == 0, result.output
        assert (out / ENTRY_ID / "Dockerfile").is_file()


def the_one(knowledge: Knowledge) -> Entry:
    from tests.support.lock_support import the_entry

    return the_entry(
        knowledge, Selection(framework="torch", framework_version="2.13.0", cuda="cpu")
    )


# -- item 7: the folder `envbuild lock` writes, checked before anything is resolved ------------


MATRIX = {  # torch 2.4.1 is PyPI's cu121 wheel: no framework index; stand-in wheels below
    "defaults": {"python": "3.11", "os": "bookworm"},
    "axes": {"framework": ["torch"], "framework_version": ["2.4.1"], "cuda": ["12.1"]},
}


@pytest.fixture
def team(tmp_path: Path) -> Path:
    """team.yaml, and a wheelhouse of stand-in wheels beside it (uv resolves them offline)."""
    path = tmp_path / "team" / "team.yaml"
    (path.parent / "wheels").mkdir(parents=True)
    path.write_text(yaml.safe_dump(MATRIX), encoding="utf-8")
    make_wheel(path.parent / "wheels", "torch", "2.4.1")
    make_wheel(path.parent / "wheels", "numpy", "2.0.0")
    return path


def lock_folder(kind: str, team: Path, monkeypatch: pytest.MonkeyPatch) -> Path | None:
    """Make the folder `envbuild lock` writes into hostile; the matrix to pass (None: no -m)."""
    folder = team.parent / "team.lock"
    if kind == "a-file":
        folder.write_text("kept\n")
    elif kind == "a-fifo":
        os.mkfifo(folder)
    elif kind == "a-dangling-link":
        folder.symlink_to(team.parent / "nowhere")
    elif kind == "a-link-loop":
        folder.symlink_to(folder)
    elif kind == "a-link-into-proc":
        folder.symlink_to("/proc/self")
    elif kind.startswith("cache-"):
        cache = bad_output(kind.removeprefix("cache-"), team.parent)
        monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
        return None
    return team


LOCK_KINDS = ["a-file", "a-fifo", "a-dangling-link", "a-link-loop", "a-link-into-proc",
              "cache-a-file", "cache-under-a-file", "cache-in-proc", "cache-a-device"]  # fmt: skip


@pytest.mark.parametrize("kind", LOCK_KINDS)
def test_lock_refuses_a_folder_it_cannot_write_before_resolving(
    team: Path, watcher: HostileRegistry, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    matrix = lock_folder(kind, team, monkeypatch)
    selectors = ("-m", str(matrix)) if matrix else ("--framework", "torch", "--framework-version",
                                                     "2.4.1", "--cuda", "12.1")  # fmt: skip
    before = files_under(team.parent)
    result = invoke("lock", *selectors, "--index-url", f"{watcher.url}/simple")
    line = one_error_line(result.exit_code, result.stdout, result.stderr, 2)
    assert "cannot write the locks there" in line
    assert "--check" in line
    assert watcher.seen == []
    assert files_under(team.parent) == before


# -- item 8: an index that cannot be reached, at once and in one line -----------------------


@contextlib.contextmanager
def unreachable(kind: str) -> Iterator[tuple[str, HostileRegistry | None]]:
    """The base URL (with credentials) of an index of a kind that cannot be reached, and its
    server when there is one."""
    if kind == "does-not-resolve":
        yield f"http://user:{SECRET}@envbuild-hostile.invalid", None  # RFC 2606: never resolves
    elif kind == "refuses":
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        yield f"http://user:{SECRET}@127.0.0.1:{port}", None
    else:
        answer = Answer(stall=True) if kind == "never-answers" else Answer(raw=[])
        with HostileRegistry(lambda seen: answer) as server:
            yield f"http://user:{SECRET}@{server.host}", server


UNREACHABLE = ["does-not-resolve", "refuses", "never-answers", "hangs-up"]
WHY = {"does-not-resolve": "does not resolve", "refuses": "refused", "never-answers": "no answer",
       "hangs-up": "closed the connection"}  # fmt: skip
ROLES = {  # the option pointing at the unreachable index: what the line must name
    "--framework-index": ("--framework-index", "--wheelhouse"),
    "--index-url": ("--index-url", "--offline"),
    "--extra-index-url": ("--extra-index-url", "leave it out"),
}


def index_options(role: str, bad: str, good: str) -> tuple[str, ...]:
    urls = {"--index-url": f"{good}/simple", "--framework-index": f"{good}/whl/cpu"}
    if role == "--extra-index-url":
        return (*(x for k, v in urls.items() for x in (k, v)), role, f"{bad}/extra")
    urls[role] = f"{bad}/simple" if role == "--index-url" else f"{bad}/whl/cpu"
    return tuple(x for k, v in urls.items() for x in (k, v))


@pytest.mark.parametrize("command", ["render", "lock"])
@pytest.mark.parametrize("role", list(ROLES))
@pytest.mark.parametrize("kind", UNREACHABLE)
def test_an_unreachable_index_fails_at_once_in_one_line(
    tmp_path: Path, watcher: HostileRegistry, kind: str, role: str, command: str
) -> None:
    out = tmp_path / "out"
    with unreachable(kind) as (bad, _):
        args = index_options(role, bad, watcher.url)
        extra = ("-o", str(out)) if command == "render" else ()
        done = envbuild(command, *ONE_ENTRY, *args, *extra, env={"UV_HTTP_TIMEOUT": "2"})
    line = one_error_line(done.returncode, done.stdout, done.stderr, 1)
    assert "cannot be reached" in line
    assert WHY[kind] in line
    assert all(name in line for name in ROLES[role]), line
    assert "user:" not in line
    assert not out.exists()
    assert files_under(Path(os.environ["XDG_CACHE_HOME"])) == []


def test_each_index_is_asked_once_and_said_once_for_many_entries(
    tmp_path: Path, watcher: HostileRegistry
) -> None:
    three = ("--framework", "torch", "--framework-version", "2.1", "--cuda", "cpu")
    with unreachable("hangs-up") as (bad, server):
        args = index_options("--framework-index", bad, watcher.url)
        result = invoke("render", *three, *args, "-o", str(tmp_path / "out"))
        assert server is not None
        assert len(server.seen) == 1
    assert len(watcher.seen) == 1
    assert result.stdout == ""
    one_error_line(result.exit_code, result.stdout, result.stderr, 1)


def team_entry(path: Path, knowledge: Knowledge) -> Entry:
    (entry,) = make_plan(knowledge, load_matrix(path, knowledge), Selection()).entries
    return entry


def test_a_fresh_lock_beside_the_matrix_renders_without_any_index(
    tmp_path: Path, watcher: HostileRegistry, knowledge: Knowledge
) -> None:
    """The committed lock is what render shows; only a stale one needs the index, and then
    the index that cannot be reached is named at once."""
    path = tmp_path / "team.yaml"
    axes = {"framework": ["torch"], "framework_version": ["2.13.0"], "cuda": ["cpu"]}
    path.write_text(yaml.safe_dump({**MATRIX, "axes": axes}), encoding="utf-8")
    with unreachable("refuses") as (bad, _):
        args = index_options("--framework-index", bad, watcher.url)
        options = BuildOptions(index_url=args[1], framework_index=args[3])
        fresh_lock(team_entry(path, knowledge), options, knowledge, matrix_path=path)
        fresh = invoke("render", "-m", str(path), *args, "-o", str(tmp_path / "out"))
        assert fresh.exit_code == 0, fresh.output
        assert watcher.seen == []
        assert (tmp_path / "out" / ENTRY_ID / "envbuild.lock").is_file()
        stale = invoke("render", "-m", str(path), "-p", "rich", *args, "-o", str(tmp_path / "o2"))
    line = one_error_line(stale.exit_code, stale.stdout, stale.stderr, 1)
    assert "--framework-index" in line
    assert "--wheelhouse" in line
    assert not (tmp_path / "o2").exists()


# -- item 9: a HOME or cache that cannot be used breaks no command that needs no state ------


def hostile_home(kind: str, tmp: Path) -> dict[str, str | None]:
    """The environment of a HOME of a hostile kind (the cache unset: it follows HOME)."""
    places = tmp / "places"
    places.mkdir()
    a_file = places / "a-file"
    a_file.write_text("kept\n")
    (places / "dangling").symlink_to(places / "nowhere")
    home = {
        "unset": None,
        "empty": "",
        "a-file": str(a_file),
        "under-a-file": str(a_file / "home"),
        "nonexistent": str(places / "no" / "such" / "home"),
        "a-dangling-link": str(places / "dangling"),
        "in-proc": "/proc/envbuild-hostile-home",
        "read-only": "/proc/self/fdinfo" if ROOT_USER else str(places / "read-only"),
        "a-device": "/dev/null",
    }[kind]
    if kind == "read-only" and not ROOT_USER:
        (places / "read-only").mkdir(mode=0o500)
    return {"HOME": home, "XDG_CACHE_HOME": None}


def hostile_cache(kind: str, tmp: Path) -> dict[str, str | None]:
    """The environment of an XDG_CACHE_HOME (or UV_CACHE_DIR) of a hostile kind."""
    (tmp / "home").mkdir()
    a_file = tmp / "a-file"
    a_file.write_text("kept\n")
    name, _, kind = kind.rpartition(":")
    value = {
        "a-file": str(a_file),
        "under-a-file": str(a_file / "cache"),
        "relative": "relative-cache",
        "in-proc": "/proc/envbuild-hostile-cache",
        "a-device": "/dev/null",
        "empty": "",
    }[kind]
    return {"HOME": str(tmp / "home"), "XDG_CACHE_HOME": None, name or "XDG_CACHE_HOME": value}


HOMES = ["unset", "empty", "a-file", "under-a-file", "nonexistent", "a-dangling-link",
         "in-proc", "read-only", "a-device"]  # fmt: skip
CACHES = ["a-file", "under-a-file", "relative", "in-proc", "a-device", "empty"]
STATELESS = ["plan", "ci-matrix", "render -m", "render", "lock -m"]


def stateless(command: str, team: Path, out: Path) -> tuple[str, ...]:
    offline = ("--offline", "--wheelhouse", str(team.parent / "wheels"))
    one = ("--framework", "torch", "--framework-version", "2.4.1", "--cuda", "12.1")
    return {
        "plan": ("plan", "--framework", "torch"),
        "ci-matrix": ("ci-matrix", "-m", str(team)),
        "render -m": ("render", "-m", str(team), *offline, "-o", str(out)),
        "render": ("render", *one, *offline, "-o", str(out)),
        "lock -m": ("lock", "-m", str(team), *offline),
    }[command]


def run_in(
    environment: dict[str, str | None], monkeypatch: pytest.MonkeyPatch, *args: str
) -> Result:
    for name, value in environment.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    return invoke(*args)


def assert_it_worked(result: Result, command: str, team: Path, out: Path) -> None:
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    if command.startswith("render"):
        assert (out / "torch2.4.1-cu121-py3.11-bookworm" / "Dockerfile").is_file()
    if command == "lock -m":
        assert (team.parent / "team.lock" / "torch2.4.1-cu121-py3.11-bookworm.txt").is_file()


@pytest.mark.parametrize("command", STATELESS)
@pytest.mark.parametrize("kind", HOMES)
def test_a_hostile_home_breaks_no_stateless_command(
    tmp_path: Path, team: Path, monkeypatch: pytest.MonkeyPatch, kind: str, command: str
) -> None:
    if kind in ("unset", "empty") and command == "render":
        pytest.skip("no HOME is the passwd home: this would resolve a lock into the real cache")
    out = tmp_path / "out"
    result = run_in(hostile_home(kind, tmp_path), monkeypatch, *stateless(command, team, out))
    assert_it_worked(result, command, team, out)


@pytest.mark.parametrize("command", ["render -m", "render", "plan"])
@pytest.mark.parametrize("kind", CACHES)
def test_a_hostile_cache_home_breaks_no_stateless_command(
    tmp_path: Path, team: Path, monkeypatch: pytest.MonkeyPatch, kind: str, command: str
) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    result = run_in(hostile_cache(kind, tmp_path), monkeypatch, *stateless(command, team, out))
    assert_it_worked(result, command, team, out)
    assert not (tmp_path / "relative-cache").exists()  # a relative XDG_CACHE_HOME is ignored


@pytest.mark.parametrize("kind", ["a-file", "under-a-file", "in-proc", "a-device"])
def test_a_uv_cache_dir_that_cannot_be_used_is_named_in_one_line(
    tmp_path: Path, team: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    out = tmp_path / "out"
    environment = hostile_cache(f"UV_CACHE_DIR:{kind}", tmp_path)
    result = run_in(environment, monkeypatch, *stateless("render -m", team, out))
    line = one_error_line(result.exit_code, result.stdout, result.stderr, 2)
    assert line.startswith("envbuild: error: UV_CACHE_DIR "), line
    assert "unset it" in line
    assert not out.exists()


@pytest.mark.parametrize("kind", ["a-file", "in-proc", "a-device"])
def test_as_a_process_a_hostile_home_renders_and_says_where_the_lock_went(
    tmp_path: Path, team: Path, kind: str
) -> None:
    out = tmp_path / "out"
    done = envbuild(*stateless("render", team, out), env=hostile_home(kind, tmp_path))
    assert done.returncode == 0, done.stderr
    assert (out / "torch2.4.1-cu121-py3.11-bookworm" / "Dockerfile").is_file()
    (line,) = done.stderr.splitlines()
    assert "cannot be written; lock resolved for this run only" in line
    assert "XDG_CACHE_HOME" in line
