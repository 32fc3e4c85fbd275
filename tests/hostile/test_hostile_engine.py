"""Whole `envbuild` processes against a hostile Docker engine (tests/support/hostile_engine.py).

Each case makes one request of the Engine API answer one hostile way, every time it is asked
(an error status, an error body that is not the API's, an HTML page, garbage or another shape of
JSON, nothing, a stall, a body or stream cut short), and runs a command that asks it, with
DOCKER_HOST naming the fake engine on loopback. The corpus is every request a command asks
times every hostile answer, for the first command that asks it, and two answers for each other
command that asks it too.

A case ends as its answer means: exit 3 and exactly one line naming the engine and the request
(exit 1 and one FAILED line where the request belongs to one entry's build); no traceback;
within the hang guard, a stalled answer ending after ENVBUILD_ENGINE_TIMEOUT; every container
the run made removed, or named in a warning when the engine will not remove it; and no scratch
folder left. An answer with a meaning to the caller (no such image, no such container, a 200
whose body docker-py never reads) is taken at its word instead, as each rule below says.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from envbuild.core.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_NO_ENGINE
from envbuild.core.models import BuildOptions, Selection
from envbuild.core.results import SmokeCheck, SmokeResult
from envbuild.core.store import ResultStore
from envbuild.engine.docker_engine import TIMEOUT_ENV, DockerEngine
from envbuild.engine.interface import Engine
from envbuild.knowledge.load import load_knowledge
from tests.support.hostile_engine import (
    API_VERSION,
    HOSTILE_NAMES,
    STREAMED,
    HostileEngine,
    image_id_of,
)
from tests.support.hostile_registry import HostileRegistry, Published
from tests.support.lock_support import fresh_lock, the_entry

ROOT = Path(__file__).resolve().parents[2]
ONE_ENTRY = ("--framework", "torch", "--framework-version", "2.13.0", "--cuda", "cpu",
             "--python", "3.11", "--os", "bookworm")  # fmt: skip
ENTRY_ID = "torch2.13.0-cpu-py3.11-bookworm"
IMAGE = "hostile/torch:1"  # smoke-tested, benched and published
MISSING_BASE = "hostile/base:missing"  # not in the engine until pulled
TIMEOUT = "1"  # ENVBUILD_ENGINE_TIMEOUT for every case: when a stalled answer ends
SECONDARY = ("500",)  # for a request another command asked first

# How a case ends.
ENGINE = "one line naming the engine and the request, exit 3"
ENTRY = "the entry failed: one FAILED line naming the engine and the request, exit 1"
LEFT = "a warning names each container the engine would not remove"
WARNED = "a warning names the engine and the request; the command goes on"
TAKEN = "the answer means something to the caller, who acts on it"


@dataclass(frozen=True)
class Command:
    """An envbuild command line, and what it asks the engine when the engine answers well."""

    name: str
    argv: tuple[str, ...]
    baseline: int  # its exit code then (the fake engine runs no payload: a smoke test fails)
    reaches: frozenset[str]  # the requests it asks
    entry: frozenset[str] = frozenset()  # those asked for one entry's build
    missing: tuple[str, ...] = ()
    registry: bool = False  # "{registry}" in argv: a registry that holds nothing
    vetted: bool = False  # IMAGE has passed a smoke test (publish needs it)
    # What the docker client asks (doctor's BuildKit probe), not envbuild: outside this corpus.
    client: frozenset[str] = frozenset()

    def __str__(self) -> str:
        return self.name


CONNECT = ("GET /version", "GET /_ping")
# The corpus is of the engine's API answers, which the classic builder reads (BuildKit's come to
# the docker client); which builder works is asked of the engine's info.
CLASSIC = ("--builder", "classic")
BUILDERS = ("GET /info",)
LEFTOVERS = ("GET /containers/json", "GET /containers/{id}/json", "DELETE /containers/{id}")
RUN = ("POST /containers/create", "POST /containers/{id}/start", "POST /containers/{id}/wait",
       "GET /containers/{id}/logs", "GET /containers/{id}/json", "DELETE /containers/{id}")  # fmt: skip
PAYLOAD = ("PUT /containers/{id}/archive",)  # a payload is copied in; a probe needs nothing
BUILD = ("GET /networks/{name}", "POST /build")
OFFLINE = ("GET /networks", "POST /networks/create")  # the build network with no way out
IMAGES = ("GET /images/{name}/json",)
PUSH = ("POST /images/{name}/tag", "POST /images/{name}/push", "DELETE /images/{name}")

COMMANDS = (
    Command(
        "build",
        ("build", "--no-smoke", *ONE_ENTRY, *CLASSIC),
        0,
        frozenset((*CONNECT, *BUILDERS, *LEFTOVERS, *IMAGES, *RUN, *BUILD)),
        entry=frozenset(BUILD),
    ),
    Command(
        "build-pulling",
        ("build", "--no-smoke", *ONE_ENTRY, *CLASSIC, "--base-image", MISSING_BASE),
        0,
        frozenset((*CONNECT, *BUILDERS, *LEFTOVERS, *IMAGES, "POST /images/create", *RUN, *BUILD)),
        entry=frozenset(BUILD),
        missing=(MISSING_BASE,),
    ),
    Command(
        "build-offline",
        ("build", "--no-smoke", *ONE_ENTRY, *CLASSIC, "--offline", "--wheelhouse", "{wheelhouse}"),
        0,
        frozenset((*CONNECT, *BUILDERS, *LEFTOVERS, *IMAGES, *RUN, *BUILD, *OFFLINE)),
        entry=frozenset((*BUILD, *OFFLINE)),
    ),
    Command(
        "smoke",
        ("smoke", IMAGE, "--timeout", "10"),
        EXIT_FAILED,
        frozenset((*CONNECT, *LEFTOVERS, "GET /info", *IMAGES, *RUN, *PAYLOAD)),
    ),
    Command(
        "publish",
        ("publish", IMAGE, "--registry", "{registry}/team"),
        EXIT_FAILED,  # the registry never sees what the fake engine pushed
        frozenset((*CONNECT, *IMAGES, *PUSH)),
        registry=True,
        vetted=True,
    ),
    Command(
        "bench",
        ("bench", IMAGE),
        EXIT_FAILED,
        frozenset((*CONNECT, *LEFTOVERS, "GET /info", *IMAGES, *RUN, *PAYLOAD)),
    ),
    Command(
        "doctor",
        ("doctor",),
        0,
        frozenset((*CONNECT, "GET /info")),
        # On its way out the client may cancel its build session, or not: a race in the client.
        client=frozenset(("? POST /session", "POST /build", "? POST /build/cancel")),
    ),
    Command(
        "base bootstrap", ("base", "bootstrap", "--tag", IMAGE), 0, frozenset((*CONNECT, *IMAGES))
    ),
)

# 200 answers whose body docker-py never reads: the status is the whole answer.
BODY_UNREAD = ("PUT /containers/{id}/archive", "POST /containers/{id}/start",
               "POST /images/{name}/tag", "DELETE /containers/{id}")  # fmt: skip
BAD_BODY = ("html-page", "garbage-json", "wrong-shape", "empty-body")  # each with status 200
STATUS = ("404", "409", "500", "500-list-body", "502-html")  # each an error status


@dataclass(frozen=True)
class Outcome:
    kind: str
    code: int


def expected(command: Command, endpoint: str, answer: str) -> Outcome | None:
    """How `command` ends when `endpoint` answers `answer`; None: a case not run, and why."""
    if endpoint == "POST /containers/{id}/wait" and answer.startswith("stalled"):
        return None  # bounded by the payload's own timeout (minutes), not the answer's
    if endpoint in STREAMED and answer == "stalled-body":
        return None  # a long operation's begun answer may pause as long as a step runs
    if command.name == "base bootstrap" and answer == "404":
        return None  # no such image: bootstrap runs debootstrap, which needs root and a mirror
    if endpoint == "POST /networks/create" and answer == "409":
        # "Another run made it first": the build then inspects it, and the fake has none.
        return Outcome(TAKEN, EXIT_FAILED)
    if endpoint in BODY_UNREAD and answer in BAD_BODY:
        return Outcome(TAKEN, command.baseline)
    if endpoint == "DELETE /containers/{id}":
        # 404 is "no such container": gone already, which is what removing it was for.
        return Outcome(TAKEN if answer == "404" else LEFT, command.baseline)
    if endpoint == "DELETE /images/{name}":
        # 404: another publisher dropped the tag first; else the pushed tag stays, with a warning.
        return Outcome(TAKEN if answer == "404" else WARNED, command.baseline)
    if endpoint == "POST /images/create" and answer in STATUS:
        # Docker's answer to a pull the registry refused or could not be reached for.
        return Outcome(ENGINE, EXIT_BAD_INPUT)
    if endpoint == "GET /images/{name}/json" and answer == "404":
        return Outcome(TAKEN, EXIT_BAD_INPUT)  # no such image: not pulled, not smoke-tested
    if endpoint == "GET /containers/{id}/logs" and answer == "empty-body":
        # The container printed nothing: no base image to probe, no smoke report.
        return Outcome(TAKEN, EXIT_BAD_INPUT if command.name.startswith("build") else EXIT_FAILED)
    if endpoint in command.entry:
        return Outcome(ENTRY, EXIT_FAILED)
    return Outcome(ENGINE, EXIT_NO_ENGINE)


def cases() -> Iterator[tuple[Command, str, str]]:
    """Every request each command asks, with every hostile answer the first time a command
    asks it, and the SECONDARY answers for each later command (but a variant of `build`,
    which meets those requests where `build` does)."""
    tried: set[str] = set()
    for command in COMMANDS:
        for endpoint in sorted(command.reaches):
            if endpoint not in tried:
                answers = HOSTILE_NAMES
            else:
                answers = () if command.name.startswith("build-") else SECONDARY
            for answer in answers:
                if expected(command, endpoint, answer) is not None:
                    yield command, endpoint, answer
            tried.add(endpoint)


CASES = list(cases())


@dataclass
class Run:
    result: subprocess.CompletedProcess[str]
    scratch: list[str]  # what the run left in its TMPDIR

    @property
    def lines(self) -> list[str]:
        return (self.result.stdout + self.result.stderr).splitlines()


def lock_the_entry(wheelhouse: Path | None) -> None:
    """Give the entry `build` builds a fresh lock in this test's cache: nothing to resolve."""
    knowledge = load_knowledge()
    selection = Selection(
        framework="torch", framework_version="2.13.0", cuda="cpu", python="3.11", os="bookworm"
    )
    options = BuildOptions(offline=wheelhouse is not None, wheelhouse=wheelhouse)
    fresh_lock(the_entry(knowledge, selection), options, knowledge)


