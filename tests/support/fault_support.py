"""Helpers of the fault-injection tests: run the CLI in the background, interrupt it or kill
its engine, and look for what it left behind (containers, temporary folders, records)."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import docker
import pytest
from docker.models.containers import Container

from envbuild.core.interrupt import RUN_LABEL
from tests.support.docker_support import torch_cpu_args

# The classic builder's line for the container of a RUN step, in envbuild's build log.
BUILD_STEP = re.compile(r"^ ---> Running in ([0-9a-f]{12,64})$", re.MULTILINE)
DOCKERD_LOG = Path("/var/log/envbuild-dockerd.log")
DOCKERD_PID = Path("/var/run/docker.pid")


def start(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """The CLI in the background, with Ctrl-C (SIGINT) at its default as a terminal's would have
    it: an xdist worker ignores SIGINT, and an ignored signal stays ignored across exec."""
    return subprocess.Popen(
        [sys.executable, "-m", "envbuild", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        preexec_fn=_default_sigint,
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_for(
    condition: Callable[[], bool],
    what: str,
    timeout: float = 600,
    process: subprocess.Popen[str] | None = None,
) -> None:
    """Until `condition` holds; fail after `timeout` s, or as soon as `process` (the CLI run the
    condition waits on) has ended, with what it printed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if process is not None and process.poll() is not None:
            _, stderr = process.communicate()
            pytest.fail(
                f"the CLI ended (exit {process.returncode}) before {what}: {stderr[-3000:]}"
            )
        time.sleep(0.5)
    if process is not None:
        process.kill()
        _, stderr = process.communicate()
        pytest.fail(f"timed out waiting for {what}; the CLI printed: {stderr[-3000:]}")
    pytest.fail(f"timed out waiting for {what}")


def finish(process: subprocess.Popen[str], sig: int) -> tuple[int, str]:
    process.send_signal(sig)
    try:
        _, stderr = process.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail("the CLI did not exit within 60 s of the signal")
    return process.returncode, stderr


def finish_quietly(process: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    """Wait for the CLI to end on its own; (exit code, stderr)."""
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        pytest.fail(f"the CLI did not end within {timeout:.0f} s")
    return process.returncode, stderr


def run_containers(
    docker_client: docker.DockerClient, pid: int, log: Path | None = None
) -> list[str]:
    """The containers the envbuild process `pid` made that still exist: those labelled with its
    run id (every container envbuild creates is) and the build steps its build log names
    (`Running in ID`; the engine removes a cancelled build's own). Only this run's: another run
    on the same engine (the other test lane) may have containers of its own."""
    found = [
        f"{container.short_id} {container.name} {container.status}"
        for container in docker_client.containers.list(all=True, filters={"label": RUN_LABEL})
        if made_by(container, pid)
    ]
    steps = BUILD_STEP.findall(log.read_text(errors="replace")) if log and log.is_file() else []
    for step in dict.fromkeys(steps):
        try:
            container = docker_client.containers.get(step)
        except docker.errors.NotFound:
            continue
        found.append(f"{container.short_id} {container.name} {container.status} (build step)")
    return found


def running_smoke(docker_client: docker.DockerClient, pid: int) -> bool:
    """Whether the envbuild process `pid` has a smoke container running."""
    found = docker_client.containers.list(filters={"label": "org.envbuild.role=smoke"})
    return any(made_by(container, pid) for container in found)


def made_by(container: Container, pid: int) -> bool:
    """Whether the envbuild process `pid` made the container (its run id starts with the pid)."""
    return str(container.labels.get(RUN_LABEL, "")).startswith(f"{pid}-")


def epoch(text: object) -> float:
    """Epoch seconds of the engine's `Created` time stamp."""
    text = str(text)
    return datetime.fromisoformat(text.rstrip("Z").split(".")[0]).replace(tzinfo=UTC).timestamp()


def isolated_build(
    base_image: str, wheelhouse: Path, ca_bundle: Path, tmp_path: Path, repository: str
) -> tuple[list[str], dict[str, str], Path]:
    """The torch CPU build into `repository`, with its own cache and data dirs: (args, env, log)."""
    args = torch_cpu_args(base_image, wheelhouse, ca_bundle, tmp_path / "r.json")
    args[args.index("--repository") + 1] = repository
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "ENVBUILD_DATA_DIR": str(tmp_path / "data")}
    log = tmp_path / "cache" / "envbuild" / "logs" / "torch2.13.0-cpu-py3.11-bookworm.log"
    return args, env, log


def scratch(pid: int) -> list[Path]:
    return list(Path(tempfile.gettempdir()).glob(f"envbuild-{pid}-*"))


def rows(data_dir: Path, table: str) -> int:
    path = data_dir / "results.sqlite3"
    if not path.exists():
        return 0
    with sqlite3.connect(path) as db:
        return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


def kill_engine() -> None:
    """SIGKILL the Docker engine and the containerd it manages, as a crash of the host's engine
    would; the containers' shims live on, as they do after a real crash."""
    if not DOCKERD_PID.is_file():
        pytest.fail(f"no {DOCKERD_PID}: these tests kill and restart dockerd, run them as root")
    pid = int(DOCKERD_PID.read_text().strip())
    doomed = [pid, *_children(pid, "containerd")]
    for victim in doomed:
        os.kill(victim, 9)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not any(_alive(victim) for victim in doomed):
            return
        time.sleep(0.2)
    pytest.fail(f"dockerd (pid {pid}) or its containerd did not die")


def _children(parent: int, name: str) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        command = text[text.find("(") + 1 : text.rfind(")")]
        fields = text.rsplit(")", 1)[1].split()
        if command == name and int(fields[1]) == parent:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    # A killed dockerd that this test process started stays a zombie until reaped.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def restart_engine(client: docker.DockerClient) -> None:
    """Start dockerd again the way scripts/host-setup.sh does, and wait until it answers."""
    for _ in range(3):  # a first start may time out on the dead containerd's leftovers
        DOCKERD_PID.unlink(missing_ok=True)
        with DOCKERD_LOG.open("ab") as log:
            daemon = subprocess.Popen(  # the engine outlives this call on purpose
                ["dockerd"], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and daemon.poll() is None:
            try:
                client.ping()
                return
            except Exception:
                time.sleep(1)
        daemon.kill()
        daemon.wait()
    pytest.fail(f"dockerd did not come back after 3 starts; see {DOCKERD_LOG}")
