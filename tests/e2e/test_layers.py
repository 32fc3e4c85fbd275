"""The framework's layers stay as they were when the team's packages change: the lock's framework
part (torch and what it pulls in) is the entry's framework image, which its image is built FROM,
so a lock that bumps one small package builds only the layers above it, and both images hold
the framework's layers under the same digests (what a registry and a node then store once)."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest

from tests.support.docker_support import TEST_INDEX, envbuild, output_of

pytestmark = [pytest.mark.e2e, pytest.mark.extended]

ENTRY = "torch2.13.0-cpu-py3.11-bookworm"
MATRIX = """\
defaults:
  python: "3.11"
  os: bookworm
  repository: "envbuild-test/layers-{name}-{{framework}}"
  packages: ["six=={six}"]
axes:
  framework: [torch]
  framework_version: ["2.13.0"]
  cuda: [cpu]
"""


def test_a_small_package_bumped_leaves_the_framework_layers_as_they_were(
    docker_client: docker.DockerClient,
    base_image: str,
    wheelhouse: Path,
    ca_bundle: Path,
    tmp_path: Path,
) -> None:
    given = ["--base-image", base_image, "--wheelhouse", str(wheelhouse),
             "--ca-bundle", str(ca_bundle), "--index-url", TEST_INDEX]  # fmt: skip
    images, logs = {}, {}
    for name, six in (("old", "1.16.0"), ("new", "1.17.0")):
        folder = tmp_path / name
        folder.mkdir()
        path = folder / "team.yaml"
        path.write_text(MATRIX.format(name=name, six=six))
        locked = envbuild("lock", "-m", str(path), *given)
        assert locked.returncode == 0, locked.stderr[-3000:]
        lock = (folder / "team.lock" / f"{ENTRY}.txt").read_text()
        assert f"six=={six}" in lock
        built = envbuild(
            "build", "-m", str(path), *given, "--builder", "buildkit", "--locked", "--no-smoke",
            env={"XDG_CACHE_HOME": str(folder / "cache")},
        )  # fmt: skip
        assert built.returncode == 0, built.stderr[-3000:]
        images[name] = docker_client.images.get(
            f"envbuild-test/layers-{name}-torch:2.13.0-cpu-py3.11-bookworm"
        )
        logs[name] = next((folder / "cache" / "envbuild" / "logs").rglob("*.log")).read_text()

    old, new = (images[n].attrs["RootFS"]["Layers"] for n in ("old", "new"))
    assert len(old) == len(new)
    differ = [i for i, (a, b) in enumerate(zip(old, new, strict=True)) if a != b]
    # What differs: the lock's COPY and the team's install above it; every layer below them, the
    # framework's install among them, is the same layer in both images.
    assert len(differ) == 2, (old, new)
    assert differ[1] == differ[0] + 1
    created = [h for h in reversed(images["new"].history()) if h["Size"]]  # oldest first
    assert len(created) >= differ[1] + 1
    team = created[differ[1]]
    assert "install_env.py" in team["CreatedBy"]
    assert "envbuild.lock" in team["CreatedBy"]
    assert "framework.lock" in created[differ[0] - 1]["CreatedBy"]  # the framework's RUN, shared
    # The team's packages (six, and numpy, which every image gets unless its matrix says no) are
    # a small part of the image; the framework's layer the largest.
    assert team["Size"] < 0.1 * images["new"].attrs["Size"]
    assert max(h["Size"] for h in created[: differ[0]]) > 10 * team["Size"]
    # The old lock's build made the framework image; the new one's stood on it, and ran only
    # the team's packages.
    assert "): built in" in logs["old"]
    assert "/opt/venv /framework.lock" in logs["old"]
    assert "): built before on this engine" in logs["new"]
    assert "/opt/venv /framework.lock" not in logs["new"]
    # Each image still installs exactly its lock.
    frozen = output_of(
        docker_client, images["new"].id,
        ["/opt/venv/bin/python", "-c", "import six; print(six.__version__)"],
    )  # fmt: skip
    assert frozen.decode().strip() == "1.17.0"


def test_the_same_lock_built_again_from_cold_gives_the_same_layers(
    docker_client: docker.DockerClient,
    base_image: str,
    wheelhouse: Path,
    ca_bundle: Path,
    tmp_path: Path,
) -> None:
    """Reproducible layers (issue 24, item 4): built twice with no cache, on the same base, the
    OS packages' layer, the framework's COPY and install and the lock's COPY are the same bytes
    (the same digests, what a registry stores and a node pulls once); only the team's install
    differs, by the time of the files its last step removes (whiteouts keep when they were made).
    The classic builder: Docker 20.10's BuildKit leaves the folders it makes for a RUN's mounts
    (/run/envbuild/*) and /etc with the time of the build in the layer (README, "Layers")."""
    builder = "classic"
    given = ["--base-image", base_image, "--wheelhouse", str(wheelhouse),
             "--ca-bundle", str(ca_bundle), "--index-url", TEST_INDEX]  # fmt: skip
    path = tmp_path / "team.yaml"
    path.write_text(MATRIX.format(name=f"repro-{builder}", six="1.16.0"))
    locked = envbuild("lock", "-m", str(path), *given)
    assert locked.returncode == 0, locked.stderr[-3000:]
    layers = []
    for _ in range(2):
        built = envbuild(
            "build", "-m", str(path), *given, "--builder", builder, "--locked", "--no-smoke",
            "--no-cache", env={"XDG_CACHE_HOME": str(tmp_path / "cache")},
        )  # fmt: skip
        assert built.returncode == 0, built.stderr[-3000:]
        image = docker_client.images.get(
            f"envbuild-test/layers-repro-{builder}-torch:2.13.0-cpu-py3.11-bookworm"
        )
        layers.append(image.attrs["RootFS"]["Layers"])
        docker_client.images.remove(image.id, force=True)
    first, second = layers
    assert len(first) == len(second) == 6, layers  # base, OS packages, COPY, framework, COPY, team
    assert first[:-1] == second[:-1], layers
