"""Registry v2 HTTP client: references, auth, manifests, blobs and referrers.

Talks the OCI distribution API over requests: it reads the digest a registry holds for a tag
(what `publish` compares with the local image), pushes blobs and manifests, and finds an
image's evidence artifacts through the referrers API (envbuild.publish.evidence builds on it).

- `reference`: RegistryRef and parse_reference (Docker's grammar, no Docker Hub defaults).
- `errors`: the RegistryError tree.
- `content`: media types, manifest bytes, digests and their verification.
- `auth`: answering a registry's challenges with credentials (envbuild.net.credentials) or tokens.
- `connection`: one host's session, deadlines, retries and one-line errors.
- `client`: RegistryClient, the API's operations.

Credentials are never logged, never appear in messages or reprs, and go only to the
registry's own origin or its token service, over https (or loopback).
"""

from envbuild.registry.client import MAX_REFERRERS, RegistryClient
from envbuild.registry.connection import DEADLINE_ENV, DEFAULT_DEADLINE, deadline_from_env
from envbuild.registry.content import (
    CREATED_ANNOTATION,
    DOCKER_MANIFEST,
    DOCKER_MANIFEST_LIST,
    EMPTY_CONFIG,
    EVIDENCE_ARTIFACT_TYPE,
    MANIFEST_MEDIA_TYPES,
    OCI_EMPTY,
    OCI_INDEX,
    OCI_MANIFEST,
    TITLE_ANNOTATION,
    json_or_none,
    manifest_bytes,
    sha256,
)
from envbuild.registry.errors import (
    BadReference,
    DigestMismatch,
    EvidenceNotFound,
    RegistryAuthError,
    RegistryError,
    RegistryMalformed,
    RegistryNotFound,
    RegistryRejected,
    RegistryUnreachable,
)
from envbuild.registry.reference import RegistryRef, default_scheme, is_digest, parse_reference

__all__ = [
    "CREATED_ANNOTATION",
    "DEADLINE_ENV",
    "DEFAULT_DEADLINE",
    "DOCKER_MANIFEST",
    "DOCKER_MANIFEST_LIST",
    "EMPTY_CONFIG",
    "EVIDENCE_ARTIFACT_TYPE",
    "MANIFEST_MEDIA_TYPES",
    "MAX_REFERRERS",
    "OCI_EMPTY",
    "OCI_INDEX",
    "OCI_MANIFEST",
    "TITLE_ANNOTATION",
    "BadReference",
    "DigestMismatch",
    "EvidenceNotFound",
    "RegistryAuthError",
    "RegistryClient",
    "RegistryError",
    "RegistryMalformed",
    "RegistryNotFound",
    "RegistryRef",
    "RegistryRejected",
    "RegistryUnreachable",
    "deadline_from_env",
    "default_scheme",
    "is_digest",
    "json_or_none",
    "manifest_bytes",
    "parse_reference",
    "sha256",
]
