"""Ctrl-C and SIGTERM mid-build, mid-smoke and mid-push: a clean exit, nothing half-done left
behind, and a rerun that recovers. Each test interrupts a real run of the CLI on the real engine."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import docker
import pytest

from tests.support.docker_support import TORCH_CPU_IMAGE, derive, envbuild
from tests.support.fault_support import (
    finish,
    isolated_build,
    rows,
    run_containers,
    running_smoke,
    scratch,
    start,
    wait_for,
)
from tests.support.registry_server import RegistryServer

pytestmark = [pytest.mark.e2e, pytest.mark.extended]

INTERRUPTED_REPOSITORY = "envbuild-test/interrupted-{framework}"
INTERRUPTED_IMAGE = "envbuild-test/interrupted-torch:2.13.0-cpu-py3.11-bookworm"


def test_sigterm_mid_build_leaves_nothing_and_the_rerun_builds(
    docker_client: docker.DockerClient,
    base_image: str,
    wheelhouse: Path,
    ca_bundle: Path,
    tmp_path: Path,
) -> None:
    args, env, log = isolated_build(
        base_image, wheelhouse, ca_bundle, tmp_path, INTERRUPTED_REPOSITORY
    )
    # --no-cache: BuildKit keeps secrets out of its cache key, so an earlier build of the same
    # lock would let this one finish from the cache before the interrupt lands.
    process = start([*args, "--no-smoke", "--no-cache"], env)
    # Interrupt inside the step that installs torch: the longest of the build.
    wait_for(
        lambda: log.exists() and "install_env.py" in log.read_text(),
        "the install step",
        600,
        process,
    )
    time.sleep(2)
    code, stderr = finish(process, signal.SIGTERM)
    assert code == 143, stderr[-2000:]
    assert stderr.rstrip().splitlines()[-1] == "envbuild: error: terminated"
    assert "Traceback" not in stderr
    assert scratch(process.pid) == []
    wait_for(
        lambda: run_containers(docker_client, process.pid, log) == [],
        "the engine to drop the build",
        60,
    )
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(INTERRUPTED_IMAGE)
    assert rows(tmp_path / "data", "built") == 0

    rerun = envbuild(*args, "--no-smoke", env=env)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert rows(tmp_path / "data", "built") == 2  # its framework image's, then its own
    docker_client.images.remove(INTERRUPTED_IMAGE, force=True)


# The payload's own process (the child of `timeout`, PID 1) waits before it starts, so that the
# interrupt surely lands mid-smoke however slowly the engine lists containers (the smoke itself
# lasts ~4 s); the all-reduce's workers do not wait.
SLOW_START = "import os, time; os.getppid() == 1 and time.sleep(10)\n"
SLOW_IMAGE = "envbuild-test-derived/slow-smoke:1"


def test_sigint_mid_smoke_removes_the_container_and_records_nothing(
    docker_client: docker.DockerClient, torch_cpu_build: Any, tmp_path: Path
) -> None:
    site = "/opt/venv/lib/python3.11/site-packages/"
    image = derive(
        docker_client, tmp_path, SLOW_IMAGE,
        f"FROM {TORCH_CPU_IMAGE}\nCOPY slow_start.pth {site}\n", {"slow_start.pth": SLOW_START},
    )  # fmt: skip
    env = {"ENVBUILD_DATA_DIR": str(tmp_path / "data")}
    process = start(["smoke", image], env)
    wait_for(lambda: running_smoke(docker_client, process.pid), "the smoke container", 120)
    code, stderr = finish(process, signal.SIGINT)
    assert code == 130, stderr[-2000:]
    assert stderr.rstrip().splitlines()[-1] == "envbuild: error: interrupted"
    assert run_containers(docker_client, process.pid) == []
    assert rows(tmp_path / "data", "smoke") == 0

    rerun = envbuild("smoke", image, env=env)
    assert rerun.returncode == 0, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    assert rows(tmp_path / "data", "smoke") == 1


# Alone: the engine pushes a few layers at a time for all its clients (max-concurrent-uploads),
# so another lane's push to a registry that stalls can hold this push's first upload back.
@pytest.mark.alone
def test_sigterm_mid_push_records_nothing_and_the_rerun_publishes(
    docker_client: docker.DockerClient, torch_cpu_build: Any, tmp_path: Path
) -> None:
    image_id = str(docker_client.images.get(TORCH_CPU_IMAGE).id)
    with RegistryServer(tmp_path / "registry") as server:
        uploads = tmp_path / "registry" / "storage"
        process = start(["publish", TORCH_CPU_IMAGE, "--registry", f"{server.host}/x"], {})

        def uploading() -> bool:
            return any(p.name == "_uploads" for p in uploads.rglob("_uploads"))

        wait_for(uploading, "a layer upload", 240, process)
        code, stderr = finish(process, signal.SIGTERM)
        assert code == 143, stderr[-2000:]
        image = docker_client.images.get(TORCH_CPU_IMAGE)
        assert not [t for t in image.tags if t.startswith(server.host)]  # no push tag left
        assert envbuild_publications(image_id, server.host) == 0

        rerun = envbuild("publish", TORCH_CPU_IMAGE, "--registry", f"{server.host}/x")
        assert rerun.returncode == 0, rerun.stderr[-2000:]
        assert envbuild_publications(image_id, server.host) > 0


def envbuild_publications(image_id: str, registry: str) -> int:
    """Publications of the image to `registry` (the other lane publishes the same image elsewhere)."""
    from envbuild.core.store import ResultStore

    return len([p for p in ResultStore.default().publications(image_id) if registry in p.reference])
