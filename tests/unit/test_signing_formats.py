"""The bytes of cosign signatures and DSSE attestations: published vectors, golden strings from the
specifications, the in-toto protobuf schemas, and the hostile cases verification must refuse."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from google.protobuf import json_format
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.predicates.test_result.v0 import test_result_pb2
from in_toto_attestation.v1 import statement_pb2

from envbuild.core import labels as label_keys
from envbuild.core.errors import BadInput
from envbuild.publish import attestations, cosign
from envbuild.publish.keys import load_public_key

VECTORS = Path(__file__).resolve().parents[1] / "fixtures" / "sigstore-vectors"
DIGEST = "sha256:" + "ab" * 32
OTHER = "sha256:" + "cd" * 32
REPO = "registry.example.com/ml/torch"


@pytest.fixture(scope="module")
def key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def test_the_simple_signing_payload_is_cosigns_golden_string() -> None:
    # sigstore/sigstore pkg/signature/payload: the fields in the struct's order, no spaces.
    expected = (
        '{"critical":{"identity":{"docker-reference":"registry.example.com/ml/torch"},'
        '"image":{"docker-manifest-digest":"' + DIGEST + '"},'
        '"type":"cosign container image signature"},"optional":null}'
    )
    assert cosign.simple_signing_payload(REPO, DIGEST) == expected.encode()


def test_the_signature_tags_are_cosigns() -> None:
    assert cosign.signature_tag(DIGEST) == "sha256-" + "ab" * 32 + ".sig"
    assert cosign.attestation_tag(DIGEST) == "sha256-" + "ab" * 32 + ".att"


def test_the_dsse_pre_authentication_encoding_is_the_protocols_example() -> None:
    # secure-systems-lab/dsse protocol.md's worked example.
    assert (
        cosign.pae("http://example.com/HelloWorld", b"hello world")
        == b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
    )


def test_the_conformance_vectors_signature_verifies_with_its_key() -> None:
    folder = VECTORS / "sigstore-conformance"
    bundle = json.loads((folder / "managed-key-happy-path" / "bundle.sigstore.json").read_text())
    public = load_public_key(folder / "managed-key-happy-path" / "key.pub")
    message = (folder / "a.txt").read_bytes()
    cosign.verify_signature(public, message, bundle["messageSignature"]["signature"])
    with pytest.raises(cosign.SignatureRefused, match="does not verify"):
        cosign.verify_signature(public, message + b"x", bundle["messageSignature"]["signature"])


def test_the_conformance_vectors_broken_key_is_one_line() -> None:
    path = VECTORS / "sigstore-conformance" / "managed-key-wrong-key_fail" / "key.pub"
    with pytest.raises(BadInput, match="holds no PEM public key") as caught:
        load_public_key(path)
    assert "\n" not in caught.value.message


def test_a_bundle_is_not_a_key() -> None:
    path = VECTORS / "sigstore-conformance" / "managed-key-no-key_fail" / "bundle.sigstore.json"
    with pytest.raises(BadInput, match="holds no PEM public key"):
        load_public_key(path)


def test_the_sigstore_go_dsse_envelope_opens_with_its_key() -> None:
    bundle = json.loads((VECTORS / "sigstore-go" / "bundle-public-key.json").read_text())
    public = load_public_key(VECTORS / "sigstore-go" / "public-key.pem")
    envelope = json.dumps(bundle["dsseEnvelope"]).encode()
    assert cosign.open_envelope(envelope, public, payload_type="text/plain") == b"hello, world!"
    with pytest.raises(cosign.SignatureRefused, match="payload type"):
        cosign.open_envelope(envelope, public)


def test_a_raw_r_s_signature_verifies_as_its_der_form(key: ec.EllipticCurvePrivateKey) -> None:
    der = base64.b64decode(cosign.sign(key, b"data"))
    r, s = decode_dss_signature(der)
    raw = r.to_bytes(32, "big") + s.to_bytes(32, "big")
    cosign.verify_signature(key.public_key(), b"data", base64.b64encode(raw).decode())


def _statement(predicate_type: str, predicate: dict[str, Any]) -> cosign.Statement:
    return cosign.Statement(
        subject_name=REPO, digest=DIGEST, predicate_type=predicate_type, predicate=predicate
    )


REPORT: dict[str, Any] = {
    "passed": True,
    "checks": [
        {"name": "payload", "passed": True, "detail": "ok"},
        {"name": "loss_fell", "passed": True, "detail": "2.3 -> 0.1"},
        {"name": "allreduce", "passed": True, "detail": "gloo"},
    ],
    "run_with": "--shm-size 1g",
    "devices": [{"kind": "cpu", "name": "x86_64", "count": 2}],
}
LABELS = {
    label_keys.ENTRY_ID: "torch2.13.0-cpu-py3.11-bookworm",
    label_keys.FRAMEWORK: "torch",
    label_keys.FRAMEWORK_VERSION: "2.13.0",
    label_keys.CUDA: "cpu",
    label_keys.PYTHON: "3.11",
    label_keys.LOCK_DIGEST: "sha256:" + "11" * 32,
    label_keys.CONTENT_HASH: "22" * 32,
}


def _predicates() -> dict[str, dict[str, Any]]:
    from datetime import UTC, datetime

    facts = attestations.BuildFacts(
        image_id="sha256:" + "33" * 32,
        labels=LABELS,
        base_image="envbuild/base:bookworm",
        base_image_id="sha256:" + "44" * 32,
        dockerfile_sha256="55" * 32,
        installer="uv 0.11.2",
        started=datetime(2026, 12, 2, 5, 0, tzinfo=UTC),
        finished=datetime(2026, 12, 2, 5, 1, tzinfo=UTC),
        invocation="run-1",
    )
    return {
        cosign.TEST_RESULT: attestations.test_result(REPORT, payload_digest="sha256:" + "66" * 32),
        cosign.SLSA_PROVENANCE: attestations.provenance(facts),
    }


@pytest.mark.parametrize("minimal", [False, True], ids=["full", "minimal"])
def test_every_statement_and_predicate_parses_strictly_with_in_totos_schemas(
    minimal: bool,
) -> None:
    predicates = _predicates()
    if minimal:  # an image built before envbuild recorded its build: labels only
        predicates[cosign.SLSA_PROVENANCE] = attestations.provenance(
            attestations.BuildFacts(image_id="sha256:" + "33" * 32, labels={})
        )
        predicates[cosign.TEST_RESULT] = attestations.test_result({}, payload_digest=None)
    schemas = {
        cosign.TEST_RESULT: test_result_pb2.TestResult,
        cosign.SLSA_PROVENANCE: provenance_pb2.Provenance,
    }
    for predicate_type, predicate in predicates.items():
        document = _statement(predicate_type, predicate).as_dict()
        # json_format.Parse refuses unknown fields, as the Go controllers' protojson does.
        json_format.Parse(json.dumps(document), statement_pb2.Statement())
        json_format.Parse(json.dumps(predicate), schemas[predicate_type]())


def test_the_test_result_names_passed_and_failed_checks() -> None:
    report = {**REPORT, "checks": [*REPORT["checks"], {"name": "compile", "passed": False}]}
    failing = attestations.test_result({**report, "passed": False}, payload_digest=None)
    assert failing["result"] == "FAILED"
    assert failing["failedTests"] == ["compile"]
    assert failing["passedTests"] == ["payload", "loss_fell", "allreduce"]
    assert attestations.test_result(REPORT, payload_digest=None)["result"] == "PASSED"
    assert attestations.test_result({"passed": True, "checks": []}, payload_digest=None)[
        "result"
    ] == ("FAILED")


def test_an_envelope_round_trips_and_its_statement_is_checked(
    key: ec.EllipticCurvePrivateKey,
) -> None:
    predicate = _predicates()[cosign.TEST_RESULT]
    data = cosign.envelope(_statement(cosign.TEST_RESULT, predicate), key)
    body = cosign.open_envelope(data, key.public_key())
    assert cosign.check_statement(body, DIGEST, cosign.TEST_RESULT) == predicate
    document = json.loads(data)
    assert document["signatures"][0]["keyid"] == ""
    assert document["payloadType"] == "application/vnd.in-toto+json"


def _resign(key: ec.EllipticCurvePrivateKey, body: bytes, payload_type: str) -> bytes:
    return json.dumps(
        {
            "payload": base64.b64encode(body).decode(),
            "payloadType": payload_type,
            "signatures": [{"keyid": "", "sig": cosign.sign(key, cosign.pae(payload_type, body))}],
        }
    ).encode()


def hostile_envelopes(key: ec.EllipticCurvePrivateKey) -> dict[str, tuple[bytes, str]]:
    """Envelopes that must be refused, each with the words of the reason."""
    other_key = ec.generate_private_key(ec.SECP256R1())
    good = _statement(cosign.TEST_RESULT, {"result": "PASSED"}).as_dict()
    body = json.dumps(good).encode()
    signed = json.loads(_resign(key, body, cosign.IN_TOTO_PAYLOAD_TYPE))
    truncated = {
        **signed,
        "signatures": [{"keyid": "", "sig": signed["signatures"][0]["sig"][:40]}],
    }
    return {
        "another key": (_resign(other_key, body, cosign.IN_TOTO_PAYLOAD_TYPE), "no signature"),
        "another payload type": (_resign(key, body, "text/plain"), "payload type"),
        "truncated signature": (json.dumps(truncated).encode(), "no signature"),
        "not json": (b"{", "not JSON"),
        "a list": (b"[]", "not a DSSE envelope"),
        "payload not base64": (
            json.dumps({**signed, "payload": "%%%"}).encode(),
            "not standard base64",
        ),
        "payload swapped": (
            json.dumps({**signed, "payload": base64.b64encode(body + b" ").decode()}).encode(),
            "no signature",
        ),
        "no signatures": (json.dumps({**signed, "signatures": []}).encode(), "no signature"),
        "signature not base64": (
            json.dumps({**signed, "signatures": [{"keyid": "", "sig": "not base64!"}]}).encode(),
            "no signature",
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "another key",
        "another payload type",
        "truncated signature",
        "not json",
        "a list",
        "payload not base64",
        "payload swapped",
        "no signatures",
        "signature not base64",
    ],
)
def test_a_hostile_envelope_is_refused(case: str, key: ec.EllipticCurvePrivateKey) -> None:
    data, reason = hostile_envelopes(key)[case]
    with pytest.raises(cosign.SignatureRefused, match=reason):
        cosign.open_envelope(data, key.public_key())


def hostile_statements() -> dict[str, tuple[dict[str, Any], str]]:
    """Statements a valid signature may carry that must still be refused."""
    good = _statement(cosign.TEST_RESULT, {"result": "PASSED"}).as_dict()
    return {
        "another image": (
            {**good, "subject": [{"name": REPO, "digest": {"sha256": "cd" * 32}}]},
            "another image",
        ),
        "an extra field": ({**good, "extra": 1}, "fields an in-toto Statement does not"),
        "a subject field": (
            {**good, "subject": [{**good["subject"][0], "tag": "latest"}]},
            "not a list of resource descriptors",
        ),
        "another predicate type": ({**good, "predicateType": cosign.CYCLONEDX}, "predicate type"),
        "a predicate list": ({**good, "predicate": []}, "not an object"),
        "no subject": ({**good, "subject": []}, "another image"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "another image",
        "an extra field",
        "a subject field",
        "another predicate type",
        "a predicate list",
        "no subject",
    ],
)
def test_a_hostile_statement_is_refused(case: str) -> None:
    document, reason = hostile_statements()[case]
    with pytest.raises(cosign.SignatureRefused, match=reason):
        cosign.check_statement(json.dumps(document).encode(), DIGEST, cosign.TEST_RESULT)


def hostile_payloads() -> dict[str, tuple[bytes, str]]:
    """Simple-signing payloads that must be refused, even when correctly signed."""
    good = json.loads(cosign.simple_signing_payload(REPO, DIGEST))
    critical = good["critical"]
    return {
        "another digest": (cosign.simple_signing_payload(REPO, OTHER), "not " + DIGEST),
        "an extra top-level field": (
            json.dumps({**good, "extra": 1}).encode(),
            "not a simple-signing",
        ),
        "an extra critical field": (
            json.dumps({**good, "critical": {**critical, "extra": 1}}).encode(),
            "critical section",
        ),
        "another type": (
            json.dumps(
                {**good, "critical": {**critical, "type": "atomic container signature"}}
            ).encode(),
            "critical section",
        ),
        "an extra image field": (
            json.dumps(
                {**good, "critical": {**critical, "image": {**critical["image"], "tag": "x"}}}
            ).encode(),
            "other fields",
        ),
        "optional a list": (json.dumps({**good, "optional": []}).encode(), "optional"),
        "not json": (b"\xff", "not JSON"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "another digest",
        "an extra top-level field",
        "an extra critical field",
        "another type",
        "an extra image field",
        "optional a list",
        "not json",
    ],
)
def test_a_hostile_simple_signing_payload_is_refused(case: str) -> None:
    payload, reason = hostile_payloads()[case]
    with pytest.raises(cosign.SignatureRefused, match=reason):
        cosign.check_simple_signing(payload, DIGEST)


def test_a_good_payload_names_its_reference() -> None:
    assert cosign.check_simple_signing(cosign.simple_signing_payload(REPO, DIGEST), DIGEST) == REPO
