"""The bytes cosign, Kyverno, sigstore's policy-controller and skopeo read, made and checked here.

- An image signature: the simple-signing payload (exactly the fields containers/image accepts,
  in the order cosign's Go marshals them), signed with ECDSA P-256 over SHA-256 (ASN.1 DER),
  carried as a layer of the manifest at the tag `sha256-<hex>.sig` with the signature in the
  annotation `dev.cosignproject.cosign/signature` (standard base64).
- An attestation: an in-toto Statement in a DSSE envelope, signed over DSSE's pre-authentication
  encoding, a layer of the manifest at `sha256-<hex>.att`.

Sources: cosign specs/SIGNATURE_SPEC.md, sigstore/sigstore pkg/signature/payload, secure-systems-
lab/dsse protocol.md, in-toto/attestation spec v1 (see ../shared/reference/signing-formats.md).
Verification refuses rather than guesses: a payload with any other shape, a signature that is not
DER or r||s, an envelope of another payload type.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

SIMPLE_SIGNING_MEDIA_TYPE = "application/vnd.dev.cosign.simplesigning.v1+json"
DSSE_MEDIA_TYPE = "application/vnd.dsse.envelope.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
PREDICATE_TYPE_ANNOTATION = "predicateType"
SIGNATURE_TYPE = "cosign container image signature"
IN_TOTO_PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
TEST_RESULT = "https://in-toto.io/attestation/test-result/v0.1"
SLSA_PROVENANCE = "https://slsa.dev/provenance/v1"
CYCLONEDX = "https://cyclonedx.org/bom"

MAX_ENVELOPE_SIGNATURES = 16  # an envelope envbuild writes has one
_P256_RAW_SIGNATURE = 64  # r||s, 32 bytes each
_STATEMENT_KEYS = {"_type", "subject", "predicateType", "predicate"}
_SUBJECT_KEYS = {"name", "uri", "digest", "content", "downloadLocation", "mediaType", "annotations"}


class SignatureRefused(Exception):
    """A signature, payload or envelope that does not prove what it claims; the text says why."""


def signature_tag(digest: str) -> str:
    """The tag of an image's cosign signatures: `sha256-<hex>.sig`."""
    return _attached_tag(digest, "sig")


def attestation_tag(digest: str) -> str:
    """The tag of an image's cosign attestations: `sha256-<hex>.att`."""
    return _attached_tag(digest, "att")


def _attached_tag(digest: str, suffix: str) -> str:
    algorithm, _, encoded = digest.partition(":")
    return f"{algorithm}-{encoded}.{suffix}"


def _compact(document: Any) -> bytes:
    """JSON as Go's encoding/json writes it: no spaces, keys in the order given, no escaping
    of non-ASCII (cosign's golden payloads are byte strings; the order is the struct's)."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def simple_signing_payload(docker_reference: str, digest: str) -> bytes:
    """The exact payload `cosign sign` signs for `digest` in `docker_reference` (no tag)."""
    return _compact(
        {
            "critical": {
                "identity": {"docker-reference": docker_reference},
                "image": {"docker-manifest-digest": digest},
                "type": SIGNATURE_TYPE,
            },
            "optional": None,
        }
    )


def sign(key: ec.EllipticCurvePrivateKey, data: bytes) -> str:
    """The standard base64 of the DER ECDSA-P256/SHA-256 signature of `data`."""
    return base64.b64encode(key.sign(data, ec.ECDSA(hashes.SHA256()))).decode("ascii")


def verify_signature(key: ec.EllipticCurvePublicKey, data: bytes, signature_b64: str) -> None:
    """Check a base64 signature (DER, or the raw r||s some signers write) of `data`."""
    try:
        raw = base64.b64decode(signature_b64.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        msg = "the signature is not standard base64"
        raise SignatureRefused(msg) from None
    if len(raw) == _P256_RAW_SIGNATURE and raw[0] != 0x30:
        half = _P256_RAW_SIGNATURE // 2
        raw = encode_dss_signature(
            int.from_bytes(raw[:half], "big"), int.from_bytes(raw[half:], "big")
        )
    try:
        key.verify(raw, data, ec.ECDSA(hashes.SHA256()))
    except (InvalidSignature, ValueError):
        msg = "the signature does not verify with the given key"
        raise SignatureRefused(msg) from None


def check_simple_signing(payload: bytes, digest: str) -> str:
    """The docker-reference of a simple-signing payload that signs `digest`, once its shape is
    exactly cosign's (containers/image refuses any other field, and so does envbuild)."""
    try:
        document = json.loads(payload)
    except (ValueError, RecursionError):
        msg = "the signed payload is not JSON"
        raise SignatureRefused(msg) from None
    critical = document.get("critical") if isinstance(document, dict) else None
    if not isinstance(critical, dict) or set(document) != {"critical", "optional"}:
        msg = "the signed payload is not a simple-signing document (critical, optional)"
        raise SignatureRefused(msg)
    if set(critical) != {"identity", "image", "type"} or critical["type"] != SIGNATURE_TYPE:
        msg = f"the signed payload's critical section is not cosign's ({SIGNATURE_TYPE!r})"
        raise SignatureRefused(msg)
    identity, image = critical["identity"], critical["image"]
    if not (
        isinstance(identity, dict)
        and set(identity) == {"docker-reference"}
        and isinstance(identity["docker-reference"], str)
        and isinstance(image, dict)
        and set(image) == {"docker-manifest-digest"}
    ):
        msg = "the signed payload's identity or image has other fields than cosign's"
        raise SignatureRefused(msg)
    if not isinstance(document["optional"], dict | None):
        msg = "the signed payload's optional section is neither an object nor null"
        raise SignatureRefused(msg)
    if image["docker-manifest-digest"] != digest:
        signed = str(image["docker-manifest-digest"])[:80]
        msg = f"the signature is for {signed}, not {digest}"
        raise SignatureRefused(msg)
    return str(identity["docker-reference"])


