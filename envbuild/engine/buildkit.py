"""Build with the engine's BuildKit through the docker client: the one path that carries secrets
to a RUN step on any Docker engine, local or remote.

docker-py drives only the classic builder; BuildKit's secrets and mounts travel through the
client's session, which the `docker` client implements. So a BuildKit build runs that client:
`docker buildx build --load` where buildx is installed, else `DOCKER_BUILDKIT=1 docker build` on a
client older than 23 (Debian's docker.io 20.10 is one; a newer client without buildx refuses to
build with BuildKit). The client reads DOCKER_HOST, DOCKER_TLS_VERIFY and DOCKER_CERT_PATH as
docker-py does, so it reaches the same engine: a local socket, a remote engine over TCP with TLS,
`ssh://`, rootless Docker.

Secrets are files handed to `--secret id=…,src=…`: the client reads them and sends them through
its session; the engine mounts them for the RUN steps that ask (tmpfs), never in a layer, the
history or the build cache. Nothing secret is on the client's command line either: build
arguments (Docker's predefined proxy arguments) travel by name, their values in its environment.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from envbuild.core.errors import BadInput, BuildFailed, EngineFailed
from envbuild.core.interrupt import scratch_prefix
from envbuild.engine.build_errors import build_error
from envbuild.net.bounded import printable

CLIENT_ENV = "ENVBUILD_DOCKER_CLIENT"  # the docker client to build with, when not found by itself
# Where the docker client is looked for, after CLIENT_ENV and PATH: Debian's docker.io puts its
# 20.10 client here, which builds with BuildKit without buildx (a newer one earlier on PATH may not).
_KNOWN_CLIENTS = ("/usr/bin/docker",)
log = logging.getLogger(__name__)
_PROBE_SECONDS = 20.0
# The first client version that builds with BuildKit only through buildx.
_NEEDS_BUILDX = 23
_VERSION = re.compile(r"Docker version (\d+)\.(\d+)")
MAX_LINE_BYTES = 8192
# A step's line in BuildKit's plain progress: `#12 3.456 what the step printed`.
_STEP_PREFIX = re.compile(r"^#\d+ (?:\d+\.\d+ )?")
# What the client says when it cannot reach the engine at all.
_UNREACHABLE = ("Cannot connect to the Docker daemon", "error during connect")
# What the client says when the engine went away mid-build (killed, restarted, its host gone).
_LOST = (
    "code = Unavailable",
    "transport is closing",
    "error reading from server: EOF",
    "server did not provide an image ID",  # the 20.10 client, when the engine died mid-build
)
# What the client says when the engine does not serve BuildKit's session (gRPC over HTTP/2).
_NO_SESSION = ("failed to dial gRPC", "unable to upgrade to h2c")
# Seconds the client has to cancel the build after an interrupt, before it is killed.
_CANCEL_SECONDS = 10.0


@dataclass(frozen=True, kw_only=True)
class Client:
    """A docker client that builds with BuildKit, and how it is asked to."""

    path: str
    version: str
    buildx: bool  # `docker buildx build --load`; else `DOCKER_BUILDKIT=1 docker build`

    def describe(self) -> str:
        """`docker 20.10.24 at /usr/bin/docker (DOCKER_BUILDKIT=1 docker build)`, for doctor."""
        how = "docker buildx build" if self.buildx else "DOCKER_BUILDKIT=1 docker build"
        return f"docker {self.version} at {self.path} ({how})"


def find_client(environ: Mapping[str, str] | None = None) -> tuple[Client | None, str]:
    """The first docker client that builds with BuildKit: ENVBUILD_DOCKER_CLIENT, `docker` on
    PATH, Debian's /usr/bin/docker; (None, why each was passed over) when there is none."""
    env = os.environ if environ is None else environ
    named = env.get(CLIENT_ENV)
    candidates = [named] if named else []
    on_path = shutil.which("docker", path=env.get("PATH"))
    candidates += [c for c in (on_path, *_KNOWN_CLIENTS) if c]
    passed: list[str] = []
    for candidate in dict.fromkeys(candidates):
        client, why = _probe(candidate)
        if client is not None:
            return client, ""
        passed.append(f"{candidate}: {why}")
        if named and candidate == named:
            break  # the one the user named is the one they want
    if not passed:
        return None, "no docker client on PATH or at /usr/bin/docker"
    return None, "; ".join(passed)


