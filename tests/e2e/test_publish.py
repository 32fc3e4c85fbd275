"""Publishing to real registry servers: only vetted images, verified digests, evidence beside them."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import docker
import pytest
import requests

from envbuild.core.store import ResultStore
from tests.support.docker_support import (
    TEST_LABEL,
    TEST_REPOSITORY,
    TORCH_CPU_IMAGE,
    envbuild,
    output_of,
    repositories,
)
from tests.support.registry_server import (
    Fault,
    FaultyFront,
    RegistryServer,
    blob_commit,
    manifest_put,
)

pytestmark = pytest.mark.e2e

SELECT = ["--framework", "torch", "--framework-version", "2.13.0", "--cuda", "cpu", "--python", "3.11",
          "--repository", TEST_REPOSITORY]  # fmt: skip


def image_id(docker_client: docker.DockerClient) -> str:
    return str(docker_client.images.get(TORCH_CPU_IMAGE).id)


def catalog(server: RegistryServer, auth: tuple[str, str] | None = None) -> list[str]:
    response = requests.get(f"{server.url}/v2/_catalog", auth=auth, timeout=10)
    response.raise_for_status()
    return list(response.json().get("repositories") or [])


def test_publish_verifies_the_digest_and_the_evidence(
    docker_client: docker.DockerClient,
    torch_cpu_build: Any,
    shared_registry: RegistryServer,
    tmp_path: Path,
) -> None:
    server = shared_registry
    report = tmp_path / "p.json"
    result = envbuild(
        "publish", *SELECT, "--registry", f"{server.host}/verified", "--report", str(report)
    )
    assert result.returncode == 0, result.stderr
    published = json.loads(report.read_text())["published"]
    immutable = next(p for p in published if p["kind"] == "immutable")
    assert immutable["image_id"] == image_id(docker_client)
    assert immutable["reference"].startswith(
        f"{server.host}/verified/torch:2.13.0-cpu-py3.11-bookworm-"
    )
    moving = {
        p["reference"].rsplit(":", 1)[1]: p["digest"] for p in published if p["kind"] == "moving"
    }
    assert moving == {
        "torch2.13-cpu-py3.11": immutable["digest"],
        "latest": immutable["digest"],
    }

    # An independent client sees the digest the report claims.
    inspected = subprocess.run(
        ["skopeo", "inspect", "--tls-verify=false", f"docker://{immutable['reference']}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert json.loads(inspected.stdout)["Digest"] == immutable["digest"]

    # Pulled back by digest, the image runs.
    by_digest = f"{server.host}/verified/torch@{immutable['digest']}"
    pulled = docker_client.images.pull(by_digest)
    try:
        assert pulled.id == immutable["image_id"]
        out = output_of(
            docker_client,
            by_digest,
            ["python3", "-c", "import torch; print(torch.__version__)"],
            network_mode="none",
        )
        assert out.decode().strip() == "2.13.0+cpu"
    finally:
        docker_client.images.remove(by_digest, force=False)

    verified = envbuild("verify", f"{server.host}/verified/torch:latest", "--json")
    assert verified.returncode == 0, verified.stderr
    evidence = json.loads(verified.stdout)
    assert evidence["digest"] == immutable["digest"]
    assert evidence["smoke"]["image_id"] == immutable["image_id"]
    assert evidence["smoke"]["passed"] is True
    assert any(line.startswith("torch==2.13.0") for line in evidence["packages"])
    # The SBOM: the lock's Python packages (torch, numpy and their dependencies) and dpkg's.
    sbom = evidence["sbom"]
    assert sbom["format"] == "CycloneDX 1.6"
    assert sbom["pypi"] >= 5
    assert sbom["deb"] >= 50
    shown = envbuild("verify", f"{server.host}/verified/torch:latest")
    assert shown.returncode == 0, shown.stderr
    assert "SBOM (CycloneDX 1.6)" in shown.stdout


def test_an_unvetted_image_is_refused_and_nothing_reaches_the_registry(
    docker_client: docker.DockerClient, base_image: str, tmp_path: Path
) -> None:
    tag = "envbuild-test-derived/never-smoked:1"
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text(f"FROM {base_image}\nLABEL purpose=unvetted\n")
    docker_client.images.build(
        path=str(tmp_path / "ctx"), tag=tag, labels={TEST_LABEL: "1"}, rm=True
    )
    with RegistryServer(tmp_path / "registry") as server:
        result = envbuild("publish", tag, "--registry", f"{server.host}/team")
        assert result.returncode == 1
        assert "has never been smoke-tested" in result.stderr
        assert f"envbuild smoke {tag}" in result.stderr
        assert catalog(server) == []


def test_htpasswd_registry_needs_credentials_and_gets_them_from_docker_config(
    docker_client: docker.DockerClient, torch_cpu_build: Any, tmp_path: Path
) -> None:
    with RegistryServer(tmp_path / "registry", users={"ci": "pa55-word"}) as server:
        denied = envbuild("publish", *SELECT, "--registry", f"{server.host}/secure",
                          env={"DOCKER_CONFIG": str(tmp_path / "empty")})  # fmt: skip
        assert denied.returncode == 1
        assert "Traceback" not in denied.stderr
        assert not [
            p
            for p in ResultStore.default().publications(image_id(docker_client))
            if server.host in p.reference
        ]

        config = tmp_path / "docker-config"
        config.mkdir()
        token = base64.b64encode(b"ci:pa55-word").decode()
        (config / "config.json").write_text(json.dumps({"auths": {server.host: {"auth": token}}}))
        allowed = envbuild(
            "publish",
            *SELECT,
            "--registry",
            f"{server.host}/secure",
            env={"DOCKER_CONFIG": str(config)},
        )
        assert allowed.returncode == 0, allowed.stderr
        assert "pa55-word" not in allowed.stdout + allowed.stderr
        assert "secure/torch" in catalog(server, auth=("ci", "pa55-word"))


@pytest.mark.extended  # a fault injected: the extended tier
def test_a_registry_that_dies_mid_push_leaves_no_published_record(
    docker_client: docker.DockerClient, torch_cpu_build: Any, tmp_path: Path
) -> None:
    server = RegistryServer(tmp_path / "registry")
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "envbuild", "publish", *SELECT, "--registry", f"{server.host}/dying"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        uploads = tmp_path / "registry"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(uploads.rglob("_uploads")):
            time.sleep(0.2)  # wait until layers are being uploaded
        assert any(uploads.rglob("_uploads")), "the push never started"
        server.stop()
        _, err = process.communicate(timeout=300)
    finally:
        server.close()
    assert process.returncode == 1, err
    assert "Traceback" not in err
    records = ResultStore.default().publications(image_id(docker_client))
    assert not [r for r in records if server.host in r.reference]


@pytest.mark.extended  # a fault injected: the extended tier
def test_two_publishers_of_the_same_image_at_once_keep_both_records_and_evidence(
    docker_client: docker.DockerClient, torch_cpu_build: Any, tmp_path: Path
) -> None:
    """Two publishers of one image to a registry that answers 500 to the first blob commit and
    to the first manifest put (as a registry can while another push commits the same content):
    the engine retries a blob upload itself, envbuild retries the push the engine gave up on."""
    image = image_id(docker_client)
    before = len(ResultStore.default().publications(image))
    with (
        RegistryServer(tmp_path / "registry") as upstream,
        FaultyFront(upstream, Fault(matches=blob_commit), Fault(matches=manifest_put)) as server,
    ):
        reports = [tmp_path / "a.json", tmp_path / "b.json"]
        command = [sys.executable, "-m", "envbuild", "publish", *SELECT, "--registry", f"{server.host}/both"]  # fmt: skip
        processes = [
            subprocess.Popen(
                [*command, "--report", str(report)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for report in reports
        ]
        for process in processes:
            _, err = process.communicate(timeout=600)
            assert process.returncode == 0, err
        assert len(server.failed) == 2, server.failed  # both faults were met, and retried
        evidence = {
            p["digest"]
            for report in reports
            for p in json.loads(report.read_text())["published"]
            if p["kind"] == "evidence"
        }
        immutable = next(
            p for p in json.loads(reports[0].read_text())["published"] if p["kind"] == "immutable"
        )
        fallback = "sha256-" + immutable["digest"].split(":", 1)[1]
        index = requests.get(
            f"{server.url}/v2/both/torch/manifests/{fallback}",
            headers={"Accept": "application/vnd.oci.image.index.v1+json"},
            timeout=10,
        ).json()
        assert evidence <= {d["digest"] for d in index["manifests"]}  # neither write was lost
        verified = envbuild("verify", f"{server.host}/both/torch:latest")
        assert verified.returncode == 0, verified.stderr
    records = ResultStore.default().publications(image)
    assert len([r for r in records[before:] if "/both/" in r.reference]) >= 2 * 3


@pytest.mark.extended  # a fault injected: the extended tier
def test_a_registry_that_keeps_answering_500_to_the_push_ends_publish_in_one_line(
    docker_client: docker.DockerClient,
    torch_cpu_build: Any,
    shared_registry: RegistryServer,
) -> None:
    """The retries of a push are bounded: a registry that fails every manifest put ends the
    publish with one line naming the push and the tries, and nothing is recorded."""

    image = image_id(docker_client)
    with FaultyFront(shared_registry, Fault(matches=manifest_put, times=100)) as server:
        result = envbuild("publish", *SELECT, "--registry", f"{server.host}/failing")
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "received unexpected HTTP status: 500" in result.stderr
    assert "(4 tries)" in result.stderr
    assert len(server.failed) == 4, server.failed
    records = ResultStore.default().publications(image)
    assert not [r for r in records if server.host in r.reference]


def test_build_push_of_an_unchanged_entry_builds_nothing_the_second_time(
    docker_client: docker.DockerClient,
    torch_cpu_build: tuple[Any, dict[str, Any], list[str]],
    shared_registry: RegistryServer,
    tmp_path: Path,
) -> None:
    """The nightly run where nothing upstream moved: the registry holds the entry's immutable
    tag with its evidence, so the entry is reported as published already, not built or tested."""
    _, _, args = torch_cpu_build
    server = shared_registry
    registry = f"{server.host}/nightly"
    first = envbuild(*args[:-1], str(tmp_path / "first.json"), "--push", registry)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "immutable" in first.stdout
    pushed = repositories(server, "nightly")
    # The image, and beside it the framework image it stands on (its layers pushed once).
    assert pushed == ["nightly/framework", "nightly/torch"]
    assert f"framework {registry}/framework:torch-2.13.0-cpu-" in first.stdout

    again = envbuild(*args[:-1], str(tmp_path / "again.json"), "--push", registry)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "published already" in again.stderr
    assert "publishing" not in again.stderr  # nothing pushed a second time
    (result,) = json.loads((tmp_path / "again.json").read_text())["results"]
    assert result["status"] == "published"
    assert result["published"].startswith(f"{registry}/torch:2.13.0-cpu-py3.11-bookworm-")
    assert result["image"] is None
    assert result["smoke"] is None
    assert repositories(server, "nightly") == pushed
