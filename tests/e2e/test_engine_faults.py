"""The Docker engine killed mid-build and mid-smoke: one line with the reason, no tag, no record,
no leftover container once the rerun has cleaned up, and a rerun that succeeds.

These tests SIGKILL the real dockerd and start it again, as scripts/host-setup.sh does."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest

from envbuild.core.models import BUILDKIT, CLASSIC
from tests.support.docker_support import TORCH_CPU_IMAGE, envbuild
from tests.support.fault_support import (
    isolated_build,
    kill_engine,
    restart_engine,
    rows,
    running_smoke,
    scratch,
    start,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.alone]

REPOSITORY = "envbuild-test/engine-killed-{framework}"
IMAGE = "envbuild-test/engine-killed-torch:2.13.0-cpu-py3.11-bookworm"


@pytest.fixture
def engine_back(docker_client: docker.DockerClient) -> Iterator[None]:
    """Whatever happens in the test, the engine runs again afterwards."""
    yield
    try:
        docker_client.ping()
    except Exception:
        restart_engine(docker_client)


def exited(docker_client: docker.DockerClient, label: str) -> list[str]:
    found = docker_client.containers.list(all=True, filters={"label": label})
    return [f"{c.short_id} {c.status}" for c in found if c.status != "running"]


def no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr[-3000:]


@pytest.mark.extended  # two cold builds: the extended tier; the main one kills it mid-smoke
@pytest.mark.parametrize("builder", [CLASSIC, BUILDKIT])
def test_engine_killed_mid_build(
    builder: str,
    docker_client: docker.DockerClient,
    engine_back: None,
    base_image: str,
    wheelhouse: Path,
    ca_bundle: Path,
    tmp_path: Path,
) -> None:
    args, env, log = isolated_build(base_image, wheelhouse, ca_bundle, tmp_path, REPOSITORY)
    args += ["--builder", builder]
    # From nothing, both times: a framework image of this key that another test left on the
    # engine would otherwise be taken (no install to kill), and BuildKit would find the install
    # step in its cache (it keeps secrets out of its cache key).
    cold = ["--no-cache"]
    process = start([*args, "--no-smoke", *cold], env)

    def installing() -> bool:
        """The install step has begun: the classic builder's container for it runs, or
        BuildKit's step has printed its first line."""
        text = log.read_text() if log.exists() else ""
        if builder == CLASSIC:
            return (
                "Running in" in text[text.find("install_env.py") :]
                if "install_env.py" in text
                else False
            )
        step = re.search(r"^#(\d+) \[[^\]]*\] RUN .*install_env\.py", text, re.MULTILINE)
        return (
            step is not None
            and re.search(rf"^#{step[1]} \d+\.\d+ ", text, re.MULTILINE) is not None
        )

    wait_for(installing, "the install step")
    time.sleep(3)  # "Running in" is printed between creating the container and starting it
    kill_engine()
    _, stderr = process.communicate(timeout=120)
    restart_engine(docker_client)

    assert process.returncode in (1, 3), stderr[-3000:]
    no_traceback(stderr)
    assert "lost the Docker engine" in stderr, stderr[-3000:]
    assert scratch(process.pid) == []
    assert rows(tmp_path / "data", "built") == 0
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(IMAGE)

    rerun = envbuild(*args, "--no-smoke", *cold, env=env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert rows(tmp_path / "data", "built") == 2  # its framework image's, then its own
    assert exited(docker_client, "org.envbuild.stage=install") == []  # the dead build's, removed
    docker_client.images.remove(IMAGE, force=True)


def test_engine_killed_mid_smoke(
    docker_client: docker.DockerClient, engine_back: None, torch_cpu_build: Any, tmp_path: Path
) -> None:
    env = {"ENVBUILD_DATA_DIR": str(tmp_path / "data")}
    process = start(["smoke", TORCH_CPU_IMAGE], env)
    wait_for(lambda: running_smoke(docker_client, process.pid), "the smoke container", 120)
    kill_engine()
    _, stderr = process.communicate(timeout=120)
    restart_engine(docker_client)

    assert process.returncode in (1, 3), stderr[-3000:]
    no_traceback(stderr)
    assert "lost the Docker engine" in stderr, stderr[-3000:]
    assert rows(tmp_path / "data", "smoke") == 0

    rerun = envbuild("smoke", TORCH_CPU_IMAGE, env=env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert rows(tmp_path / "data", "smoke") == 1
    assert exited(docker_client, "org.envbuild.role=smoke") == []
