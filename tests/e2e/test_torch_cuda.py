"""A real CUDA torch image from PyPI alone: nvidia-* wheels, no system CUDA, smoke-tested on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest
import requests

from tests.support.docker_support import TEST_INDEX, TEST_REPOSITORY, derive, envbuild, output_of
from tests.support.registry_server import RegistryServer

# Alone: beside the other engines' builds its gloo all-reduce under a 300 s deadline timed out
# (CI, 2026-12-02); the CUDA download and its smoke test want the machine to themselves.
pytestmark = [pytest.mark.e2e, pytest.mark.extended, pytest.mark.alone]

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

    # Proven without a GPU: every library resolves, versions read from the libraries themselves,
    # and the architectures compiled into libtorch_cuda.so are the knowledge base's list.
    static = smoke["cuda_static"]
    assert static["closure"]["missing"] == []
    assert static["closure"]["libraries"] > 50
    versions = {key: [v["version"] for v in found] for key, found in static["versions"]["libraries"].items()}  # fmt: skip
    assert versions["cudnn"] == ["9.1.0"]  # the label says 9.1.0.70
    assert versions["nccl"] == ["2.20.5"]
    assert versions["cuda_runtime"] == ["12.1"]
    assert static["archs"]["library"].endswith("/torch/lib/libtorch_cuda.so")
    assert static["archs"]["sass"] == [50, 60, 70, 75, 80, 86, 90]
    assert static["archs"]["ptx"] == []
    checks = {c["name"]: c for c in smoke["checks"]}
    for name in ("cuda_libraries", "cudnn_library", "nccl_library", "cuda_runtime_library", "gpu_archs"):  # fmt: skip
        assert checks[name]["passed"] is True, checks[name]

    listing = output_of(
        docker_client,
        IMAGE,
        [
            "sh",
            "-c",
            "test -e /usr/local/cuda && echo SYSTEM-CUDA; test -e /root/.cache/pip && echo PIP-CACHE; "
            "find / -xdev -name 'libcudart.so*' -print",
        ],
        network_mode="none",
        user="0:0",  # the whole file system, root's folders included; the image runs as envbuild
    ).decode()
    cudart = [line for line in listing.splitlines() if line]
    assert cudart, "the nvidia-cuda-runtime wheel's libcudart is missing"
    assert all(path.startswith("/opt/venv/") for path in cudart), listing


def test_a_fleet_without_kernels_in_the_image_is_refused_by_build_and_publish(
    docker_client: docker.DockerClient, base_image: str, ca_bundle: Path, tmp_path: Path
) -> None:
    if not docker_client.images.list(name=IMAGE):
        pytest.fail(f"{IMAGE} is built by the test before this one")
    build = [
        "build", "--framework", "torch", "--framework-version", "2.4.1", "--cuda", "12.1",
        "--python", "3.11", "--base-image", base_image, "--ca-bundle", str(ca_bundle),
        "--index-url", TEST_INDEX, "--repository", TEST_REPOSITORY,
    ]  # fmt: skip
    refused = envbuild(*build, "--gpu", "sm_120")  # found and vetted before: judged, not rebuilt
    assert refused.returncode == 1
    reason = "no kernels for sm_120 in libtorch_cuda.so (has sm_50, sm_60, sm_70, sm_75, sm_80, sm_86, sm_90; no PTX)"  # fmt: skip
    assert f"passed, but not for --gpu: {reason}" in refused.stderr
    assert envbuild(*build, "--gpu", "H100", "--gpu", "RTX 4090").returncode == 0
    with RegistryServer(tmp_path / "registry") as server:
        published = envbuild(
            "publish", IMAGE, "--registry", f"{server.host}/fleet", "--gpu", "sm_120"
        )
        assert published.returncode == 1
        assert f"refusing to publish {IMAGE} for --gpu: {reason}" in published.stderr
        catalog = requests.get(f"{server.url}/v2/_catalog", timeout=10).json()
        assert catalog["repositories"] == []  # nothing pushed


def test_a_cuda_image_without_its_cudnn_library_fails_by_name(
    docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    if not docker_client.images.list(name=IMAGE):
        pytest.fail(f"{IMAGE} is built by the test before this one")
    cudnn = "/opt/venv/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn.so.9"
    tag = derive(
        docker_client, tmp_path, "envbuild-test-derived/no-cudnn:1",
        f"FROM {IMAGE}\nUSER 0:0\nRUN rm {cudnn}\nUSER 1000:1000\n", {},
    )  # fmt: skip
    result = envbuild("smoke", tag, "--json")
    assert result.returncode == 1
    failed = {
        c["name"]: c["detail"] for c in json.loads(result.stdout)["checks"] if not c["passed"]
    }
    assert "needs libcudnn.so.9, not in the image" in failed["cuda_libraries"]
    assert failed["cudnn_library"] == "no cuDNN library in the image (labels say 9.1.0.70)"
    assert "libcudnn.so.9" in result.stderr


def test_two_torch_releases_pinning_the_same_cuda_libraries_share_their_layers(
    docker_client: docker.DockerClient, base_image: str, ca_bundle: Path, tmp_path: Path
) -> None:
    """torch 2.4.0 and 2.4.1 with CUDA 12.1 pin the same nvidia-* wheels: their images have the
    same layers up to the CUDA libraries' (built apart, by the classic builder, whose cache does
    not hold the install steps: the same bytes, reproducibly), and differ from the framework's."""
    if not docker_client.images.list(name=IMAGE):
        pytest.fail(f"{IMAGE} is built by the test before this one")
    other = "envbuild-test/torch:2.4.0-cu121-py3.11-bookworm"
    result = envbuild(
        "build", "--framework", "torch", "--framework-version", "2.4.0", "--cuda", "12.1",
        "--python", "3.11", "--base-image", base_image, "--ca-bundle", str(ca_bundle),
        "--index-url", TEST_INDEX, "--repository", TEST_REPOSITORY, "--no-smoke",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    try:
        newer, older = (docker_client.images.get(ref) for ref in (IMAGE, other))
        steps = [
            (step["CreatedBy"], step["Size"])
            for step in reversed(newer.history())
            if step["Size"] or "COPY" in step["CreatedBy"]
        ]
        layers = [newer.attrs["RootFS"]["Layers"], older.attrs["RootFS"]["Layers"]]
        # base, OS packages, COPY install_env.py cuda.lock, the CUDA libraries, COPY
        # framework.lock, the framework, COPY envbuild.lock, the team's (here: none) packages
        assert len(layers[0]) == len(layers[1]) == 8, steps
        assert layers[0][:4] == layers[1][:4], steps
        assert layers[0][4] != layers[1][4]  # framework.lock: torch 2.4.1, then 2.4.0
        (cuda,) = [size for command, size in steps if "--only 'nvidia-*'" in command]
        assert cuda > 2_000_000_000, steps  # most of the image's bytes
    finally:
        docker_client.images.remove(other, force=True)
