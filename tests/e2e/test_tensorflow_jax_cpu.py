"""TensorFlow and JAX CPU images from PyPI (through the CA bundle) that prove they train and all-reduce."""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest

from tests.docker_support import TEST_INDEX, TEST_REPOSITORY, envbuild

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("framework", "version", "backend"),
    [("jax", "0.10", "cpu"), ("tensorflow", "2.20", "cpu")],
)
def test_cpu_image_trains_and_all_reduces_over_two_devices(
    docker_client: docker.DockerClient,
    base_image: str,
    ca_bundle: Path,
    tmp_path: Path,
    framework: str,
    version: str,
    backend: str,
) -> None:
    report = tmp_path / "r.json"
    result = envbuild(
        "build", "--framework", framework, "--framework-version", version, "--cuda", "cpu",
        "--python", "3.11", "--base-image", base_image, "--ca-bundle", str(ca_bundle),
        "--index-url", TEST_INDEX, "--repository", TEST_REPOSITORY, "--report", str(report),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (entry,) = json.loads(report.read_text())["results"]
    assert entry["entry"]["framework"] == framework
    assert entry["entry"]["framework_version"].startswith(version + ".")
    smoke = entry["smoke"]
    assert smoke["passed"] is True, smoke["checks"]
    assert smoke["payload"] == framework
    assert smoke["train"]["loss_last"] < smoke["train"]["loss_first"]
    allreduce = smoke["allreduce"]
    assert (allreduce["world_size"], allreduce["correct"]) == (2, True)
    assert allreduce["got"] == allreduce["expected"] == 3.0
    assert smoke["versions"]["framework"].startswith(entry["entry"]["framework_version"])