def pae(payload_type: str, body: bytes) -> bytes:
    """DSSE's pre-authentication encoding: `DSSEv1 len(type) type len(body) body`."""
    kind = payload_type.encode("utf-8")
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(body), body)


@dataclass(frozen=True, kw_only=True)
class Statement:
    """An in-toto Statement about one image digest."""

    subject_name: str
    digest: str  # sha256:<hex>
    predicate_type: str
    predicate: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """The Statement with exactly the fields in-toto's protobuf schema defines."""
        algorithm, _, encoded = self.digest.partition(":")
        return {
            "_type": STATEMENT_TYPE,
            "subject": [{"name": self.subject_name, "digest": {algorithm: encoded}}],
            "predicateType": self.predicate_type,
            "predicate": self.predicate,
        }


def envelope(statement: Statement, key: ec.EllipticCurvePrivateKey) -> bytes:
    """The DSSE envelope (JSON bytes) of the statement, signed over its PAE, keyid empty."""
    body = _compact(statement.as_dict())
    return _compact(
        {
            "payload": base64.b64encode(body).decode("ascii"),
            "payloadType": IN_TOTO_PAYLOAD_TYPE,
            "signatures": [{"keyid": "", "sig": sign(key, pae(IN_TOTO_PAYLOAD_TYPE, body))}],
        }
    )


def open_envelope(
    data: bytes, key: ec.EllipticCurvePublicKey, *, payload_type: str = IN_TOTO_PAYLOAD_TYPE
) -> bytes:
    """The payload of a DSSE envelope that one of its signatures signs with `key`."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        msg = "the envelope is not JSON"
        raise SignatureRefused(msg) from None
    if not isinstance(document, dict) or not isinstance(document.get("signatures"), list):
        msg = "the envelope is not a DSSE envelope (payload, payloadType, signatures)"
        raise SignatureRefused(msg)
    if document.get("payloadType") != payload_type:
        shown = str(document.get("payloadType"))[:80]
        msg = f"the envelope's payload type is {shown!r}, not {payload_type!r}"
        raise SignatureRefused(msg)
    try:
        body = base64.b64decode(str(document.get("payload", "")).encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        msg = "the envelope's payload is not standard base64"
        raise SignatureRefused(msg) from None
    signed = pae(payload_type, body)
    for entry in document["signatures"][:MAX_ENVELOPE_SIGNATURES]:
        if isinstance(entry, dict) and isinstance(entry.get("sig"), str):
            try:
                verify_signature(key, signed, entry["sig"])
            except SignatureRefused:
                continue
            return body
    msg = "no signature of the envelope verifies with the given key"
    raise SignatureRefused(msg)


def check_statement(body: bytes, digest: str, predicate_type: str) -> dict[str, Any]:
    """The predicate of a Statement about `digest` of `predicate_type`; its shape checked as the
    admission controllers' strict parsers would."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError):
        msg = "the attested statement is not JSON"
        raise SignatureRefused(msg) from None
    if not isinstance(document, dict) or not set(document) <= _STATEMENT_KEYS:
        msg = "the attested statement has fields an in-toto Statement does not"
        raise SignatureRefused(msg)
    subjects = document.get("subject")
    if not isinstance(subjects, list) or not all(
        isinstance(s, dict) and set(s) <= _SUBJECT_KEYS for s in subjects
    ):
        msg = "the attested statement's subject is not a list of resource descriptors"
        raise SignatureRefused(msg)
    algorithm, _, encoded = digest.partition(":")
    if not any(
        isinstance(s.get("digest"), dict) and s["digest"].get(algorithm) == encoded
        for s in subjects
    ):
        msg = f"the attested statement is about another image, not {digest}"
        raise SignatureRefused(msg)
    if document.get("predicateType") != predicate_type:
        msg = f"the attested statement's predicate type is not {predicate_type}"
        raise SignatureRefused(msg)
    predicate = document.get("predicate")
    if not isinstance(predicate, dict):
        msg = "the attested statement's predicate is not an object"
        raise SignatureRefused(msg)
    return predicate


def sha256_hex(data: bytes) -> str:
    """The hex SHA-256 of `data`."""
    return hashlib.sha256(data).hexdigest()
