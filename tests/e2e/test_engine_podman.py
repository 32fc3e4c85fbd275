"""envbuild against Podman 4.3's Docker-compatible API (`podman system service`).

The Podman engine is started by the test session itself (tests/support/podman_engine.py), with
storage of its own. The torch CPU entry is built there as users build it, with the CA bundle, an
index password and the wheelhouse; Podman builds with Buildah behind the API, so the classic path
(the build's inputs served from this host on the gateway of Podman's bridge) is the one used.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest

from tests.support.docker_support import envbuild, needles_in_layers
from tests.support.podman_engine import PodmanEngine
from tests.support.podman_engine import podman as podman  # the session fixture

pytestmark = [pytest.mark.e2e, pytest.mark.extended]

SECRET = "s3cret-envbuild-podman"
INDEX = f"https://envbuild-test:{SECRET}@pypi.org/simple"
REPOSITORY = "envbuild-test/podman"


@dataclass(frozen=True, kw_only=True)
class PodmanBuild:
    result: subprocess.CompletedProcess[str]
    report: dict[str, object]
    containers_before: list[str]
    networks_before: set[str]


@pytest.fixture(scope="module")
def podman_client(podman: PodmanEngine) -> Iterator[docker.DockerClient]:
    with closing(podman.client()) as client:
        yield client


@pytest.fixture(scope="module")
def podman_build(
    podman: PodmanEngine,
    podman_client: docker.DockerClient,
    base_image: str,
    wheelhouse: Path,
    ca_bundle: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> PodmanBuild:
    """The torch CPU entry built and smoke-tested on Podman, once for this module."""
    report = tmp_path_factory.mktemp("podman-build") / "r.json"
    containers = [c.id for c in podman_client.containers.list(all=True)]
    networks = {n.name for n in podman_client.networks.list()}
    result = envbuild(
        "build", "--framework", "torch", "--framework-version", "2.13.0", "--cuda", "cpu",
        "--python", "3.11", "--base-image", base_image, "--wheelhouse", str(wheelhouse),
        "--ca-bundle", str(ca_bundle), "--index-url", INDEX, "--repository", REPOSITORY,
        "--report", str(report),
        env=podman.env, timeout=1800,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return PodmanBuild(
        result=result,
        report=json.loads(report.read_text()),
        containers_before=containers,
        networks_before=networks,
    )


def _built(build: PodmanBuild) -> dict[str, object]:
    results = build.report["results"]
    assert isinstance(results, list)
    assert len(results) == 1
    entry = results[0]
    assert isinstance(entry, dict)
    return entry


def test_doctor_answers_against_podman(podman: PodmanEngine) -> None:
    result = envbuild("doctor", env=podman.env, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Podman at unix://" in result.stdout, result.stdout
    assert ", version 4.3" in result.stdout, result.stdout
    assert "builder buildkit: not here: Podman's Docker API has no BuildKit" in result.stdout
    assert str(podman.folder / "root") in result.stdout  # its storage, as Podman's info names it


def test_torch_cpu_builds_and_passes_its_smoke_test(
    podman_build: PodmanBuild, podman_client: docker.DockerClient
) -> None:
    built = _built(podman_build)
    assert built["status"] == "built"
    assert built["passed"] is True, built.get("error")
    smoke = built["smoke"]
    assert isinstance(smoke, dict)
    assert smoke["ok"] is True
    assert smoke["versions"]["framework"] == "2.13.0+cpu"
    image = built["image"]
    assert isinstance(image, dict)
    assert str(image["id"]).startswith("sha256:")
    found = podman_client.images.get(str(image["id"]))
    labels = found.labels
    assert labels["org.envbuild.entry-id"] == "torch2.13.0-cpu-py3.11-bookworm"
    assert labels["org.envbuild.framework-version"] == "2.13.0"


def test_the_index_password_is_in_no_layer_history_label_or_output(
    podman_build: PodmanBuild, podman_client: docker.DockerClient
) -> None:
    image = str(_built(podman_build)["image"]["id"])  # type: ignore[index]
    assert needles_in_layers(podman_client, image, [SECRET.encode()]) == []
    # Podman's archive lays its layers out unlike Docker's: prove the search read them.
    assert needles_in_layers(podman_client, image, [b"__version__ = '2.13.0+cpu'"])
    history = podman_client.api.history(image)
    assert history, "Podman answered no history"
    assert not [h for h in history if SECRET in json.dumps(h)]
    attrs = podman_client.api.inspect_image(image)
    assert SECRET not in json.dumps(attrs)  # labels, Env, Cmd, ContainerConfig
    assert SECRET not in podman_build.result.stdout
    assert SECRET not in podman_build.result.stderr
    log_path = Path(str(_built(podman_build)["image"]["log"]))  # type: ignore[index]
    assert log_path.is_file()
    assert SECRET not in log_path.read_text(errors="replace")


def test_nothing_is_left_behind_on_podman(
    podman: PodmanEngine, podman_build: PodmanBuild, podman_client: docker.DockerClient
) -> None:
    containers = [c.id for c in podman_client.containers.list(all=True)]
    assert containers == podman_build.containers_before
    networks = {n.name for n in podman_client.networks.list()}
    assert networks == podman_build.networks_before
    # Buildah's working containers of the build are not in the Docker API's list.
    external = podman.podman("ps", "--all", "--external", "--format", "{{.ID}} {{.Names}}")
    assert external.returncode == 0, external.stderr
    assert external.stdout.strip() == ""
