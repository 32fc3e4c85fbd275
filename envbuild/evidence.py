"""Evidence beside a published image: an OCI artifact (smoke report, package list) whose subject
is the image's manifest digest, found through the referrers API or its tag-schema fallback."""

from __future__ import annotations

import base64
import logging
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from envbuild.registry import (
    _EMPTY_CONFIG,
    CREATED_ANNOTATION,
    EVIDENCE_ARTIFACT_TYPE,
    OCI_EMPTY,
    OCI_INDEX,
    OCI_MANIFEST,
    TITLE_ANNOTATION,
    EvidenceNotFound,
    RegistryClient,
    RegistryError,
    RegistryNotFound,
    _manifest_bytes,
    _sha256,
)

log = logging.getLogger(__name__)


def referrers_tag(digest: str) -> str:
    """The referrers tag schema's fallback tag for a subject digest: `sha256-<hex>`."""
    algorithm, _, encoded = digest.partition(":")
    tag = f"{algorithm[:32]}-{encoded[:64]}"
    return re.sub(r"[^A-Za-z0-9_.-]", "-", tag)


def attach_evidence(
    client: RegistryClient,
    repository: str,
    subject_digest: str,
    subject_media_type: str,
    subject_size: int,
    files: Mapping[str, tuple[bytes, str]],
    artifact_type: str = EVIDENCE_ARTIFACT_TYPE,
) -> str:
    """Push `files` as an OCI artifact whose subject is the image; returns its manifest digest."""
    if not files:
        msg = "attach_evidence needs at least one file"
        raise ValueError(msg)
    layers = []
    for name, (data, media_type) in sorted(files.items()):
        descriptor = client.push_blob(repository, data, media_type)
        layers.append({**descriptor, "annotations": {TITLE_ANNOTATION: name}})
    config = {
        **client.push_blob(repository, _EMPTY_CONFIG, OCI_EMPTY),
        "data": base64.b64encode(_EMPTY_CONFIG).decode("ascii"),
    }
    annotations = {CREATED_ANNOTATION: _now_rfc3339()}
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": config,
        "layers": layers,
        "subject": {
            "mediaType": subject_media_type,
            "digest": subject_digest,
            "size": subject_size,
        },
        "annotations": annotations,
    }
    body = _manifest_bytes(manifest)
    digest, response = client._put_manifest(repository, _sha256(body), body, OCI_MANIFEST)
    if response.headers.get("OCI-Subject") == subject_digest:
        log.info("%s indexes referrers itself; no fallback tag needed", client.host)
        return digest
    descriptor = {
        "mediaType": OCI_MANIFEST,
        "digest": digest,
        "size": len(body),
        "artifactType": artifact_type,
        "annotations": annotations,
    }
    _add_to_referrers_tag(client, repository, subject_digest, descriptor)
    return digest


def _add_to_referrers_tag(
    client: RegistryClient, repository: str, subject_digest: str, descriptor: dict[str, Any]
) -> None:
    """Merge `descriptor` into the image index at the referrers fallback tag (spec §3.2)."""
    tag = referrers_tag(subject_digest)
    manifests: list[dict[str, Any]] = []
    existing = _fallback_index(client, repository, subject_digest)
    if existing is not None:
        manifests = [d for d in existing if d.get("digest") != descriptor["digest"]]
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [*manifests, descriptor]}
    client.push_manifest(repository, tag, index, OCI_INDEX)


def _fallback_index(
    client: RegistryClient, repository: str, subject_digest: str
) -> list[dict[str, Any]] | None:
    tag = referrers_tag(subject_digest)
    try:
        index, media_type, _ = client.get_manifest(repository, tag)
    except RegistryNotFound:
        return None
    if media_type != OCI_INDEX or not isinstance(index.get("manifests"), list):
        msg = (
            f"{client.host}/{repository}:{tag} is the referrers fallback tag of {subject_digest} "
            f"but holds a {media_type or 'non-index'} manifest; delete that tag"
        )
        raise RegistryError(msg)
    return [d for d in index["manifests"] if isinstance(d, dict)]


def find_evidence(
    client: RegistryClient,
    repository: str,
    subject_digest: str,
    *,
    artifact_type: str = EVIDENCE_ARTIFACT_TYPE,
) -> dict[str, bytes]:
    """The files of the newest evidence artifact attached to the image, by title."""
    descriptors = client.referrers(repository, subject_digest, artifact_type)
    where = "the referrers API"
    if descriptors is None:
        where = f"the referrers tag {referrers_tag(subject_digest)}"
        descriptors = _fallback_index(client, repository, subject_digest) or []
    candidates: list[tuple[datetime, int, dict[str, Any]]] = []
    for position, descriptor in enumerate(descriptors):
        if descriptor.get("artifactType") != artifact_type:
            continue
        manifest, _, _ = client.get_manifest(repository, str(descriptor.get("digest")))
        subject = manifest.get("subject")
        if manifest.get("artifactType", artifact_type) != artifact_type or not (
            isinstance(subject, dict) and subject.get("digest") == subject_digest
        ):
            continue
        created = (manifest.get("annotations") or {}).get(CREATED_ANNOTATION)
        candidates.append((_parse_time(created), position, manifest))
    if not candidates:
        msg = (
            f"no envbuild evidence is attached to {client.host}/{repository}@{subject_digest} "
            f"(looked in {where}); publish the image with `envbuild publish` to attach it"
        )
        raise EvidenceNotFound(msg)
    newest = max(candidates, key=lambda item: (item[0], item[1]))[2]
    files: dict[str, bytes] = {}
    for layer in newest.get("layers") or []:
        digest = str(layer.get("digest"))
        title = (layer.get("annotations") or {}).get(TITLE_ANNOTATION) or digest
        files[str(title)] = client.get_blob(repository, digest)
    return files


def _now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _parse_time(text: object) -> datetime:
    if isinstance(text, str):
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            pass
        else:
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return datetime.min.replace(tzinfo=UTC)