def _probe(path: str) -> tuple[Client | None, str]:
    """Whether the client at `path` builds with BuildKit: (client, "") or (None, why not)."""
    try:
        said = _output([path, "--version"])
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"cannot run it ({printable(str(exc), 120)})"
    found = _VERSION.search(said)
    if found is None:
        return None, f"not a docker client ({printable(said.strip(), 80)!r})"
    version = said[found.start() + len("Docker version ") :].split(",")[0].strip()
    try:
        _output([path, "buildx", "version"])
        return Client(path=path, version=version, buildx=True), ""
    except (OSError, subprocess.SubprocessError):
        pass
    if int(found.group(1)) < _NEEDS_BUILDX:
        return Client(path=path, version=version, buildx=False), ""
    return (
        None,
        f"docker {version} builds with BuildKit only through buildx, which is not installed",
    )


def _output(command: list[str]) -> str:
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=_PROBE_SECONDS, check=True,
        env={**os.environ, "DOCKER_CLI_HINTS": "false"},
    )  # fmt: skip
    return result.stdout


def probe(client: Client, engine: str) -> str:
    """Whether BuildKit builds on the engine: "" when it does, else one line saying why not.
    An empty build exported to a scratch folder (no image is made): the client, its session
    with the engine and the engine's BuildKit, for real, in about a second. An engine too busy
    to finish it in time (seen under parallel builds on a loaded CI machine) is not one without
    BuildKit: that says so at once. It is logged, and the build goes on with BuildKit."""
    with tempfile.TemporaryDirectory(prefix=scratch_prefix("buildkit-probe")) as scratch:
        context = Path(scratch) / "context"
        context.mkdir()
        (context / "Dockerfile").write_text("FROM scratch\n", encoding="utf-8")
        command = [client.path, *(("buildx", "build") if client.buildx else ("build",))]
        command += ["--progress=plain", f"--output=type=local,dest={scratch}/out", str(context)]
        environment = {**os.environ, "DOCKER_BUILDKIT": "1", "DOCKER_CLI_HINTS": "false"}
        try:
            last_lines = _run(command, environment, lambda line: None, timeout=_PROBE_SECONDS * 3)
        except subprocess.TimeoutExpired:
            log.warning(
                "%s did not finish an empty BuildKit build in %g s (busy?); building with "
                "BuildKit all the same", engine, _PROBE_SECONDS * 3,
            )  # fmt: skip
            return ""
    if last_lines is None:
        return ""
    failure = _failure(last_lines, engine)
    return failure.message


def build(
    client: Client,
    context_dir: Path,
    *,
    engine: str,
    tag: str | None,
    labels: Mapping[str, str],
    build_args: Mapping[str, str],
    secrets: Mapping[str, Path],
    on_line: Callable[[str], None],
    network: bool,
    target: str | None = None,
    no_cache: bool = False,
    platform: str | None = None,
) -> str:
    """Build `context_dir` with BuildKit, streaming every line of its plain progress to `on_line`;
    return the image id (BuildFailed when a step fails, EngineFailed when the engine is not
    there; BadInput when it serves no BuildKit). `engine` names it in those lines.
    `network=False`: the RUN steps have no network at all."""
    for name in build_args:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            msg = f"build argument {printable(name, 60)!r} is not a variable name"
            raise BadInput(msg)
    with tempfile.TemporaryDirectory(prefix=scratch_prefix("buildkit")) as scratch:
        iidfile = Path(scratch) / "iid"
        command = [client.path, *(("buildx", "build", "--load") if client.buildx else ("build",))]
        command += ["--progress=plain", "--iidfile", str(iidfile), "--pull=false"]
        command += [f"--label={key}={value}" for key, value in labels.items()]
        # By name: the values (a proxy's credentials) stay off the command line.
        command += [f"--build-arg={name}" for name in build_args]
        command += [f"--secret=id={name},src={path}" for name, path in secrets.items()]
        command += [f"--tag={tag}"] if tag else []
        command += [f"--target={target}"] if target else []
        command += ["--no-cache"] if no_cache else []
        command += [f"--platform={platform}"] if platform else []
        command += [] if network else ["--network=none"]
        environment = {**os.environ, **build_args, "DOCKER_BUILDKIT": "1"}
        environment["DOCKER_CLI_HINTS"] = "false"
        last_lines = _run([*command, str(context_dir)], environment, on_line)
        if last_lines is not None:
            raise _failure(last_lines, engine)
        image_id = iidfile.read_text(encoding="utf-8").strip() if iidfile.is_file() else ""
    if not image_id.startswith("sha256:"):
        raise BuildFailed(build_error("BuildKit reported no image id", []))
    return image_id


