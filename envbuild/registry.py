"""Registry v2 HTTP client: references, credentials, manifests, blobs and evidence artifacts.

Talks the OCI distribution API over requests: it reads the digest a registry holds for a tag
(what `publish` compares with the local image), pushes blobs and manifests, and keeps an
image's evidence (smoke report, package list) next to it as an OCI 1.1 artifact whose
`subject` is the image, found again through the referrers API or, on registries without one,
the referrers tag schema (`sha256-<hex>` image index).

Credentials (envbuild.credentials) are never logged, never appear in messages or reprs,
and go only to the registry's own origin or its token service, over https (or loopback).
Every operation is bounded (envbuild.http_limits): body sizes, redirects, pages, retries and a
total deadline, so a broken or hostile registry ends in one clear error, never a hang.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import urlencode, urljoin

import requests

from envbuild.credentials import (
    PASSWORD_ENV,
    USERNAME_ENV,
    Credentials,
    docker_auth_config,
    lookup_credentials,
)
from envbuild.errors import BadInput, EnvbuildError
from envbuild.http_limits import (
    BLOB_LIMIT,
    MANIFEST_LIMIT,
    MAX_PAGES,
    SMALL_LIMIT,
    TOKEN_LIMIT,
    BodyTooLarge,
    Deadline,
    DeadlineExceeded,
    Overloaded,
    ReadFailed,
    RedirectRefused,
    Reply,
    TlsFailed,
    Transport,
    Unreachable,
    close_quietly,
    is_downgrade,
    is_loopback,
    origin,
    origin_text,
    printable,
    read_reply,
    safe_for_credentials,
    same_origin,
    watched,
    watched_session,
)

__all__ = [  # the credentials API lived here first; callers still import it from here
    "PASSWORD_ENV",
    "USERNAME_ENV",
    "Credentials",
    "docker_auth_config",
    "lookup_credentials",
]

log = logging.getLogger(__name__)

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_EMPTY = "application/vnd.oci.empty.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_MANIFEST_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_MEDIA_TYPES = (OCI_INDEX, OCI_MANIFEST, DOCKER_MANIFEST_LIST, DOCKER_MANIFEST)
EVIDENCE_ARTIFACT_TYPE = "application/vnd.envbuild.evidence.v1+json"
TITLE_ANNOTATION = "org.opencontainers.image.title"
CREATED_ANNOTATION = "org.opencontainers.image.created"
DEADLINE_ENV = "ENVBUILD_REGISTRY_TIMEOUT"
DEFAULT_DEADLINE = 120.0  # seconds per registry operation (connecting, retries, reading: all)
MAX_REFERRERS = 1000

_MANIFEST_ACCEPT = ", ".join(MANIFEST_MEDIA_TYPES)
_USER_AGENT = "envbuild-registry-client"
_EMPTY_CONFIG = b"{}"
# Docker's reference grammar (distribution/reference), without the Docker Hub defaults.
_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}")
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::\d+)?")
_CHALLENGE_PARAM = re.compile(r'(\w+)=(?:"([^"]*)"|([^\s,]*))')
_HASHES = {"sha256": hashlib.sha256, "sha512": hashlib.sha512}
_MAX_TOKEN_CHARS = 16 * 1024
_TOKEN = re.compile(r"[\x21-\x7e]+")  # what may follow "Bearer " in a header
_FIX_LOGIN = f"log in with `docker login {{host}}` or set {USERNAME_ENV} and {PASSWORD_ENV}"


class RegistryError(EnvbuildError):
    """A registry could not be used for what envbuild asked of it."""


class RegistryUnreachable(RegistryError):
    """The registry could not be reached, or kept failing, after retries."""


class RegistryAuthError(RegistryError):
    """The registry wants credentials envbuild does not have, or refused the ones it has."""


class RegistryNotFound(RegistryError):
    """The repository, manifest or blob does not exist on the registry."""


class RegistryRejected(RegistryError):
    """The registry answered a request with an error that retrying will not fix."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class DigestMismatch(RegistryError):
    """Content read from (or stored by) the registry does not match its digest."""


class RegistryMalformed(RegistryError):
    """The registry answered something that is not what the API (or envbuild) puts there."""


class EvidenceNotFound(RegistryNotFound):
    """No evidence artifact refers to the image."""


class BadReference(BadInput):
    """An image reference cannot be used with a registry."""