def run(command: Command, tmp_path: Path, engine: HostileEngine) -> Run:
    """`python -m envbuild ARGV` against `engine`, with its own data, config and scratch."""
    data, scratch, wheelhouse = tmp_path / "data", tmp_path / "scratch", tmp_path / "wheelhouse"
    scratch.mkdir()
    (tmp_path / "docker-config").mkdir()
    wheelhouse.mkdir()
    # --offline checks that the wheelhouse holds the framework's wheel; nothing installs it.
    (wheelhouse / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"PK")
    if command.argv[0] == "build":
        lock_the_entry(wheelhouse if "--offline" in command.argv else None)
    if command.vetted:
        passed = SmokeCheck(name="payload", passed=True, detail="trained")
        ResultStore(data / "results.sqlite3").record_smoke(
            SmokeResult(
                image=IMAGE,
                image_id=image_id_of(IMAGE),
                payload={},
                checks=(passed,),
                exit_code=0,
                seconds=1.0,
                stderr_tail="",
            )
        )
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DOCKER_")}
    env = {**clean, "DOCKER_HOST": engine.docker_host, TIMEOUT_ENV: TIMEOUT,
           "DOCKER_CONFIG": str(tmp_path / "docker-config"), "ENVBUILD_DATA_DIR": str(data),
           "TMPDIR": str(scratch), "ENVBUILD_REGISTRY_TIMEOUT": "5",
           "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"}  # fmt: skip
    with HostileRegistry(Published().routes()) as registry:
        argv = [
            a.replace("{registry}", registry.host).replace("{wheelhouse}", str(wheelhouse))
            for a in command.argv
        ]
        result = subprocess.run(
            [sys.executable, "-m", "envbuild", *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=90,  # a hang guard, not a timing assertion
            check=False,
        )
    return Run(result, sorted(p.name for p in scratch.iterdir()))


def request_pattern(endpoint: str) -> str:
    """What a line shows of a request to `endpoint`: `GET /v1.41/containers/<id>/json`."""
    method, path = endpoint.split(" ", 1)
    shown = re.escape(path).replace(r"\{id\}", "[0-9a-f]{12,64}").replace(r"\{name\}", r"\S+")
    version = "" if endpoint == "GET /version" else re.escape(f"/v{API_VERSION}")
    return f"{method} {version}{shown}\\b"


def naming(lines: list[str], engine: HostileEngine, endpoint: str) -> list[str]:
    """The lines that name the engine and the request to `endpoint`."""
    pattern = re.compile(request_pattern(endpoint))
    return [line for line in lines if engine.docker_host in line and pattern.search(line)]


def ended_cleanly(ran: Run) -> None:
    """No traceback, and no build context or other scratch folder left behind."""
    output = ran.result.stdout + ran.result.stderr
    assert "Traceback" not in output, output[-4000:]
    assert ran.scratch == [], ran.scratch


@pytest.mark.parametrize(
    ("command", "endpoint", "answer"),
    [pytest.param(*case, id=f"{case[0]}-{case[1]}-{case[2]}") for case in CASES],
)
def test_a_hostile_engine_answer_ends_as_it_means(
    command: Command, endpoint: str, answer: str, tmp_path: Path
) -> None:
    outcome = expected(command, endpoint, answer)
    assert outcome is not None
    with HostileEngine(endpoint=endpoint, answer=answer, missing=command.missing) as engine:
        ran = run(command, tmp_path, engine)
    stderr = ran.result.stderr
    ended_cleanly(ran)
    assert endpoint in engine.asked(), engine.asked()  # the case reached what it breaks
    assert ran.result.returncode == outcome.code, stderr[-3000:]
    errors = [line for line in ran.lines if line.startswith("envbuild: error:")]
    named = naming(ran.lines, engine, endpoint)
    if outcome.kind == ENGINE:
        assert len(named) == 1, ran.lines[-20:]
        # doctor reports the engine in its report; every other command in its one error line
        assert errors == (named if command.name != "doctor" else []), ran.lines[-20:]
        assert "NOT reachable" in named[0] or named[0].startswith("envbuild: error:")
    elif outcome.kind == ENTRY:
        # The entry's failure, as it happens and in the summary, and nothing else.
        assert errors == [], stderr[-3000:]
        summary = [line for line in named if line.startswith(f"FAILED {ENTRY_ID}: ")]
        assert len(summary) == 1, stderr[-3000:]
        assert all(f"{ENTRY_ID}: " in line for line in named), stderr[-3000:]
    elif outcome.kind == WARNED:
        assert named, stderr[-3000:]
        assert all("WARNING" in line for line in named), stderr[-3000:]
    else:
        assert not [line for line in errors if engine.docker_host in line], stderr[-3000:]
    left = engine.left_behind()
    if outcome.kind == LEFT:
        assert left, engine.asked()
        for container in left:
            assert [line for line in named if f"container {container[:12]} is left behind" in line]
    elif endpoint != "DELETE /containers/{id}":  # else the engine said it is gone
        assert left == [], engine.asked()


def unversioned(asked: str) -> str:
    """A request the corpus does not know ("? POST /v1.41/build/cancel?id=..."), as the client
    sets name it: without the API version and the query."""
    if not asked.startswith("? "):
        return asked
    method, _, path = asked[2:].partition(" ")
    path = re.sub(r"^/v[0-9]+\.[0-9]+(?=/)", "", path.split("?", 1)[0])
    return f"? {method} {path}"


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_each_command_asks_what_its_cases_break(command: Command, tmp_path: Path) -> None:
    with HostileEngine(missing=command.missing) as engine:
        ran = run(command, tmp_path, engine)
    ended_cleanly(ran)
    assert ran.result.returncode == command.baseline, ran.result.stderr[-3000:]
    assert {unversioned(asked) for asked in engine.asked()} - command.client == command.reaches
    assert engine.left_behind() == []


def test_the_corpus_covers_every_request_and_answer() -> None:
    asked = {endpoint for c in COMMANDS for endpoint in c.reaches}
    assert {(e, a) for _, e, a in CASES} >= {
        (e, a) for e in asked for a in HOSTILE_NAMES if e not in STREAMED or a != "stalled-body"
    } - {("POST /containers/{id}/wait", "stalled"), ("POST /containers/{id}/wait", "stalled-body")}
    assert len(CASES) == len(set(CASES)) > 250


def test_every_engine_call_maps_the_engines_failures() -> None:
    """Each method of the Engine protocol is wrapped by the one mapping of failures, so a
    method added later cannot raise docker-py's errors past it."""
    protocol = [name for name, _ in inspect.getmembers(Engine, inspect.isfunction)]
    assert protocol
    for name in protocol:
        if not name.startswith("_"):
            assert hasattr(getattr(DockerEngine, name), "__wrapped__"), name


@pytest.mark.parametrize("value", ["soon", "-1", "0", "nan", "inf", "1e9", "2 s", "\x1b[31m5"])
def test_a_bad_engine_timeout_is_one_line(value: str, tmp_path: Path) -> None:
    with HostileEngine() as engine:
        env = {**os.environ, "DOCKER_HOST": engine.docker_host, TIMEOUT_ENV: value,
               "ENVBUILD_DATA_DIR": str(tmp_path / "data")}  # fmt: skip
        result = subprocess.run(
            [sys.executable, "-m", "envbuild", "smoke", IMAGE],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip
    assert result.returncode == EXIT_BAD_INPUT, result.stderr
    assert result.stderr.splitlines() == [
        line for line in result.stderr.splitlines() if line.startswith("envbuild: error:")
    ]
    assert TIMEOUT_ENV in result.stderr
    assert "\x1b" not in result.stderr
    assert engine.asked() == []  # refused before the engine was asked anything


def test_an_engine_without_buildkit_is_named_in_one_line_with_the_builder_to_use(
    tmp_path: Path,
) -> None:
    """The docker client's BuildKit session is refused (the engine answers 404, as an engine or
    proxy that serves only the classic API does): one line, exit 2, naming the engine."""
    command = Command(
        "build-buildkit", ("build", "--no-smoke", *ONE_ENTRY, "--builder", "buildkit"), 0,
        frozenset(),
    )  # fmt: skip
    with HostileEngine() as engine:
        ran = run(command, tmp_path, engine)
    ended_cleanly(ran)
    assert "POST /session" in [f"{s.method} {s.path.split('?')[0]}" for s in engine.seen]
    assert ran.result.returncode == EXIT_BAD_INPUT, ran.result.stderr[-3000:]
    named = [line for line in ran.lines if engine.docker_host in line]
    assert len(named) >= 1, ran.lines[-20:]
    assert all("serves no BuildKit session" in line for line in named), named
    assert all(line.endswith("use --builder classic") for line in named), named
    assert engine.left_behind() == []


def test_a_copy_into_a_container_is_tried_again_after_a_5xx_but_not_forever(tmp_path: Path) -> None:
    """The payload's copy into the smoke container (Podman answered it 500 once, in a run where
    it succeeded before and after): a 5xx is tried again, twice at most; a 4xx is not."""
    smoke = next(command for command in COMMANDS if command.name == "smoke")
    (archive,) = PAYLOAD

    def copies(folder: str, **hostile: Any) -> tuple[int, Run]:
        (tmp_path / folder).mkdir()
        with HostileEngine(endpoint=archive, **hostile) as engine:
            ran = run(smoke, tmp_path / folder, engine)
        ended_cleanly(ran)
        return engine.asked().count(archive), ran

    well, as_well = copies("well")
    assert well >= 1
    once, ran = copies("once", answer="500", times=1)
    assert once == well + 1
    assert ran.result.returncode == as_well.result.returncode
    errors = [line for line in ran.lines if line.startswith("envbuild: error:")]
    assert errors == [line for line in as_well.lines if line.startswith("envbuild: error:")]
    assert copies("always", answer="502-html")[0] == 3
    assert copies("refused", answer="404", times=1)[0] == 1
