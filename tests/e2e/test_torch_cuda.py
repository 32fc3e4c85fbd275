"""A real CUDA torch image from PyPI alone: nvidia-* wheels, no system CUDA, smoke-tested on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest

from tests.docker_support import TEST_INDEX, TEST_REPOSITORY, envbuild

pytestmark = pytest.mark.e2e

IMAGE = "envbuild-test/torch:2.4.1-cu121-py3.11-bookworm"


def test_torch_2_4_1_cu121_builds_from_pypi_and_passes(
    docker_client: docker.DockerClient, base_image: str, ca_bundle: Path, tmp_path: Path
) -> None:
    report = tmp_path / "r.json"
    result = envbuild(
        "build", "--framework", "torch", "--framework-version", "2.4.1", "--cuda", "12.1",
        "--python", "3.11", "--base-image", base_image, "--ca-bundle", str(ca_bundle),
        "--index-url", TEST_INDEX, "--repository", TEST_REPOSITORY, "--report", str(report),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    (entry,) = json.loads(report.read_text())["results"]
    smoke = entry["smoke"]
    assert smoke["passed"] is True
    assert smoke["versions"]["framework"] == "2.4.1+cu121"  # PyPI's plain wheel is the cu121 build
    assert smoke["versions"]["cuda"] == "12.1"
    assert smoke["versions"]["nccl"] == "2.20.5"
    assert smoke["train"]["device"] == "cpu"  # no GPU here: training and all-reduce run on CPU
    assert smoke["allreduce"]["world_size"] == 2
    assert smoke["allreduce"]["correct"] is True

    listing = docker_client.containers.run(
        IMAGE,
        [
            "sh",
            "-c",
            "test -e /usr/local/cuda && echo SYSTEM-CUDA; test -e /root/.cache/pip && echo PIP-CACHE; "
            "find / -xdev -name 'libcudart.so*' -print",
        ],
        remove=True,
        network_mode="none",
    ).decode()
    cudart = [line for line in listing.splitlines() if line]
    assert cudart, "the nvidia-cuda-runtime wheel's libcudart is missing"
    assert all(path.startswith("/opt/venv/") for path in cudart), listing