# -- references ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class RegistryRef:
    """An image reference split for the registry API: host, repository, tag and/or digest."""

    host: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What goes after /manifests/: the digest when there is one, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        text = f"{self.host}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_reference(text: str) -> RegistryRef:
    """Split HOST[:PORT]/REPOSITORY[:TAG][@DIGEST]; a missing tag and digest mean `latest`."""
    name, _, digest = text.strip().partition("@")
    if digest and not _DIGEST.fullmatch(digest):
        msg = f"image reference {text!r}: {digest!r} is not a digest (expected sha256:<64 hex>)"
        raise BadReference(msg)
    host, slash, path = name.partition("/")
    if not slash or not _looks_like_host(host):
        msg = (
            f"image reference {text!r} names no registry host; Docker Hub shorthand is not "
            "supported, write the registry out, e.g. registry.example.com/team/torch:2.4 or "
            "127.0.0.1:5000/team/torch:2.4"
        )
        raise BadReference(msg)
    if not _HOST.fullmatch(host):
        msg = f"image reference {text!r}: {host!r} is not a registry host[:port]"
        raise BadReference(msg)
    repository, tag = path, ""
    last = path.rsplit("/", 1)[-1]
    if ":" in last:
        repository, _, tag = path.rpartition(":")
        if not _TAG.fullmatch(tag):
            msg = f"image reference {text!r}: {tag!r} is not a valid tag"
            raise BadReference(msg)
    components = repository.split("/")
    if not all(_PATH_COMPONENT.fullmatch(c) for c in components):
        msg = (
            f"image reference {text!r}: repository {repository!r} is not valid; use lowercase "
            "letters, digits and separators (. _ __ -) between /-separated parts"
        )
        raise BadReference(msg)
    return RegistryRef(
        host=host,
        repository=repository,
        tag=tag or (None if digest else "latest"),
        digest=digest or None,
    )


def _looks_like_host(component: str) -> bool:
    # Docker's rule: the first component is a registry when it has a dot, a port or is localhost.
    return "." in component or ":" in component or component == "localhost"


def default_scheme(host: str) -> str:
    """Plain http for loopback registries (as Docker allows), https for every other one."""
    return "http" if is_loopback(host) else "https"


# -- the client ---------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Challenge:
    scheme: str  # "basic" or "bearer"
    params: dict[str, str]