def _run(
    command: list[str],
    environment: dict[str, str],
    on_line: Callable[[str], None],
    timeout: float | None = None,
) -> list[str] | None:
    """Run the client, its output passed to `on_line` line by line; None when it succeeded,
    else its last lines. An interrupt cancels the build (SIGINT, as Ctrl-C would), then kills;
    so does `timeout` (seconds; subprocess.TimeoutExpired), also for a client that says nothing
    (a watchdog stops it; the read then ends)."""
    last: list[str] = []
    process = subprocess.Popen(
        command, env=environment, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    expired = threading.Event()
    watchdog = None
    if timeout is not None:

        def expire() -> None:
            expired.set()
            _stop(process)

        watchdog = threading.Timer(timeout, expire)
        watchdog.daemon = True
        watchdog.start()
    try:
        stream = process.stdout
        assert stream is not None
        for raw in iter(lambda: stream.readline(MAX_LINE_BYTES), b""):
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            on_line(line)
            if line.strip():
                last = [*last[-39:], line]
        code = process.wait()
    finally:
        if watchdog is not None:
            watchdog.cancel()
        if process.poll() is None:
            _stop(process)
        if process.stdout is not None:
            process.stdout.close()
    if expired.is_set():
        raise subprocess.TimeoutExpired(command, timeout or 0)
    return None if code == 0 else last


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Cancel an interrupted build: the client ends the build session on SIGINT."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGINT)
    try:
        process.wait(timeout=_CANCEL_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _failure(last_lines: list[str], engine: str) -> BuildFailed | EngineFailed | BadInput:
    """The one line for a failed BuildKit build, from the client's last lines."""
    plain = [_STEP_PREFIX.sub("", line) for line in last_lines]
    unreachable = [line for line in plain if line.strip().startswith(_UNREACHABLE)]
    if unreachable:
        return EngineFailed(
            f"the docker client cannot reach {engine} to build: {printable(unreachable[-1], 200)};"
            " check DOCKER_HOST (and DOCKER_TLS_VERIFY, DOCKER_CERT_PATH) and `docker info`"
        )
    lost = [line for line in plain if any(mark in line for mark in _LOST)]
    if lost:
        return EngineFailed(
            f"lost {engine} during the BuildKit build ({printable(lost[-1], 160)}); check that "
            "dockerd runs (`docker info`), restart it, and run envbuild again"
        )
    no_session = [line for line in plain if any(mark in line for mark in _NO_SESSION)]
    if no_session:
        return BadInput(
            f"{engine} serves no BuildKit session ({printable(no_session[-1], 160)}); "
            "use --builder classic"
        )
    errors = [line for line in plain if line.lower().startswith(("error:", "error ", "failed to"))]
    message = errors[-1] if errors else "the docker client failed"
    failed = re.search(r"exit code: (\d+)", message)
    if failed:
        message = f"a RUN step exited {failed.group(1)}"
    steps = [line for line in plain if line != message and not line.startswith("------")]
    return BuildFailed(build_error(printable(message, 300), steps))
