"""An image built FROM an envbuild image inherits its labels, content hash included: it is never
taken for envbuild's own image, re-tagged in its name, or published as it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
import requests

from tests.support.docker_support import TEST_LABEL, envbuild, repositories
from tests.support.registry_server import RegistryServer

pytestmark = pytest.mark.e2e

DERIVED = "envbuild-test-derived/trainer:1"
# The entry's tag in a repository of this module's own: these tests move it, and other tests
# (in the other lane) use the session's torch image by its tag meanwhile.
REPOSITORY = "envbuild-test/derived-{framework}"
ENTRY_IMAGE = "envbuild-test/derived-torch:2.13.0-cpu-py3.11-bookworm"
SELECT = ["--framework", "torch", "--framework-version", "2.13.0", "--cuda", "cpu", "--python", "3.11",
          "--repository", REPOSITORY]  # fmt: skip


@pytest.fixture(scope="module")
def entry_args(torch_cpu_build: tuple[Any, dict[str, Any], list[str]]) -> list[str]:
    """The session's torch CPU build, into this module's repository (ending in `--report PATH`)."""
    _, _, args = torch_cpu_build
    args = list(args)
    args[args.index("--repository") + 1] = REPOSITORY
    return args


@pytest.fixture(scope="module")
def ours(
    docker_client: docker.DockerClient,
    torch_cpu_build: tuple[Any, dict[str, Any], list[str]],
    entry_args: list[str],
    tmp_path_factory: Any,
) -> Iterator[str]:
    """The id of the image envbuild built; the entry's tag points back at it after each test."""
    _, built, _ = torch_cpu_build
    report = tmp_path_factory.mktemp("derived-entry") / "r.json"
    tagged = envbuild(*entry_args[:-1], str(report), "--no-smoke")
    assert tagged.returncode == 0, tagged.stderr[-2000:]
    (found,) = json.loads(report.read_text())["results"]
    assert found["status"] == "found"  # the session's image, found by its content hash
    image_id = str(docker_client.images.get(ENTRY_IMAGE).id)
    assert image_id == built["results"][0]["image"]["id"]
    yield image_id
    docker_client.images.get(image_id).tag(ENTRY_IMAGE)


@pytest.fixture(scope="module")
def derived(docker_client: docker.DockerClient, ours: str, tmp_path_factory: Any) -> str:
    """A team's training image FROM envbuild's, as the issue's reproduction builds it."""
    context = tmp_path_factory.mktemp("derived")
    # As a team writes it: root for its own steps, then back to the image's user.
    (context / "Dockerfile").write_text(
        f"FROM {ENTRY_IMAGE}\nUSER 0:0\nRUN echo mine > /mine\nUSER 1000:1000\n"
    )
    image, _ = docker_client.images.build(
        path=str(context), tag=DERIVED, labels={TEST_LABEL: "1"}, rm=True, network_mode="none"
    )
    assert (
        image.labels["org.envbuild.content-hash"]
        == (docker_client.images.get(ours).labels["org.envbuild.content-hash"])
    ), "the derived image must inherit the content hash for this test to mean anything"
    return str(image.id)


def tag_id(docker_client: docker.DockerClient, ref: str) -> str:
    return str(docker_client.images.get(ref).id)


def test_a_derived_image_is_not_adopted(
    docker_client: docker.DockerClient,
    entry_args: list[str],
    ours: str,
    derived: str,
    tmp_path: Path,
) -> None:
    report = tmp_path / "again.json"
    result = envbuild(*entry_args[:-1], str(report), "--no-smoke")
    assert result.returncode == 0, result.stderr[-2000:]
    (again,) = json.loads(report.read_text())["results"]
    assert again["status"] == "found"
    assert again["image"]["id"] == ours
    assert tag_id(docker_client, ENTRY_IMAGE) == ours
    assert tag_id(docker_client, DERIVED) == derived


def test_a_moved_tag_is_restored_by_build(
    docker_client: docker.DockerClient,
    entry_args: list[str],
    ours: str,
    derived: str,
    tmp_path: Path,
) -> None:
    docker_client.images.get(derived).tag(ENTRY_IMAGE)
    assert tag_id(docker_client, ENTRY_IMAGE) == derived
    report = tmp_path / "restore.json"
    result = envbuild(*entry_args[:-1], str(report), "--no-smoke")
    assert result.returncode == 0, result.stderr[-2000:]
    assert tag_id(docker_client, ENTRY_IMAGE) == ours
    assert derived[:19] in result.stderr  # the user is told which image the tag had moved to
    (again,) = json.loads(report.read_text())["results"]
    assert again["image"]["id"] == ours


def test_a_vetted_derived_image_is_never_published_in_the_entrys_name(
    docker_client: docker.DockerClient,
    ours: str,
    derived: str,
    shared_registry: RegistryServer,
    tmp_path: Path,
) -> None:
    # The team's image trains: its own smoke test passes and is recorded for its id.
    smoked = envbuild("smoke", DERIVED)
    assert smoked.returncode == 0, smoked.stdout[-2000:] + smoked.stderr[-2000:]

    server = shared_registry
    docker_client.images.get(derived).tag(ENTRY_IMAGE)  # `docker tag`, as a user might
    try:
        by_entry = envbuild("publish", *SELECT, "--registry", f"{server.host}/derived")
        by_ref = envbuild("publish", ENTRY_IMAGE, "--registry", f"{server.host}/derived")
        by_name = envbuild("publish", DERIVED, "--registry", f"{server.host}/derived")
    finally:
        docker_client.images.get(ours).tag(ENTRY_IMAGE)
    for result in (by_entry, by_ref):
        assert result.returncode == 1, result.stderr
        (line,) = result.stderr.splitlines()
        assert "refusing to publish" in line
        assert derived[:19] in line  # the image found
        assert ours[:19] in line  # the image envbuild built and expected
    assert by_name.returncode == 1, by_name.stderr
    assert "inherit" in by_name.stderr or "derives" in by_name.stderr
    assert repositories(server, "derived") == []

    # With the tag back on envbuild's image, publishing the entry pushes that image.
    report = tmp_path / "p.json"
    result = envbuild(
        "publish", *SELECT, "--registry", f"{server.host}/derived", "--report", str(report)
    )
    assert result.returncode == 0, result.stderr[-2000:]
    published = json.loads(report.read_text())["published"]
    immutable = next(p for p in published if p["kind"] == "immutable")
    assert immutable["image_id"] == ours
    manifest = requests.get(
        f"{server.url}/v2/derived/derived-torch/manifests/{immutable['digest']}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
        timeout=10,
    ).json()
    assert manifest["config"]["digest"] == ours
