"""Signatures and attestations on a real registry (Debian's docker-registry), no Docker engine:
what envbuild signs, envbuild and an independent verifier (trixie's skopeo) both accept, and
what anyone else put there (unsigned, re-signed, moved, tampered, flooded) both refuse."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from envbuild.publish import cosign
from envbuild.publish.keys import public_pem
from envbuild.publish.signing import (
    MAX_LAYERS,
    SignatureError,
    Subject,
    sign_image,
    verify_image,
)
from envbuild.registry import OCI_MANIFEST, RegistryClient, RegistryError, manifest_bytes
from tests.support.registry_server import RegistryServer, push_image
from tests.support.sigstore_verifier import skopeo_accepts

REPOSITORY = "envbuild-test/signed"
PASSED: dict[str, Any] = {
    "result": "PASSED",
    "configuration": [],
    "passedTests": ["payload", "loss_fell"],
    "warnedTests": [],
    "failedTests": [],
}


def predicates(result: dict[str, Any] = PASSED) -> dict[str, dict[str, Any]]:
    return {cosign.TEST_RESULT: result, cosign.SLSA_PROVENANCE: {}, cosign.CYCLONEDX: {}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    with RegistryServer(tmp_path_factory.mktemp("signing-registry")) as running:
        yield running


@pytest.fixture(scope="module")
def key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture
def client(server: RegistryServer) -> Iterator[RegistryClient]:
    with RegistryClient.for_host(server.host) as opened:
        yield opened


def write_public(folder: Path, key: ec.EllipticCurvePrivateKey, name: str = "k.pub") -> Path:
    path = folder / name
    path.write_bytes(public_pem(key.public_key()))
    return path


def image(client: RegistryClient, server: RegistryServer, tag: str) -> Subject:
    digest, _ = push_image(client, REPOSITORY, tag)
    return Subject(host=server.host, repository=REPOSITORY, digest=digest)


def test_what_envbuild_signs_both_verifiers_accept(
    client: RegistryClient, server: RegistryServer, key: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    subject = image(client, server, "signed")
    sign_image(client, subject, key, predicates())
    checked = verify_image(client, subject, key.public_key()).checked
    assert any("signs " + subject.digest in line for line in checked)
    assert checked[-1] == "the signed smoke verdict is PASSED"
    copied = skopeo_accepts(
        tmp_path, server.host, REPOSITORY, subject.digest, write_public(tmp_path, key)
    )
    assert copied.returncode == 0, copied.stderr


def test_an_unsigned_image_is_refused_by_both(
    client: RegistryClient, server: RegistryServer, key: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    subject = image(client, server, "unsigned")
    with pytest.raises(SignatureError, match="is not signed"):
        verify_image(client, subject, key.public_key())
    copied = skopeo_accepts(
        tmp_path, server.host, REPOSITORY, subject.digest, write_public(tmp_path, key)
    )
    assert copied.returncode != 0
    assert "no signature exists" in copied.stderr


def test_another_key_is_refused_by_both(
    client: RegistryClient, server: RegistryServer, key: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    subject = image(client, server, "other-key")
    sign_image(client, subject, ec.generate_private_key(ec.SECP256R1()), predicates())
    with pytest.raises(SignatureError, match="does not verify with the given key"):
        verify_image(client, subject, key.public_key())
    copied = skopeo_accepts(
        tmp_path, server.host, REPOSITORY, subject.digest, write_public(tmp_path, key)
    )
    assert copied.returncode != 0


def test_a_signature_moved_from_another_image_is_refused_by_both(
    client: RegistryClient, server: RegistryServer, key: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    signed = image(client, server, "moved-from")
    target = image(client, server, "moved-to")
    sign_image(client, signed, key, predicates())
    # Someone with push rights copies a valid signature manifest onto another image's tag.
    manifest, _, _ = client.get_manifest(REPOSITORY, cosign.signature_tag(signed.digest))
    client.push_manifest(REPOSITORY, cosign.signature_tag(target.digest), manifest, OCI_MANIFEST)
    with pytest.raises(SignatureError, match=f"is for {signed.digest}, not {target.digest}"):
        verify_image(client, target, key.public_key())
    copied = skopeo_accepts(
        tmp_path, server.host, REPOSITORY, target.digest, write_public(tmp_path, key)
    )
    assert copied.returncode != 0


def test_a_signature_for_another_repository_is_refused_by_skopeo(
    client: RegistryClient, server: RegistryServer, key: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    subject = image(client, server, "other-repo")
    elsewhere = Subject(
        host=server.host, repository="envbuild-test/elsewhere", digest=subject.digest
    )
    payload = cosign.simple_signing_payload(elsewhere.reference, subject.digest)
    layer = {
        **client.push_blob(REPOSITORY, payload, cosign.SIMPLE_SIGNING_MEDIA_TYPE),
        "annotations": {cosign.SIGNATURE_ANNOTATION: cosign.sign(key, payload)},
    }
    _put_signature_manifest(client, subject, [layer])
    copied = skopeo_accepts(
        tmp_path, server.host, REPOSITORY, subject.digest, write_public(tmp_path, key)
    )
    assert copied.returncode != 0


def test_a_failed_verdict_signed_with_the_key_is_refused(
    client: RegistryClient, server: RegistryServer, key: ec.EllipticCurvePrivateKey
) -> None:
    subject = image(client, server, "failed")
    failed = {**PASSED, "result": "FAILED", "failedTests": ["allreduce"]}
    sign_image(client, subject, key, predicates(failed))
    with pytest.raises(SignatureError, match=r"verdict is FAILED \(failed: allreduce\)"):
        verify_image(client, subject, key.public_key())


def test_an_attestation_signed_with_another_key_is_refused(
    client: RegistryClient, server: RegistryServer, key: ec.EllipticCurvePrivateKey
) -> None:
    subject = image(client, server, "other-attester")
    sign_image(client, subject, key, {})  # the image signature only
    sign_image(client, subject, ec.generate_private_key(ec.SECP256R1()), predicates())
    with pytest.raises(
        SignatureError, match=r"no .*test-result.* attestation .* verifies: no signature"
    ):
        verify_image(client, subject, key.public_key())


def test_two_signers_at_once_keep_both_signatures(
    server: RegistryServer, key: ec.EllipticCurvePrivateKey, tmp_path: Path
) -> None:
    other = ec.generate_private_key(ec.SECP256R1())
    with RegistryClient.for_host(server.host) as client:
        subject = image(client, server, "two-signers")
    errors: list[BaseException] = []

    def sign_with(signer: ec.EllipticCurvePrivateKey) -> None:
        try:
            with RegistryClient.for_host(server.host) as own:
                sign_image(own, subject, signer, predicates())
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=sign_with, args=(k,)) for k in (key, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    with RegistryClient.for_host(server.host) as client:
        manifest, _, _ = client.get_manifest(REPOSITORY, cosign.signature_tag(subject.digest))
        assert len(manifest["layers"]) == 2
        for signer in (key, other):
            verify_image(client, subject, signer.public_key())
            public = write_public(tmp_path, signer, f"{id(signer)}.pub")
            copied = skopeo_accepts(tmp_path, server.host, REPOSITORY, subject.digest, public)
            assert copied.returncode == 0, copied.stderr


def _put_signature_manifest(
    client: RegistryClient, subject: Subject, layers: list[dict[str, Any]]
) -> None:
    config = manifest_bytes({"rootfs": {"type": "layers", "diff_ids": []}})
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": client.push_blob(
            subject.repository, config, "application/vnd.oci.image.config.v1+json"
        ),
        "layers": layers,
    }
    client.push_manifest(
        subject.repository, cosign.signature_tag(subject.digest), manifest, OCI_MANIFEST
    )


def test_a_flood_of_signatures_is_one_line_not_a_long_read(
    client: RegistryClient, server: RegistryServer, key: ec.EllipticCurvePrivateKey
) -> None:
    subject = image(client, server, "flooded")
    junk = client.push_blob(REPOSITORY, b"{}", cosign.SIMPLE_SIGNING_MEDIA_TYPE)
    layer = {**junk, "annotations": {cosign.SIGNATURE_ANNOTATION: "MEUCIQ=="}}
    _put_signature_manifest(client, subject, [layer] * 10_000)
    with pytest.raises(
        SignatureError, match=f"holds 10000 layers, more than envbuild reads \\({MAX_LAYERS}\\)"
    ):
        verify_image(client, subject, key.public_key())


def test_a_huge_signature_payload_is_refused_bounded(
    client: RegistryClient, server: RegistryServer, key: ec.EllipticCurvePrivateKey
) -> None:
    subject = image(client, server, "huge-payload")
    huge = b"{" + b" " * (1 << 20) + b"}"
    layer = {
        **client.push_blob(REPOSITORY, huge, cosign.SIMPLE_SIGNING_MEDIA_TYPE),
        "annotations": {cosign.SIGNATURE_ANNOTATION: cosign.sign(key, huge)},
    }
    _put_signature_manifest(client, subject, [layer])
    with pytest.raises(RegistryError) as caught:
        verify_image(client, subject, key.public_key())
    assert "\n" not in str(caught.value)
    assert json.dumps(str(caught.value))  # a plain line, whatever it says