def _parse_challenge(header: str) -> _Challenge | None:
    scheme, _, rest = header.strip().partition(" ")
    if not scheme:
        return None
    params = {
        m.group(1).lower(): m.group(2) or m.group(3) or "" for m in _CHALLENGE_PARAM.finditer(rest)
    }
    return _Challenge(scheme=scheme.lower(), params=params)


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _bounded(
    method: Callable[Concatenate[RegistryClient, _P], _R],
) -> Callable[Concatenate[RegistryClient, _P], _R]:
    """Run a client method under one deadline: the caller's operation when one is open."""

    @functools.wraps(method)
    def wrapper(self: RegistryClient, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self.operation():
            return method(self, *args, **kwargs)

    return wrapper


def deadline_from_env(environ: Mapping[str, str] | None = None) -> float:
    """Seconds per registry operation: ENVBUILD_REGISTRY_TIMEOUT, else the default."""
    env = os.environ if environ is None else environ
    text = env.get(DEADLINE_ENV, "").strip()
    if not text:
        return DEFAULT_DEADLINE
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= 86400:
        msg = (
            f"{DEADLINE_ENV}={printable(text, 40)!r} is not a number of seconds; "
            f"set it to e.g. {DEFAULT_DEADLINE:g}, or unset it"
        )
        raise BadInput(msg)
    return seconds


class RegistryClient:
    """The OCI distribution API of one registry host, with auth, retries and bounds.

    Each public method is one operation with one deadline (`deadline` seconds for connecting,
    retrying and reading, together); `operation()` groups several calls under one. A client is
    for one thread at a time.
    """

    def __init__(
        self,
        host: str,
        *,
        credentials: Credentials | None,
        session: requests.Session | None = None,
        scheme: str | None = None,
        tries: int = 4,
        backoff: float = 0.5,
        deadline: float = DEFAULT_DEADLINE,
    ) -> None:
        self.host = host
        self.scheme = scheme or default_scheme(host)
        self.base_url = f"{self.scheme}://{host}"
        self._credentials = credentials
        self._owns_session = session is None
        # A session of the caller's keeps its adapters: its requests are bounded by timeouts and
        # checks between reads, but not cut off inside one read (see http_limits.watched).
        self.session = watched_session() if session is None else session
        self.transport = Transport(self.session, tries=tries, backoff=backoff)
        self.deadline = deadline
        self._basic = False  # the registry asked for HTTP Basic once: send it pre-emptively
        self._tokens: dict[str, str] = {}  # repository -> bearer token last granted for it
        self._operation: Deadline | None = None

    @classmethod
    def for_host(cls, host: str, *, session: requests.Session | None = None) -> RegistryClient:
        """A client for `host` with the credentials lookup_credentials finds and the deadline
        ENVBUILD_REGISTRY_TIMEOUT sets."""
        return cls(
            host,
            credentials=lookup_credentials(host),
            session=session,
            deadline=deadline_from_env(),
        )

    def __repr__(self) -> str:
        return (
            f"RegistryClient(host={self.host!r}, scheme={self.scheme!r}, "
            f"authenticated={self._credentials is not None})"
        )

    def close(self) -> None:
        """Close the HTTP session if this client made it."""
        if self._owns_session:
            self.session.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextlib.contextmanager
    def operation(self) -> Iterator[Deadline]:
        """Run the calls inside under one deadline (nested operations share the outer one)."""
        if self._operation is not None:
            yield self._operation
            return
        self._operation = Deadline(self.deadline)
        try:
            with watched(self._operation):
                yield self._operation
        finally:
            self._operation = None

    # -- manifests ------------------------------------------------------------

    @_bounded
    def manifest_digest(self, repository: str, reference: str) -> str:
        """The digest the registry holds for repository:reference (HEAD, else GET)."""
        what = self.name(repository, reference)
        reply = self._request(
            "HEAD",
            repository,
            f"manifests/{reference}",
            what=what,
            headers={"Accept": _MANIFEST_ACCEPT},
            ok=(200, 400, 404, 405),
        )
        digest = reply.headers.get("Docker-Content-Digest")
        if reply.status == 200 and digest:
            self._check_digest_header(digest, what)
            if _is_digest(reference) and digest != reference:
                msg = f"{what}: the registry reports digest {digest}"
                raise DigestMismatch(msg)
            return digest
        # No header, or HEAD unsupported or refused: GET says why, with an error body.
        return self.get_manifest(repository, reference)[2]

    @_bounded
    def manifest_raw(self, repository: str, reference: str) -> tuple[bytes, str, str]:
        """The manifest's exact bytes, its Content-Type and its (verified) digest."""
        what = self.name(repository, reference)
        reply = self._request(
            "GET",
            repository,
            f"manifests/{reference}",
            what=what,
            headers={"Accept": _MANIFEST_ACCEPT},
            limit=MANIFEST_LIMIT,
        )
        body = reply.body
        if _is_digest(reference):
            digest = reference
        else:
            digest = reply.headers.get("Docker-Content-Digest") or _sha256(body)
            self._check_digest_header(digest, what)
        _verify(body, digest, what)
        content_type = reply.headers.get("Content-Type", "").split(";")[0].strip()
        return body, printable(content_type, 100), digest

    @_bounded
    def get_manifest(self, repository: str, reference: str) -> tuple[dict[str, Any], str, str]:
        """The manifest (parsed JSON), its media type and its digest."""
        what = self.name(repository, reference)
        body, content_type, digest = self.manifest_raw(repository, reference)
        manifest = _json_or_none(body)
        if not isinstance(manifest, dict):
            raise self.malformed(what, kind="manifest", why="not a JSON object")
        media_type = manifest.get("mediaType") or content_type
        if not isinstance(media_type, str):
            raise self.malformed(what, kind="manifest", why="mediaType is not a string")
        return manifest, media_type, digest

    @_bounded
    def push_manifest(
        self,
        repository: str,
        reference: str,
        manifest: Mapping[str, Any] | bytes,
        media_type: str,
    ) -> str:
        """PUT a manifest at a tag or digest; returns its digest (checked with the registry's)."""
        return self._put_manifest(repository, reference, _manifest_bytes(manifest), media_type)[0]

    @_bounded
    def _put_manifest(
        self, repository: str, reference: str, body: bytes, media_type: str
    ) -> tuple[str, Reply]:
        digest = _sha256(body)
        what = self.name(repository, reference)
        if _is_digest(reference) and reference != digest:
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

    @_bounded
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

    @_bounded
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
            index = _json_or_none(reply.body)
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

    # -- blobs ----------------------------------------------------------------

    @_bounded
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

    @_bounded
    def push_blob(self, repository: str, data: bytes, media_type: str) -> dict[str, Any]:
        """Upload `data` in one PUT unless the repository has it; returns its descriptor."""
        digest = _sha256(data)
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

    @_bounded
    def get_blob(self, repository: str, digest: str, *, limit: int = BLOB_LIMIT) -> bytes:
        """The blob's bytes (at most `limit` of them), checked against its digest."""
        what = self.name(repository, digest)
        data = self._request("GET", repository, f"blobs/{digest}", what=what, limit=limit).body
        _verify(data, digest, what)
        return data

    # -- what the registry answered ---------------------------------------------

    def malformed(self, what: str, *, kind: str, why: str) -> RegistryMalformed:
        """The one-line error for an answer that does not have the shape the API gives it."""
        msg = (
            f"registry {self.host} returned a malformed {kind} for {what} ({why}); "
            "it is not a conforming OCI registry, or the content is damaged"
        )
        return RegistryMalformed(msg)

    def descriptor(self, item: object, what: str, *, kind: str) -> dict[str, Any]:
        """A descriptor whose fields envbuild reads have the types the spec gives them."""
        if not isinstance(item, dict):
            raise self.malformed(what, kind=kind, why="a descriptor is not a JSON object")
        if not isinstance(item.get("digest"), str) or not _is_digest(item["digest"]):
            raise self.malformed(what, kind=kind, why="a descriptor's digest is not a digest")
        for key in ("mediaType", "artifactType"):
            if key in item and not isinstance(item[key], str):
                raise self.malformed(what, kind=kind, why=f"a descriptor's {key} is not a string")
        size = item.get("size", 0)
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise self.malformed(what, kind=kind, why="a descriptor's size is not a byte count")
        annotations = item.get("annotations", {})
        if not isinstance(annotations, dict) or not all(
            isinstance(v, str) for v in annotations.values()
        ):
            raise self.malformed(what, kind=kind, why="a descriptor's annotations are not strings")
        return item

    def _check_digest_header(self, digest: str, what: str) -> None:
        if not _is_digest(digest):
            raise self.malformed(what, kind="Docker-Content-Digest header", why="not a digest")

    # -- HTTP -----------------------------------------------------------------

    def name(self, repository: str, reference: str) -> str:
        """host/repository:tag or host/repository@digest, as messages show it."""
        sep = "@" if _is_digest(reference) else ":"
        return f"{self.host}/{repository}{sep}{reference}"

    def _url(self, repository: str, path: str) -> str:
        return f"{self.base_url}/v2/{repository}/{path}"

    def _deadline(self) -> Deadline:
        return self._operation or Deadline(self.deadline)

    def _request(
        self,
        method: str,
        repository: str,
        path: str,
        *,
        what: str,
        url: str | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        data: bytes | None = None,
        ok: Collection[int] = (200,),
        limit: int = SMALL_LIMIT,
    ) -> Reply:
        """Send with auth (one challenge answered per request), retries and redirects; read at
        most `limit` bytes of an answer in `ok`; raise on anything else."""
        target = url or self._url(repository, path)
        authenticated_now = False
        while True:
            response = self._exchange(
                method,
                target,
                what=what,
                headers=headers,
                params=params,
                data=data,
                authorization=self._authorization(repository),
                credentials_origin=self.base_url,
            )
            status = response.status_code
            if status in ok:
                return self._read(response, what, limit)
            # Only the registry's own challenge is answered: never one from a redirect target.
            if status == 401 and not authenticated_now and same_origin(response.url, self.base_url):
                challenge = response.headers.get("WWW-Authenticate", "")
                self._read(response, what, SMALL_LIMIT, truncate=True)  # keeps the connection
                self._authenticate(challenge, repository, what)
                authenticated_now = True
                continue
            error = self._read(response, what, SMALL_LIMIT, truncate=True)
            raise self._error(error, method, repository, what)

    def _exchange(
        self,
        method: str,
        url: str,
        *,
        what: str,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
        data: bytes | None = None,
        authorization: str | None = None,
        credentials_origin: str | None = None,
    ) -> requests.Response:
        """Transport.exchange within the operation's deadline, its failures as one-line errors
        naming the registry; the body is left unread (see `_read`)."""
        deadline = self._deadline()
        try:
            return self.transport.exchange(
                method,
                url,
                deadline=deadline,
                headers={"User-Agent": _USER_AGENT, **(headers or {})},
                params=params,
                data=data,
                authorization=authorization,
                credentials_origin=credentials_origin,
            )
        except TlsFailed as exc:
            msg = (
                f"cannot reach registry {self.host} for {what}: TLS verification failed "
                f"({exc.cause}); set REQUESTS_CA_BUNDLE to the CA bundle that signs it"
            )
        except Unreachable as exc:
            msg = (
                f"cannot reach registry {self.host} for {what} after {_tries(exc.tries)} "
                f"({exc.cause}); check that it runs and that the host:port is right"
            )
        except Overloaded as exc:
            msg = (
                f"registry {self.host} answered HTTP {exc.status} to {what} "
                f"({_tries(exc.tries)}); it is failing or overloaded, try again later"
            )
        except RedirectRefused as exc:
            msg = f"registry {self.host} redirected {what} {exc.why}; envbuild does not follow it"
            raise RegistryError(msg) from None
        except DeadlineExceeded:
            raise self._too_slow(what, deadline) from None
        raise RegistryUnreachable(msg) from None

    def _read(
        self, response: requests.Response, what: str, limit: int, *, truncate: bool = False
    ) -> Reply:
        """The response with its body read within `limit` and the operation's deadline."""
        deadline = self._deadline()
        try:
            return read_reply(response, limit=limit, deadline=deadline, truncate=truncate)
        except BodyTooLarge as exc:
            msg = (
                f"registry {self.host} sent more than {_size(exc.limit)} for {what}, the most "
                "envbuild accepts there; the registry is broken or hostile"
            )
            raise RegistryError(msg) from None
        except DeadlineExceeded:
            raise self._too_slow(what, deadline) from None
        except ReadFailed as exc:
            if deadline.remaining() <= 0:
                raise self._too_slow(what, deadline) from None
            msg = f"registry {self.host} broke off sending {what} ({exc.cause}); try again later"
            raise RegistryUnreachable(msg) from None

    def _too_slow(self, what: str, deadline: Deadline) -> RegistryUnreachable:
        msg = (
            f"registry {self.host} did not complete {what} within {deadline.seconds:g} s; it "
            f"is not answering or too slow: try again later, or set {DEADLINE_ENV} to more seconds"
        )
        return RegistryUnreachable(msg)

    def _authorization(self, repository: str) -> str | None:
        token = self._tokens.get(repository)
        if token:
            return f"Bearer {token}"
        if self._basic and self._credentials is not None:
            return _basic_header(self._credentials)
        return None

    def _authenticate(self, header: str, repository: str, what: str) -> None:
        """Answer a 401's WWW-Authenticate challenge: Basic, or a Bearer token from the realm."""
        challenge = _parse_challenge(header)
        if challenge is None or challenge.scheme not in ("basic", "bearer"):
            raise self._auth_error(401, what)
        if challenge.scheme == "basic":
            if self._credentials is None or self._credentials.identity_token:
                raise self._auth_error(401, what)
            self._basic = True
            self._tokens.pop(repository, None)
            return
        realm = challenge.params.get("realm")
        if not realm or origin(realm) is None:
            why = f"its realm '{printable(realm or '', 80)}' is not an http(s) URL"
            raise self.malformed(what, kind="bearer challenge", why=why)
        if not safe_for_credentials(realm):
            msg = (
                f"registry {self.host} asks for a token from {origin_text(realm)}, which is "
                "plain http off this machine; envbuild fetches tokens only over https (or from "
                "loopback) so that no credentials travel in clear text: fix the registry's realm"
            )
            raise RegistryAuthError(msg)
        scope = challenge.params.get("scope") or (
            f"repository:{repository}:pull" if repository else ""
        )
        service = challenge.params.get("service")
        self._tokens[repository] = self._fetch_token(realm, service, scope, what)

    def _fetch_token(self, realm: str, service: str | None, scope: str, for_what: str) -> str:
        token_service = origin_text(realm)
        what = f"a token from {token_service} for {for_what}"
        credentials = self._credentials
        if credentials is not None and credentials.identity_token:
            form = {
                "grant_type": "refresh_token",
                "refresh_token": credentials.identity_token,
                "client_id": "envbuild",
                **({"service": service} if service else {}),
                **({"scope": scope} if scope else {}),
            }
            response = self._exchange(
                "POST",
                realm,
                what=what,
                headers={"Content-Type": "application/x-www-form-urlencoded"},
                data=urlencode(form).encode("ascii"),  # a secret: never redirected elsewhere
            )
        else:
            response = self._exchange(
                "GET",
                realm,
                what=what,
                params={k: v for k, v in (("service", service), ("scope", scope)) if v},
                authorization=_basic_header(credentials) if credentials else None,
                credentials_origin=realm,
            )
        status = response.status_code
        if status != 200:
            close_quietly(response)
            if status in (401, 403):
                raise self._auth_error(status, for_what, token_service=token_service)
            msg = f"registry {self.host}: {what} failed with HTTP {status}"
            raise RegistryError(msg)
        data = _json_or_none(self._read(response, what, TOKEN_LIMIT).body)
        if not isinstance(data, dict):
            raise self.malformed(for_what, kind="token answer", why="not a JSON object")
        token = data.get("token") or data.get("access_token")
        if not isinstance(token, str) or not token:
            raise self.malformed(for_what, kind="token answer", why="it holds no token")
        if len(token) > _MAX_TOKEN_CHARS or not _TOKEN.fullmatch(token):
            raise self.malformed(
                for_what, kind="token answer", why="the token is not header-safe text"
            )
        return token

    def _auth_error(
        self, status: int, what: str, *, token_service: str | None = None
    ) -> RegistryAuthError:
        fix = _FIX_LOGIN.format(host=self.host)
        credentials = self._credentials
        if credentials is None:
            msg = f"registry {self.host} requires authentication for {what} (HTTP {status}); {fix}"
        elif status == 403 and token_service is None:
            msg = (
                f"registry {self.host} denied {what} to the credentials from "
                f"{credentials.source} (HTTP 403); use an account with access to it, or {fix}"
            )
        else:
            where = f" at its token service {token_service}" if token_service else ""
            msg = (
                f"registry {self.host} rejected the credentials from {credentials.source} "
                f"for {what} (HTTP {status}{where}); {fix}"
            )
        return RegistryAuthError(msg)

    def _error(self, reply: Reply, method: str, repository: str, what: str) -> RegistryError:
        status = reply.status
        if not same_origin(reply.url, self.base_url):
            msg = (
                f"registry {self.host} redirected {what} to {origin_text(reply.url)}, which "
                f"answered HTTP {status}"
            )
            return RegistryRejected(msg, status=status)
        codes = _error_codes(reply.body)
        if status in (401, 403):
            return self._auth_error(status, what)
        if status == 404 or {"NAME_UNKNOWN", "MANIFEST_UNKNOWN", "BLOB_UNKNOWN"} & set(codes):
            if "NAME_UNKNOWN" in codes:
                msg = (
                    f"repository {self.host}/{repository} does not exist (looking for {what}); "
                    "check the repository name"
                )
            elif "MANIFEST_UNKNOWN" in codes:
                msg = f"{what} does not exist on the registry; check the repository name and tag"
            elif "BLOB_UNKNOWN" in codes:
                msg = f"{what}: the registry has no such blob"
            else:
                msg = f"{what} was not found (HTTP 404); is {self.host} a registry (OCI v2 API)?"
            return RegistryNotFound(msg)
        detail = printable("; ".join(f"{code}: {message}" for code, message in codes.items()), 300)
        msg = f"registry {self.host} refused {method} {what} with HTTP {status}" + (
            f" ({detail})" if detail else ""
        )
        return RegistryRejected(msg, status=status)


def _basic_header(credentials: Credentials) -> str:
    raw = f"{credentials.username}:{credentials.password}".encode()
    return "Basic " + base64.b64encode(raw).decode("ascii")


def _error_codes(body: bytes) -> dict[str, str]:
    """OCI error codes and messages of an error body ({"errors": [{"code", "message"}]})."""
    data = _json_or_none(body)
    errors = data.get("errors") if isinstance(data, dict) else None
    if not isinstance(errors, list):
        return {}
    return {
        printable(e.get("code"), 60): printable(" ".join(str(e.get("message", "")).split()))
        for e in errors[:20]
        if isinstance(e, dict)
    }


def _json_or_none(body: bytes | str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past the C stack
        return None


def _manifest_bytes(manifest: Mapping[str, Any] | bytes) -> bytes:
    if isinstance(manifest, bytes):
        return manifest
    return json.dumps(manifest, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _is_digest(reference: str) -> bool:
    return bool(_DIGEST.fullmatch(reference))


def _verify(data: bytes, digest: str, what: str) -> None:
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


def _tries(count: int) -> str:
    return "1 try" if count == 1 else f"{count} tries"


def _size(count: int) -> str:
    for unit, scale in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if count >= scale:
            return f"{count / scale:g} {unit}"
    return f"{count} bytes"
