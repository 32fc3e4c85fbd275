"""One tag for several platforms: an image index over each platform's vetted, published image.

Each platform's image is published as any image is (its immutable tag, its evidence, its
signature); the index names them by digest under an immutable tag (the entry's tag without the platform
suffix, and the digest of its images), and the entry's tag and its moving tags
(torch2.13-cpu-py3.11, latest) name the index, so that `docker pull` on an arm64 node gets the
arm64 image. An index is published only when every platform of the entry
passed its smoke test and the registry holds its image: a missing platform is an error, never
an index with a hole.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from envbuild.core.errors import EnvbuildError
from envbuild.core.models import Entry
from envbuild.core.platforms import AMD64, architecture, tag_suffix
from envbuild.publish.verify import Target, entry_target, split_registry
from envbuild.registry import RegistryClient
from envbuild.registry.content import DOCKER_MANIFEST, DOCKER_MANIFEST_LIST, OCI_INDEX
from envbuild.registry.errors import RegistryNotFound

HASH_LENGTH = 12  # as the images' immutable tags


@dataclass(frozen=True, kw_only=True)
class Child:
    """One platform's published image, as the index names it."""

    platform: str
    digest: str
    media_type: str
    size: int


@dataclass(frozen=True, kw_only=True)
class IndexPublished:
    """An index pushed and read back, and the tags that name it."""

    host: str
    repository: str
    reference: str  # host/repository:immutable tag
    digest: str
    tags: tuple[str, ...]  # the moving tags moved to it
    children: tuple[Child, ...]
    signature: str = ""  # with --sign: the digests of its signature and attestations
    attestations: str = ""


def platform_groups(entries: list[Entry]) -> dict[str, list[Entry]]:
    """Entries that differ only in their platform, by the id they share (the amd64 entry's id);
    only groups of two or more platforms: one platform's image needs no index."""
    groups: dict[str, list[Entry]] = {}
    for entry in entries:
        suffix = tag_suffix(entry.platform)
        shared = entry.id.removesuffix(suffix) if suffix else entry.id
        groups.setdefault(shared, []).append(entry)
    return {
        key: sorted(members, key=lambda e: e.platform)
        for key, members in groups.items()
        if len({e.platform for e in members}) > 1
    }


def index_document(children: list[Child]) -> tuple[bytes, str]:
    """The index's exact bytes and media type: Docker's manifest list over Docker manifests
    (what `docker push` makes), else an OCI index; children in platform order."""
    ordered = sorted(children, key=lambda c: c.platform)
    docker = all(c.media_type == DOCKER_MANIFEST for c in ordered)
    media_type = DOCKER_MANIFEST_LIST if docker else OCI_INDEX
    manifests: list[dict[str, Any]] = []
    for child in ordered:
        platform = {"architecture": architecture(child.platform), "os": "linux"}
        if platform["architecture"] == "arm64":
            platform["variant"] = "v8"
        manifests.append(
            {"mediaType": child.media_type, "digest": child.digest, "size": child.size,
             "platform": platform}
        )  # fmt: skip
    document = {"schemaVersion": 2, "mediaType": media_type, "manifests": manifests}
    return json.dumps(document, separators=(",", ":")).encode(), media_type


def publish_index(
    client: RegistryClient,
    registry: str,
    *,
    name: str,
    tag: str,
    children: list[Child],
    moving: tuple[str, ...],
) -> IndexPublished:
    """Push the index over `children` under `tag`-<digest of its children> (immutable: the same
    children give the same tag and bytes), then move the `moving` tags to it; each read back."""
    host, prefix = split_registry(registry)
    repository = f"{prefix}/{name}" if prefix else name
    body, media_type = index_document(children)
    named = hashlib.sha256("\n".join(c.digest for c in children).encode()).hexdigest()
    where = Target(
        host=host, repository=repository, tag=tag, immutable=f"{tag}-{named[:HASH_LENGTH]}"
    )
    digest = f"sha256:{hashlib.sha256(body).hexdigest()}"
    with client.operation():
        try:
            held = client.manifest_digest(repository, where.immutable)
        except RegistryNotFound:
            held = None
        if held is not None and held != digest:
            msg = (
                f"refusing to publish the index {where.reference}: the tag names {held}, not "
                f"the index over these platforms' images ({digest}); an immutable tag is "
                "never overwritten"
            )
            raise EnvbuildError(msg)
        for reference in (where.immutable, *moving):
            pushed, _ = client.put_manifest(repository, reference, body, media_type)
            if client.manifest_digest(repository, reference) != pushed:
                msg = f"{host}/{repository}:{reference}: the registry does not hold the index {pushed} after the push"
                raise EnvbuildError(msg)
    return IndexPublished(
        host=host, repository=repository, reference=where.reference, digest=digest,
        tags=moving, children=tuple(children),
    )  # fmt: skip


def shared_tag(entries: list[Entry]) -> tuple[str, str]:
    """(repository name, tag) the index takes: the amd64 entry's image's, or the first entry's
    without its platform suffix."""
    first = next((e for e in entries if e.platform == AMD64), entries[0])
    path, _, tag = first.image.rpartition(":")
    suffix = tag_suffix(first.platform)
    return path.rsplit("/", 1)[-1], tag.removesuffix(suffix) if suffix else tag


def index_children(
    client: RegistryClient, registry: str, members: list[tuple[Entry, str]]
) -> list[Child]:
    """Each member's published image (entry, content hash) as the registry holds it under its
    immutable tag; EnvbuildError naming the platform whose image is not there."""
    children = []
    for entry, content_hash in members:
        where = entry_target(registry, entry.image, content_hash)
        try:
            body, media_type, digest = client.manifest_raw(where.repository, where.immutable)
        except RegistryNotFound:
            msg = (
                f"not publishing one tag for {entry.id.removesuffix(tag_suffix(entry.platform))}: "
                f"the registry has no {entry.platform} image ({where.reference})"
            )
            raise EnvbuildError(msg) from None
        children.append(
            Child(platform=entry.platform, digest=digest, media_type=media_type, size=len(body))
        )
    return children
