"""What a registry stores: media types, manifest bytes, digests and their verification."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from envbuild.net.bounded import printable
from envbuild.registry.errors import DigestMismatch

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_MEDIA_TYPES = (OCI_INDEX, OCI_MANIFEST, DOCKER_MANIFEST_LIST, DOCKER_MANIFEST)
EVIDENCE_ARTIFACT_TYPE = "application/vnd.envbuild.evidence.v1+json"
TITLE_ANNOTATION = "org.opencontainers.image.title"
CREATED_ANNOTATION = "org.opencontainers.image.created"
MANIFEST_ACCEPT = ", ".join(MANIFEST_MEDIA_TYPES)
EMPTY_CONFIG = b"{}"  # the config blob of an artifact that has none (OCI_EMPTY)

_HASHES = {"sha256": hashlib.sha256, "sha512": hashlib.sha512}


def json_or_none(body: bytes | str) -> Any:
    """The parsed JSON of a server's answer, or None when it is not JSON."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past the C stack
        return None


def manifest_bytes(manifest: Mapping[str, Any] | bytes) -> bytes:
    """A manifest as the bytes pushed (compact JSON); bytes are kept exactly as they are."""
    if isinstance(manifest, bytes):
        return manifest
    return json.dumps(manifest, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def sha256(data: bytes) -> str:
    """The OCI digest of `data`: sha256:<hex>."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def verify(data: bytes, digest: str, what: str) -> None:
    """DigestMismatch unless `data` has `digest` (sha256 or sha512)."""
    algorithm, _, expected = digest.partition(":")
    hasher = _HASHES.get(algorithm)
    if hasher is None:
        msg = (
            f"{what}: cannot verify a {printable(algorithm, 40)} digest (envbuild checks sha256 "
            "and sha512)"
        )
        raise DigestMismatch(msg)
    actual = hasher(data).hexdigest()
    if actual != expected:
        msg = f"{what}: the registry sent content whose digest is {algorithm}:{actual}"
        raise DigestMismatch(msg)
