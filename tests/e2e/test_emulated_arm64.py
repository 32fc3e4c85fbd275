"""linux/arm64 images on this x86_64 host, under qemu (the `emulated` tier, after the others).

One base per platform from `base bootstrap --platform linux/amd64,linux/arm64`, loaded with the
platform its config records; a JAX CPU image from PyPI's aarch64 wheels built on the arm64 one
and smoke-tested under emulation with stretched deadlines; a base of the wrong platform refused
before anything is built. Needs Debian's qemu-user-static registered with binfmt_misc
(scripts/engines/emulation-setup.sh).
"""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest

from tests.support.docker_support import (
    TEST_LABEL,
    TEST_REPOSITORY,
    envbuild,
    output_of,
    shared_root,
)
from tests.support.registry_server import RegistryServer

pytestmark = [pytest.mark.e2e, pytest.mark.emulated, pytest.mark.live]

BASE = "envbuild-test/base:emulated"
ARM64_BASE = f"{BASE}-arm64"


@pytest.fixture(scope="module")
def bases(docker_client: docker.DockerClient) -> tuple[str, str]:
    """Both platforms' bases with Python, made once per module (about 5 minutes, most of it
    debootstrap's second stage under emulation)."""
    result = envbuild(
        "base", "bootstrap", "--suite", "bookworm", "--with-python", "--tag", BASE,
        "--platform", "linux/amd64,linux/arm64", timeout=1800,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{BASE} " in result.stdout
    assert f"{ARM64_BASE} " in result.stdout
    return BASE, ARM64_BASE


def test_one_base_per_platform_each_recording_its_own(
    bases: tuple[str, str], docker_client: docker.DockerClient
) -> None:
    amd64, arm64 = (docker_client.images.get(ref).attrs for ref in bases)
    assert (amd64["Os"], amd64["Architecture"]) == ("linux", "amd64")
    assert (arm64["Os"], arm64["Architecture"]) == ("linux", "arm64")
    machine = output_of(
        docker_client, bases[1], ["python3", "-c", "import os; print(os.uname().machine)"]
    )
    assert machine.decode().strip() == "aarch64"
    again = envbuild("base", "bootstrap", "--with-python", "--tag", BASE, "--platform", "arm64")
    assert again.returncode == 0, again.stderr
    assert f"{ARM64_BASE} already present" in again.stdout


def test_an_arm64_jax_image_builds_and_passes_its_smoke_under_emulation(
    bases: tuple[str, str],
    ca_bundle: Path,
    docker_client: docker.DockerClient,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    folder = shared_root(tmp_path_factory) / "emulated-jax"
    folder.mkdir(exist_ok=True)
    report = folder / "r.json"
    result = envbuild(
        "build", "--framework", "jax", "--cuda", "cpu", "--platform", "linux/arm64",
        "--base-image", BASE, "--ca-bundle", str(ca_bundle), "--repository", TEST_REPOSITORY,
        "--report", str(report), timeout=1800,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    (entry,) = json.loads(report.read_text())["results"]
    assert entry["entry"]["platform"] == "linux/arm64"
    assert entry["entry"]["id"].endswith("-arm64")
    smoke = entry["smoke"]
    assert smoke["passed"] is True, smoke["checks"]
    assert (smoke["platform"], smoke["emulated"], smoke["slowdown"]) == ("linux/arm64", True, 10)
    assert {d["name"] for d in smoke["devices"]} == {"aarch64"}
    assert smoke["train"]["loss_last"] < smoke["train"]["loss_first"]
    assert (smoke["allreduce"]["world_size"], smoke["allreduce"]["correct"]) == (2, True)

    image = docker_client.images.get(entry["image"]["id"])
    assert image.attrs["Architecture"] == "arm64"
    assert image.labels["org.envbuild.platform"] == "linux/arm64"
    # The install ran the aarch64 build of uv; the image keeps neither it nor any x86_64 program.
    machine = output_of(
        docker_client, entry["entry"]["image"],
        ["python3", "-c", "import os, jaxlib; print(os.uname().machine, jaxlib.__file__)"],
    ).decode()  # fmt: skip
    assert machine.startswith("aarch64 ")
    log = Path(entry["image"]["log"]).read_text()
    assert "Exec format error" not in log


def test_a_base_of_the_wrong_platform_is_refused_before_anything_is_built(
    bases: tuple[str, str], ca_bundle: Path, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    # The amd64 base under the arm64 tag: Docker's builders would label aarch64 binaries amd64.
    wrong = "envbuild-test/base:mislabelled"
    docker_client.images.get(bases[0]).tag(f"{wrong}-arm64")
    docker_client.images.get(bases[0]).tag(wrong)
    try:
        result = envbuild(
            "build", "--framework", "jax", "--cuda", "cpu", "--platform", "arm64",
            "--base-image", wrong, "--ca-bundle", str(ca_bundle),
            "--repository", TEST_REPOSITORY, "--report", str(tmp_path / "r.json"),
        )  # fmt: skip
    finally:
        docker_client.images.remove(f"{wrong}-arm64")
        docker_client.images.remove(wrong)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"base image {wrong}-arm64 is linux/amd64, but jax" in line
    assert f"envbuild base bootstrap --platform linux/arm64 --tag {wrong}" in line
    assert not (tmp_path / "r.json").exists()
    assert not docker_client.images.list(filters={"label": TEST_LABEL, "dangling": True})


def test_both_platforms_publish_under_one_tag_and_each_pulls_its_own(
    bases: tuple[str, str],
    ca_bundle: Path,
    docker_client: docker.DockerClient,
    shared_registry: RegistryServer,
    tmp_path: Path,
) -> None:
    # The arm64 image of the test before is found by its content hash; the amd64 one is built.
    registry = f"{shared_registry.host}/emulated"
    report = tmp_path / "r.json"
    result = envbuild(
        "build", "--framework", "jax", "--cuda", "cpu", "--platform", "linux/amd64,linux/arm64",
        "--base-image", BASE, "--ca-bundle", str(ca_bundle), "--repository", TEST_REPOSITORY,
        "--report", str(report), "--push", registry, timeout=1800,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    tested = {
        r["entry"]["platform"]: r["image"]["id"] for r in json.loads(report.read_text())["results"]
    }
    assert set(tested) == {"linux/amd64", "linux/arm64"}
    (index_line,) = [line for line in result.stdout.splitlines() if line.split()[:1] == ["index"]]
    assert index_line.endswith("(linux/amd64, linux/arm64)")
    assert f"moving    {registry}/jax:latest " in result.stdout
    shared = index_line.split()[1].split(":")[-1].rsplit("-", 1)[0]  # the entry's own tag
    pulled_ref = f"{registry}/jax:{shared}"
    assert f"moving    {pulled_ref} " in result.stdout

    for platform, image_id in tested.items():
        pulled = docker_client.images.pull(pulled_ref, platform=platform)
        try:
            assert pulled.id == image_id, platform  # the very image that passed its smoke test
            assert pulled.attrs["Architecture"] == platform.split("/")[1]
        finally:
            docker_client.images.remove(pulled_ref, force=True)

    verified = envbuild("verify", pulled_ref, "--json")
    assert verified.returncode == 0, verified.stderr
    document = json.loads(verified.stdout)
    assert document["passed"] is True
    assert {p["platform"]: p["image_id"] for p in document["platforms"]} == tested
    assert all(p["passed"] and p["smoke"]["passed"] for p in document["platforms"])
