"""The OCI distribution API of one registry: manifests, referrers and blobs.

It reads the digest a registry holds for a tag (what `publish` compares with the local image),
pushes blobs and manifests, and lists the referrers of an image (its evidence artifacts).
Every content read is checked against its digest.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import urljoin

from envbuild.net.bounded import (
    BLOB_LIMIT,
    MANIFEST_LIMIT,
    MAX_PAGES,
    Reply,
    is_downgrade,
    origin,
    origin_text,
    printable,
    same_origin,
)
from envbuild.registry.connection import RegistryConnection, bounded
from envbuild.registry.content import (
    MANIFEST_ACCEPT,
    OCI_INDEX,
    json_or_none,
    manifest_bytes,
    sha256,
    verify,
)
from envbuild.registry.errors import DigestMismatch, RegistryError
from envbuild.registry.reference import is_digest

log = logging.getLogger(__name__)

MAX_REFERRERS = 1000


class RegistryClient(RegistryConnection):
    """The OCI distribution API of one registry host, with auth, retries and bounds.

    Each public method is one operation with one deadline (`deadline` seconds for connecting,
    retrying and reading, together); `operation()` groups several calls under one. A client is
    for one thread at a time.
    """

    # Manifests.

    @bounded
    def manifest_digest(self, repository: str, reference: str) -> str:
        """The digest the registry holds for repository:reference (HEAD, else GET)."""
        what = self.name(repository, reference)
        reply = self._request(
            "HEAD",
            repository,
            f"manifests/{reference}",
            what=what,
            headers={"Accept": MANIFEST_ACCEPT},
            ok=(200, 400, 404, 405),
        )
        digest = reply.headers.get("Docker-Content-Digest")
        if reply.status == 200 and digest:
            self.check_digest_header(digest, what)
            if is_digest(reference) and digest != reference:
                msg = f"{what}: the registry reports digest {digest}"
                raise DigestMismatch(msg)
            return digest
        # No header, or HEAD unsupported or refused: GET says why, with an error body.
        return self.get_manifest(repository, reference)[2]

    @bounded
    def manifest_raw(self, repository: str, reference: str) -> tuple[bytes, str, str]:
        """The manifest's exact bytes, its Content-Type and its (verified) digest."""
        what = self.name(repository, reference)
        reply = self._request(
            "GET",
            repository,
            f"manifests/{reference}",
            what=what,
            headers={"Accept": MANIFEST_ACCEPT},
            limit=MANIFEST_LIMIT,
        )
        body = reply.body
        if is_digest(reference):
            digest = reference
        else:
            digest = reply.headers.get("Docker-Content-Digest") or sha256(body)
            self.check_digest_header(digest, what)
        verify(body, digest, what)
        content_type = reply.headers.get("Content-Type", "").split(";")[0].strip()
        return body, printable(content_type, 100), digest

    @bounded
    def get_manifest(self, repository: str, reference: str) -> tuple[dict[str, Any], str, str]:
        """The manifest (parsed JSON), its media type and its digest."""
        what = self.name(repository, reference)
        body, content_type, digest = self.manifest_raw(repository, reference)
        manifest = json_or_none(body)
        if not isinstance(manifest, dict):
            raise self.malformed(what, kind="manifest", why="not a JSON object")
        media_type = manifest.get("mediaType") or content_type
        if not isinstance(media_type, str):
            raise self.malformed(what, kind="manifest", why="mediaType is not a string")
        return manifest, media_type, digest

    @bounded
    def push_manifest(
        self,
        repository: str,
        reference: str,
        manifest: Mapping[str, Any] | bytes,
        media_type: str,
    ) -> str:
        """PUT a manifest at a tag or digest; returns its digest (checked with the registry's)."""
        return self.put_manifest(repository, reference, manifest_bytes(manifest), media_type)[0]

    @bounded
    def put_manifest(
        self, repository: str, reference: str, body: bytes, media_type: str
    ) -> tuple[str, Reply]:
        """PUT a manifest's exact bytes; its digest and the registry's answer (headers kept)."""
        digest = sha256(body)
        what = self.name(repository, reference)
        if is_digest(reference) and reference != digest:
            msg = f"cannot push {what}: the manifest's digest is {digest}"
            raise DigestMismatch(msg)
        reply = self._request(
            "PUT",
            repository,
            f"manifests/{reference}",
            what=what,
            headers={"Content-Type": media_type},
            data=body,
            ok=(200, 201, 202),
        )
        stored = reply.headers.get("Docker-Content-Digest")
        if stored and stored != digest:
            msg = (
                f"{what}: the registry stored digest {printable(stored, 100)} for a manifest "
                f"whose digest is {digest}"
            )
            raise DigestMismatch(msg)
        log.info("pushed %s (%s)", what, digest)
        return digest, reply

    @bounded
    def delete_manifest(self, repository: str, digest: str) -> bool:
        """Delete a manifest by digest, best effort (cleanup); True when the registry did."""
        try:
            self._request(
                "DELETE",
                repository,
                f"manifests/{digest}",
                what=self.name(repository, digest),
                ok=(200, 202),
            )
        except RegistryError as exc:
            log.warning("could not delete %s: %s", self.name(repository, digest), exc.message)
            return False
        return True

    @bounded
    def referrers(
        self, repository: str, digest: str, artifact_type: str | None = None
    ) -> list[dict[str, Any]] | None:
        """Descriptors of manifests whose subject is `digest`; None without a referrers API.

        Pages (Link rel="next") are followed on the registry's own origin only, at most
        MAX_PAGES of them, never one twice.
        """
        what = f"referrers of {self.name(repository, digest)}"
        params = {"artifactType": artifact_type} if artifact_type else None
        url = self._url(repository, f"referrers/{digest}")
        read: set[str] = set()
        found: list[dict[str, Any]] = []
        for page in range(MAX_PAGES):
            reply = self._request(
                "GET",
                repository,
                "",
                url=url,
                what=what,
                headers={"Accept": OCI_INDEX},
                params=params,
                ok=(200, 404),
                limit=MANIFEST_LIMIT,
            )
            index = json_or_none(reply.body)
            if not isinstance(index, dict) or not isinstance(index.get("manifests"), list):
                if reply.status == 404 and page == 0:
                    return None  # distribution 2.x: no such route, a text/plain 404
                raise self.malformed(what, kind="referrers index", why="not an image index")
            for item in index["manifests"]:
                descriptor = self.descriptor(item, what, kind="referrers index")
                # Registries need not apply the filter (OCI-Filters-Applied): do it here.
                if artifact_type is None or descriptor.get("artifactType") == artifact_type:
                    found.append(descriptor)
            if len(found) > MAX_REFERRERS:
                msg = (
                    f"registry {self.host} lists more than {MAX_REFERRERS} {what}; envbuild "
                    "reads no further: delete old artifacts, or the registry is broken"
                )
                raise RegistryError(msg)
            read.add(reply.url)
            if reply.next_url is None:
                return found
            if not same_origin(reply.next_url, self.base_url):
                msg = (
                    f"registry {self.host} continues {what} at another origin "
                    f"({origin_text(reply.next_url)}); envbuild follows pages only on the "
                    "registry itself"
                )
                raise RegistryError(msg)
            if reply.next_url in read:
                msg = (
                    f"registry {self.host}: the pages of {what} link back to a page already "
                    "read; its pagination loops"
                )
                raise RegistryError(msg)
            url, params = reply.next_url, None  # the next link carries the query
        msg = (
            f"registry {self.host} sent more than {MAX_PAGES} pages of {what}; envbuild reads "
            "no further: its pagination loops, or delete old artifacts"
        )
        raise RegistryError(msg)

    # Blobs.

    @bounded
    def blob_exists(self, repository: str, digest: str) -> bool:
        """True when the repository already holds the blob."""
        reply = self._request(
            "HEAD",
            repository,
            f"blobs/{digest}",
            what=self.name(repository, digest),
            ok=(200, 404),
        )
        return reply.status == 200

    @bounded
    def push_blob(self, repository: str, data: bytes, media_type: str) -> dict[str, Any]:
        """Upload `data` in one PUT unless the repository has it; returns its descriptor."""
        digest = sha256(data)
        descriptor: dict[str, Any] = {"mediaType": media_type, "digest": digest, "size": len(data)}
        if self.blob_exists(repository, digest):
            log.debug("blob %s already in %s", digest, repository)
            return descriptor
        what = f"blob upload to {self.host}/{repository}"
        started = self._request(
            "POST",
            repository,
            "blobs/uploads/",
            what=what,
            headers={"Content-Length": "0"},
            ok=(202,),
        )
        location = started.headers.get("Location")
        target = urljoin(started.url, location) if location else ""
        if origin(target) is None or is_downgrade(self.base_url, target):
            raise self.malformed(
                what, kind="upload location", why="not an http(s) URL on its origin"
            )
        reply = self._request(
            "PUT",
            repository,
            "",
            url=target,
            what=what,
            headers={"Content-Type": "application/octet-stream"},
            params={"digest": digest},
            data=data,
            ok=(201, 204),
        )
        stored = reply.headers.get("Docker-Content-Digest")
        if stored and stored != digest:
            msg = (
                f"{what}: the registry stored digest {printable(stored, 100)} for a blob whose "
                f"digest is {digest}"
            )
            raise DigestMismatch(msg)
        return descriptor

    @bounded
    def get_blob(self, repository: str, digest: str, *, limit: int = BLOB_LIMIT) -> bytes:
        """The blob's bytes (at most `limit` of them), checked against its digest."""
        what = self.name(repository, digest)
        data = self._request("GET", repository, f"blobs/{digest}", what=what, limit=limit).body
        verify(data, digest, what)
        return data
