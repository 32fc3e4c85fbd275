"""Signatures and signed attestations beside a published image, where cosign keeps them.

Signing appends a layer to the manifest at `sha256-<hex>.sig` (the simple-signing payload) and
one per attestation to `sha256-<hex>.att` (DSSE envelopes), as `cosign sign --key` and
`cosign attest --key` do; other signers' layers are kept. Two signers of one image race on the
read-merge-write of those tags: on this host a lock orders them, and across hosts each reads
the tag back after its write and merges again if the other's write replaced its own.

Verifying reads those tags back, bounded (MAX_LAYERS layers, LAYER_LIMIT bytes each), and checks
every byte that matters with the public key: the signature and the digest it signs, and each
attestation's signature, subject and predicate; the smoke verdict must be PASSED.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec

from envbuild.net.bounded import printable
from envbuild.publish import cosign
from envbuild.publish.evidence import host_lock
from envbuild.registry import (
    OCI_MANIFEST,
    RegistryClient,
    RegistryError,
    RegistryNotFound,
    manifest_bytes,
)

log = logging.getLogger(__name__)

OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
MAX_LAYERS = 256  # signatures or attestations read from one tag; more is refused, not skimmed
LAYER_LIMIT = 16 << 20  # an SBOM attestation of a CUDA image is a few hundred KB
_MERGE_TRIES = 4
REQUIRED = (cosign.TEST_RESULT, cosign.SLSA_PROVENANCE, cosign.CYCLONEDX)


class SignatureError(RegistryError):
    """A signature or attestation that is missing or does not verify; exit 1, one line."""


@dataclass(frozen=True, kw_only=True)
class Subject:
    """The image a signature is about: where it lives and its manifest digest."""

    host: str
    repository: str
    digest: str

    @property
    def reference(self) -> str:
        """`host/repository`, the docker-reference cosign signs (no tag)."""
        return f"{self.host}/{self.repository}"


def sign_image(
    client: RegistryClient,
    subject: Subject,
    key: ec.EllipticCurvePrivateKey,
    predicates: Mapping[str, dict[str, Any]],
) -> tuple[str, str]:
    """Sign the image and attach a signed attestation per predicate (by type); returns the
    digests of the signature and attestation manifests."""
    with client.operation():
        payload = cosign.simple_signing_payload(subject.reference, subject.digest)
        signature = {
            **client.push_blob(subject.repository, payload, cosign.SIMPLE_SIGNING_MEDIA_TYPE),
            "annotations": {cosign.SIGNATURE_ANNOTATION: cosign.sign(key, payload)},
        }
        signed = _append_layers(client, subject, cosign.signature_tag(subject.digest), [signature])
        layers = []
        for predicate_type, predicate in predicates.items():
            statement = cosign.Statement(
                subject_name=subject.reference,
                digest=subject.digest,
                predicate_type=predicate_type,
                predicate=predicate,
            )
            envelope = cosign.envelope(statement, key)
            descriptor = client.push_blob(subject.repository, envelope, cosign.DSSE_MEDIA_TYPE)
            descriptor["annotations"] = {
                cosign.SIGNATURE_ANNOTATION: "",
                cosign.PREDICATE_TYPE_ANNOTATION: predicate_type,
            }
            layers.append(descriptor)
        attested = _append_layers(client, subject, cosign.attestation_tag(subject.digest), layers)
        return signed, attested


def _append_layers(
    client: RegistryClient, subject: Subject, tag: str, layers: list[dict[str, Any]]
) -> str:
    """Merge `layers` into the manifest at `tag` (made if absent); its digest once it holds them.

    A layer is its blob and its annotations: two signers of one image sign the same payload
    blob, and each keeps its own signature annotation."""
    repository = subject.repository
    wanted = {_identity(layer) for layer in layers}
    with host_lock(f"{client.host}/{repository}:{tag}"):
        for _ in range(_MERGE_TRIES):
            existing = _layers_at(client, subject, tag) or []
            merged = [*(d for d in existing if _identity(d) not in wanted), *layers]
            config = {
                "architecture": "",
                "os": "",
                "config": {},
                "rootfs": {"type": "layers", "diff_ids": [d["digest"] for d in merged]},
            }
            config_descriptor = client.push_blob(repository, manifest_bytes(config), OCI_CONFIG)
            manifest = {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": config_descriptor,
                "layers": merged,
            }
            digest = client.push_manifest(repository, tag, manifest, OCI_MANIFEST)
            if wanted <= {_identity(d) for d in _layers_at(client, subject, tag) or []}:
                return digest
            log.info("%s:%s changed while it was updated; merging again", repository, tag)
    msg = (
        f"{client.host}/{repository}:{tag}: another signer kept replacing it; "
        "sign again when it is done"
    )
    raise RegistryError(msg)


def _identity(layer: dict[str, Any]) -> tuple[str, str]:
    """What makes a signature layer itself: its blob and its signature annotation."""
    annotations = layer.get("annotations") or {}
    return str(layer.get("digest")), str(annotations.get(cosign.SIGNATURE_ANNOTATION, ""))


def _layers_at(client: RegistryClient, subject: Subject, tag: str) -> list[dict[str, Any]] | None:
    """The layer descriptors of the manifest at `tag`, checked; None when there is none."""
    try:
        manifest, media_type, _ = client.get_manifest(subject.repository, tag)
    except RegistryNotFound:
        return None
    what = f"{client.host}/{subject.repository}:{tag}"
    layers = manifest.get("layers")
    if media_type != OCI_MANIFEST or not isinstance(layers, list):
        why = f"a {printable(media_type or 'non-image', 80)} manifest, not an OCI image manifest"
        raise client.malformed(what, kind="signature manifest", why=why)
    if len(layers) > MAX_LAYERS:
        msg = (
            f"{what} holds {len(layers)} layers, more than envbuild reads ({MAX_LAYERS}); "
            "remove the extra signatures from the registry"
        )
        raise SignatureError(msg)
    descriptors = [client.descriptor(d, what, kind="signature layer") for d in layers]
    for descriptor in descriptors:
        descriptor.setdefault("annotations", {})
    return descriptors


@dataclass(kw_only=True)
class Verified:
    """What verify checked, each a line for the user."""

    checked: list[str] = field(default_factory=list)
    predicates: dict[str, dict[str, Any]] = field(default_factory=dict)


def verify_image(
    client: RegistryClient,
    subject: Subject,
    key: ec.EllipticCurvePublicKey,
    required: tuple[str, ...] = REQUIRED,
) -> Verified:
    """Check the image's signature and its `required` attestations with `key`; SignatureError
    on the first thing that does not verify, naming it. (An index has no SBOM of its own: each
    of its images has one.)"""
    with client.operation():
        result = Verified()
        result.checked.append(_verify_signature(client, subject, key))
        result.predicates = _verify_attestations(
            client, subject, key, result.checked.append, required
        )
        verdict = result.predicates[cosign.TEST_RESULT].get("result")
        if verdict != "PASSED":
            failed = result.predicates[cosign.TEST_RESULT].get("failedTests")
            shown = ", ".join(map(str, failed[:8])) if isinstance(failed, list) else "?"
            msg = f"{subject.reference}@{subject.digest}: the signed smoke verdict is {printable(str(verdict), 20)} (failed: {shown})"
            raise SignatureError(msg)
        result.checked.append("the signed smoke verdict is PASSED")
        return result


def _verify_signature(
    client: RegistryClient, subject: Subject, key: ec.EllipticCurvePublicKey
) -> str:
    tag = cosign.signature_tag(subject.digest)
    where = f"{subject.reference}:{tag}"
    layers = _layers_at(client, subject, tag)
    if not layers:
        msg = (
            f"{subject.reference}@{subject.digest} is not signed (no {tag}); publish it with --sign"
        )
        raise SignatureError(msg)
    reasons: list[str] = []
    for layer in layers:
        if layer.get("mediaType") != cosign.SIMPLE_SIGNING_MEDIA_TYPE:
            continue
        signature = layer["annotations"].get(cosign.SIGNATURE_ANNOTATION)
        if not signature:
            reasons.append("a layer without a signature annotation")
            continue
        payload = client.get_blob(subject.repository, layer["digest"], limit=64 * 1024)
        try:
            cosign.verify_signature(key, payload, signature)
            reference = cosign.check_simple_signing(payload, subject.digest)
        except cosign.SignatureRefused as exc:
            reasons.append(str(exc))
            continue
        return (
            f"signature in {where} verifies with the key and signs {subject.digest} ({reference})"
        )
    why = reasons[0] if reasons else "it holds no simple-signing layer"
    msg = f"no signature in {where} verifies: {why}" + (
        f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
    )
    raise SignatureError(msg)


def _verify_attestations(
    client: RegistryClient,
    subject: Subject,
    key: ec.EllipticCurvePublicKey,
    checked: Callable[[str], None],
    required: tuple[str, ...],
) -> dict[str, dict[str, Any]]:
    tag = cosign.attestation_tag(subject.digest)
    where = f"{subject.reference}:{tag}"
    layers = _layers_at(client, subject, tag) or []
    found: dict[str, dict[str, Any]] = {}
    reasons: dict[str, str] = {}
    for layer in layers:
        predicate_type = layer["annotations"].get(cosign.PREDICATE_TYPE_ANNOTATION, "")
        if layer.get("mediaType") != cosign.DSSE_MEDIA_TYPE or predicate_type not in required:
            continue
        data = client.get_blob(subject.repository, layer["digest"], limit=LAYER_LIMIT)
        try:
            body = cosign.open_envelope(data, key)
            predicate = cosign.check_statement(body, subject.digest, predicate_type)
        except cosign.SignatureRefused as exc:
            reasons.setdefault(predicate_type, str(exc))
            continue
        found[predicate_type] = predicate  # the newest layer of a type wins
    for predicate_type in required:
        if predicate_type not in found:
            why = reasons.get(predicate_type, "none is attached")
            msg = f"no {predicate_type} attestation in {where} verifies: {why}"
            raise SignatureError(msg)
        checked(f"{predicate_type} attestation verifies with the key, about {subject.digest}")
    return found
