"""Vetted means signed, end to end: a real image, built and smoke-tested, published with --sign
to a real registry; `envbuild verify --key` and an independent verifier (trixie's skopeo) accept
it; a re-tagged or tampered image is refused by both; no key, password or credential anywhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import docker
import pytest

from envbuild.publish import cosign
from envbuild.publish.keys import KEY_ENV, PASSWORD_ENV, load_public_key
from envbuild.publish.signing import Subject, verify_image
from envbuild.registry import OCI_MANIFEST, RegistryClient
from tests.support.docker_support import TEST_REPOSITORY, envbuild, needles_in_layers
from tests.support.registry_server import RegistryServer, push_image
from tests.support.sigstore_verifier import skopeo_accepts

pytestmark = pytest.mark.e2e

PASSWORD = "e2e signing password 5d1c"
SELECT = ["--framework", "torch", "--framework-version", "2.13.0", "--cuda", "cpu", "--python", "3.11",
          "--repository", TEST_REPOSITORY]  # fmt: skip


@pytest.fixture(scope="module")
def key_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("signing-key")
    made = envbuild("keys", "generate", "--out", str(folder / "envbuild.key"),
                    env={PASSWORD_ENV: PASSWORD})  # fmt: skip
    assert made.returncode == 0, made.stderr
    return folder / "envbuild.key", folder / "envbuild.pub"


def signing_env(private: Path) -> dict[str, str]:
    return {KEY_ENV: str(private), PASSWORD_ENV: PASSWORD}


def secrets(private: Path) -> list[str]:
    body = [line for line in private.read_text().splitlines() if not line.startswith("-----")]
    return [PASSWORD, *body]


def test_a_signed_vetted_image_verifies_with_envbuild_and_skopeo(
    docker_client: docker.DockerClient,
    torch_cpu_build: Any,
    shared_registry: RegistryServer,
    key_pair: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    private, public = key_pair
    server = shared_registry
    report = tmp_path / "published.json"
    published = envbuild(
        "-v", "publish", *SELECT, "--registry", f"{server.host}/signed", "--sign",
        "--report", str(report), env=signing_env(private),
    )  # fmt: skip
    assert published.returncode == 0, published.stderr
    kinds = {p["kind"]: p for p in json.loads(report.read_text())["published"]}
    assert {"immutable", "evidence", "signature", "attestations", "moving"} <= set(kinds)
    digest = kinds["immutable"]["digest"]
    repository = "signed/torch"

    verified = envbuild("verify", f"{server.host}/{repository}:latest", "--key", str(public))
    assert verified.returncode == 0, verified.stderr
    assert f"signs {digest}" in verified.stdout
    for predicate_type in (cosign.TEST_RESULT, cosign.SLSA_PROVENANCE, cosign.CYCLONEDX):
        assert f"{predicate_type} attestation verifies" in verified.stdout
    assert "the signed smoke verdict is PASSED" in verified.stdout

    as_json = envbuild(
        "verify", f"{server.host}/{repository}@{digest}", "--key", str(public), "--json"
    )
    assert as_json.returncode == 0, as_json.stderr
    assert len(json.loads(as_json.stdout)["signed"]) == 5

    accepted = skopeo_accepts(tmp_path / "skopeo", server.host, repository, digest, public)
    assert accepted.returncode == 0, accepted.stderr

    # The provenance names what the build recorded: the base image by id and the lock.
    with RegistryClient.for_host(server.host) as client:
        facts = verify_image(client, Subject(host=server.host, repository=repository, digest=digest),
                             load_public_key(public))  # fmt: skip
    provenance = facts.predicates[cosign.SLSA_PROVENANCE]
    names = {d["name"] for d in provenance["buildDefinition"]["resolvedDependencies"]}
    assert {"base image", "envbuild.lock", "Dockerfile", "installer"} <= names
    assert provenance["buildDefinition"]["externalParameters"]["framework"] == "torch"
    assert facts.predicates[cosign.TEST_RESULT]["result"] == "PASSED"
    assert "loss_fell" in facts.predicates[cosign.TEST_RESULT]["passedTests"]
    payload = facts.predicates[cosign.TEST_RESULT]["configuration"][0]
    assert payload["name"] == "envbuild smoke payload"
    assert len(payload["digest"]["sha256"]) == 64

    # -v: debug logs (urllib3's, docker-py's) are searched too, and the report.
    everything = published.stdout + published.stderr + verified.stdout + verified.stderr
    everything += report.read_text()
    for secret in secrets(private):
        assert secret not in everything
    image = docker_client.images.get(kinds["immutable"]["image_id"])
    assert needles_in_layers(docker_client, image.id, [s.encode() for s in secrets(private)]) == []


def test_a_retagged_or_unsigned_image_is_refused_by_both(
    shared_registry: RegistryServer,
    torch_cpu_build: Any,
    key_pair: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    private, public = key_pair
    server = shared_registry
    published = envbuild("publish", *SELECT, "--registry", f"{server.host}/retag", "--sign",
                         env=signing_env(private))  # fmt: skip
    assert published.returncode == 0, published.stderr
    with RegistryClient.for_host(server.host) as client:
        signed = client.manifest_digest("retag/torch", "latest")
        # Someone with push rights moves the tag to another image.
        other, _ = push_image(client, "retag/torch", "latest")
        manifest, _, _ = client.get_manifest("retag/torch", cosign.signature_tag(signed))
        # ...and copies the signature over to it: it signs the other digest.
        client.push_manifest("retag/torch", cosign.signature_tag(other), manifest, OCI_MANIFEST)
    refused = envbuild("verify", f"{server.host}/retag/torch:latest", "--key", str(public))
    assert refused.returncode == 1
    assert "Traceback" not in refused.stderr
    assert skopeo_accepts(tmp_path, server.host, "retag/torch", other, public).returncode != 0

    unsigned = envbuild("publish", *SELECT, "--registry", f"{server.host}/unsigned")
    assert unsigned.returncode == 0, unsigned.stderr
    not_signed = envbuild("verify", f"{server.host}/unsigned/torch:latest", "--key", str(public))
    assert not_signed.returncode == 1
    assert "is not signed" in not_signed.stderr
    with RegistryClient.for_host(server.host) as client:
        digest = client.manifest_digest("unsigned/torch", "latest")
    assert (
        skopeo_accepts(tmp_path / "u", server.host, "unsigned/torch", digest, public).returncode
        != 0
    )


def test_build_push_sign_signs_what_the_registry_held_unsigned(
    shared_registry: RegistryServer,
    torch_cpu_build: Any,
    key_pair: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    """build --push --sign of an entry the registry holds vetted but unsigned: the image is found
    by its content hash (no rebuild), pushed again and signed; a second run does nothing."""
    private, public = key_pair
    server = shared_registry
    _, _, args = torch_cpu_build
    first = envbuild("publish", *SELECT, "--registry", f"{server.host}/later")
    assert first.returncode == 0, first.stderr
    build_args = [*_without_report(args), "--push", f"{server.host}/later", "--sign"]
    signed = envbuild(*build_args, env=signing_env(private))
    assert signed.returncode == 0, signed.stderr
    verified = envbuild("verify", f"{server.host}/later/torch:latest", "--key", str(public))
    assert verified.returncode == 0, verified.stderr
    again = envbuild(*build_args, env=signing_env(private))
    assert again.returncode == 0, again.stderr
    assert "published already" in again.stderr
    for secret in secrets(private):
        assert secret not in signed.stdout + signed.stderr + again.stdout + again.stderr


def _without_report(args: list[str]) -> list[str]:
    """The torch CPU build's arguments without its --report FILE (that file is the session's)."""
    kept: list[str] = []
    skip = False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg == "--report":
            skip = True
            continue
        kept.append(arg)
    return kept
