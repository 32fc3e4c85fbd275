"""Registry v2 HTTP client: references, credentials, manifests, blobs and evidence artifacts.

Talks the OCI distribution API over requests: it reads the digest a registry holds for a tag
(what `publish` compares with the local image), pushes blobs and manifests, and keeps an
image's evidence (smoke report, package list) next to it as an OCI 1.1 artifact whose
`subject` is the image, found again through the referrers API or, on registries without one,
the referrers tag schema (`sha256-<hex>` image index).

Credentials are looked up like Docker does, are never logged, and never appear in messages
or reprs.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urljoin, urlsplit

import requests

from envbuild.errors import BadInput, EnvbuildError

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
USERNAME_ENV = "ENVBUILD_REGISTRY_USERNAME"
PASSWORD_ENV = "ENVBUILD_REGISTRY_PASSWORD"

_MANIFEST_ACCEPT = ", ".join(MANIFEST_MEDIA_TYPES)
_USER_AGENT = "envbuild-registry-client"
_EMPTY_CONFIG = b"{}"
_HELPER_TIMEOUT = 30.0
# Docker's reference grammar (distribution/reference), without the Docker Hub defaults.
_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}")
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::\d+)?")
_CHALLENGE_PARAM = re.compile(r'(\w+)=(?:"([^"]*)"|([^\s,]*))')
_HASHES = {"sha256": hashlib.sha256, "sha512": hashlib.sha512}
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


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, localhost and [::1] (with or without a port)."""
    if host.startswith("["):
        name = host[1 : host.find("]")] if "]" in host else host[1:]
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def default_scheme(host: str) -> str:
    """Plain http for loopback registries (as Docker allows), https for every other one."""
    return "http" if is_loopback(host) else "https"


# -- credentials --------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Credentials:
    """A username and secret for one registry; the secret never shows in repr or str."""

    username: str
    password: str = field(repr=False)
    source: str  # where they came from, safe to show: "ENVBUILD_REGISTRY_USERNAME/PASSWORD", ...
    identity_token: str | None = field(default=None, repr=False)  # OAuth2 refresh token


def lookup_credentials(
    host: str, *, environ: Mapping[str, str] | None = None
) -> Credentials | None:
    """Credentials for `host`: ENVBUILD_REGISTRY_* first, then Docker's config; None if none."""
    env = os.environ if environ is None else environ
    username, password = env.get(USERNAME_ENV), env.get(PASSWORD_ENV)
    if username and password:
        return Credentials(
            username=username, password=password, source=f"{USERNAME_ENV}/{PASSWORD_ENV}"
        )
    if username or password:
        missing = PASSWORD_ENV if username else USERNAME_ENV
        present = USERNAME_ENV if username else PASSWORD_ENV
        msg = f"{present} is set but {missing} is not; set both, or neither to use Docker's login"
        raise BadInput(msg)
    config_path = _docker_config_path(env)
    config = _read_docker_config(config_path)
    if config is None:
        return None
    helpers = config.get("credHelpers")
    helper = helpers.get(host) if isinstance(helpers, dict) else None
    store = config.get("credsStore")
    for name in (helper, store):
        if isinstance(name, str) and name:
            found = _from_helper(name, host)
            if found is not None:
                return found
            break  # Docker asks only the most specific helper
    return _from_auths(config, host, config_path)


def docker_auth_config(
    host: str, *, environ: Mapping[str, str] | None = None
) -> dict[str, str] | None:
    """The auth_config the Docker engine expects for pushing to `host`, or None."""
    credentials = lookup_credentials(host, environ=environ)
    if credentials is None:
        return None
    if credentials.identity_token:
        return {"identitytoken": credentials.identity_token, "serveraddress": host}
    return {
        "username": credentials.username,
        "password": credentials.password,
        "serveraddress": host,
    }


def _docker_config_path(env: Mapping[str, str]) -> Path:
    directory = env.get("DOCKER_CONFIG")
    base = Path(directory).expanduser() if directory else Path.home() / ".docker"
    return base / "config.json"


def _read_docker_config(path: Path) -> dict[str, Any] | None:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as exc:
        msg = f"cannot read Docker's config {path}: {exc.strerror}; fix its permissions"
        raise BadInput(msg) from exc
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        # The position only: the text may hold credentials.
        msg = f"Docker's config {path} is not valid JSON (line {getattr(exc, 'lineno', '?')})"
        raise BadInput(msg) from None
    if not isinstance(data, dict):
        msg = f"Docker's config {path} is not a JSON object; fix or remove it"
        raise BadInput(msg)
    return data


def _registry_key(key: str) -> str:
    """`https://host/v1/` and `host` both name `host`, as Docker's config keys may."""
    if "://" in key:
        key = urlsplit(key).netloc or key
    return key.split("/", 1)[0]


def _from_auths(config: Mapping[str, Any], host: str, path: Path) -> Credentials | None:
    auths = config.get("auths")
    if not isinstance(auths, dict):
        return None
    entry = next((value for key, value in auths.items() if _registry_key(str(key)) == host), None)
    if not isinstance(entry, dict):
        return None
    identity_token = entry.get("identitytoken")
    encoded = entry.get("auth")
    username = password = ""
    if isinstance(encoded, str) and encoded:
        try:
            username, sep, password = base64.b64decode(encoded).decode("utf-8").partition(":")
        except ValueError:
            sep = ""
        if not sep:
            msg = (
                f"Docker's config {path}: auths[{host!r}].auth is not base64 of user:password; "
                f"run `docker login {host}` again"
            )
            raise BadInput(msg) from None
    if isinstance(identity_token, str) and identity_token:
        return Credentials(
            username=username or "<token>",
            password=password,
            identity_token=identity_token,
            source=str(path),
        )
    if not username:
        return None
    return Credentials(username=username, password=password, source=str(path))


def _from_helper(name: str, host: str) -> Credentials | None:
    program = f"docker-credential-{name}"
    binary = shutil.which(program)
    if binary is None:
        log.warning("credential helper %s (from Docker's config) is not on PATH", program)
        return None
    try:
        result = subprocess.run(
            [binary, "get"],
            input=host,
            capture_output=True,
            text=True,
            timeout=_HELPER_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("credential helper %s failed for %s: %s", program, host, type(exc).__name__)
        return None
    if result.returncode != 0:
        # Helpers print "credentials not found in native keychain" when nothing is stored.
        log.debug(
            "credential helper %s has nothing for %s (exit %s)", program, host, result.returncode
        )
        return None
    try:
        data = json.loads(result.stdout)
        username, secret = str(data["Username"]), str(data["Secret"])
    except (ValueError, KeyError, TypeError):
        log.warning("credential helper %s answered something that is not its JSON", program)
        return None
    if not secret:
        return None
    if username == "<token>":  # helpers hand identity (refresh) tokens out this way
        return Credentials(username=username, password="", identity_token=secret, source=program)
    return Credentials(username=username, password=secret, source=program)


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


class RegistryClient:
    """The OCI distribution API of one registry host, with auth and retries."""

    def __init__(
        self,
        host: str,
        *,
        credentials: Credentials | None,
        session: requests.Session | None = None,
        scheme: str | None = None,
        tries: int = 4,
        backoff: float = 0.5,
        timeout: float = 120.0,
    ) -> None:
        self.host = host
        self.scheme = scheme or default_scheme(host)
        self.base_url = f"{self.scheme}://{host}"
        self._credentials = credentials
        self._owns_session = session is None
        self.session = session or requests.Session()
        self.tries = max(1, tries)
        self.backoff = backoff
        self.timeout = timeout
        self._basic = False  # the registry asked for HTTP Basic once: send it pre-emptively
        self._tokens: dict[str, str] = {}  # repository -> bearer token last granted for it

    @classmethod
    def for_host(cls, host: str, *, session: requests.Session | None = None) -> RegistryClient:
        """A client for `host` with the credentials lookup_credentials finds."""
        return cls(host, credentials=lookup_credentials(host), session=session)

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

    # -- manifests ------------------------------------------------------------

    def manifest_digest(self, repository: str, reference: str) -> str:
        """The digest the registry holds for repository:reference (HEAD, else GET)."""
        response = self._request(
            "HEAD",
            repository,
            f"manifests/{reference}",
            what=self._name(repository, reference),
            headers={"Accept": _MANIFEST_ACCEPT},
            ok=(200, 400, 404, 405),
        )
        digest = response.headers.get("Docker-Content-Digest")
        if response.status_code == 200 and digest:
            if _is_digest(reference) and digest != reference:
                msg = f"{self._name(repository, reference)}: the registry reports digest {digest}"
                raise DigestMismatch(msg)
            return digest
        # No header, or HEAD unsupported or refused: GET says why, with an error body.
        return self.get_manifest(repository, reference)[2]

    def manifest_raw(self, repository: str, reference: str) -> tuple[bytes, str, str]:
        """The manifest's exact bytes, its Content-Type and its (verified) digest."""
        what = self._name(repository, reference)
        response = self._request(
            "GET",
            repository,
            f"manifests/{reference}",
            what=what,
            headers={"Accept": _MANIFEST_ACCEPT},
        )
        body = response.content
        if _is_digest(reference):
            digest = reference
        else:
            digest = response.headers.get("Docker-Content-Digest") or _sha256(body)
        _verify(body, digest, what)
        return body, response.headers.get("Content-Type", "").split(";")[0].strip(), digest

    def get_manifest(self, repository: str, reference: str) -> tuple[dict[str, Any], str, str]:
        """The manifest (parsed JSON), its media type and its digest."""
        what = self._name(repository, reference)
        body, content_type, digest = self.manifest_raw(repository, reference)
        try:
            manifest = json.loads(body)
        except ValueError:
            manifest = None
        if not isinstance(manifest, dict):
            msg = f"{what}: the registry returned a manifest that is not a JSON object"
            raise RegistryError(msg)
        media_type = str(manifest.get("mediaType") or content_type)
        return manifest, media_type, digest

    def push_manifest(
        self,
        repository: str,
        reference: str,
        manifest: Mapping[str, Any] | bytes,
        media_type: str,
    ) -> str:
        """PUT a manifest at a tag or digest; returns its digest (checked with the registry's)."""
        return self._put_manifest(repository, reference, _manifest_bytes(manifest), media_type)[0]

    def _put_manifest(
        self, repository: str, reference: str, body: bytes, media_type: str
    ) -> tuple[str, requests.Response]:
        digest = _sha256(body)
        what = self._name(repository, reference)
        if _is_digest(reference) and reference != digest:
            msg = f"cannot push {what}: the manifest's digest is {digest}"
            raise DigestMismatch(msg)
        response = self._request(
            "PUT",
            repository,
            f"manifests/{reference}",
            what=what,
            headers={"Content-Type": media_type},
            data=body,
            ok=(200, 201, 202),
        )
        stored = response.headers.get("Docker-Content-Digest")
        if stored and stored != digest:
            msg = f"{what}: the registry stored digest {stored} for a manifest whose digest is {digest}"
            raise DigestMismatch(msg)
        log.info("pushed %s (%s)", what, digest)
        return digest, response

    def delete_manifest(self, repository: str, digest: str) -> bool:
        """Delete a manifest by digest, best effort (cleanup); True when the registry did."""
        try:
            self._request(
                "DELETE",
                repository,
                f"manifests/{digest}",
                what=self._name(repository, digest),
                ok=(200, 202),
            )
        except RegistryError as exc:
            log.warning("could not delete %s: %s", self._name(repository, digest), exc.message)
            return False
        return True

    def referrers(
        self, repository: str, digest: str, artifact_type: str | None = None
    ) -> list[dict[str, Any]] | None:
        """Descriptors of manifests whose subject is `digest`; None without a referrers API."""
        what = f"referrers of {self._name(repository, digest)}"
        params = {"artifactType": artifact_type} if artifact_type else None
        url: str | None = self._url(repository, f"referrers/{digest}")
        found: list[dict[str, Any]] = []
        while url:
            response = self._request(
                "GET",
                repository,
                "",
                url=url,
                what=what,
                headers={"Accept": OCI_INDEX},
                params=params,
                ok=(200, 404),
            )
            index = _json_or_none(response.content)
            if not isinstance(index, dict) or not isinstance(index.get("manifests"), list):
                if response.status_code == 404:
                    return None  # distribution 2.x: no such route, a text/plain 404
                msg = f"{what}: the registry answered something that is not an image index"
                raise RegistryError(msg)
            found += [d for d in index["manifests"] if isinstance(d, dict)]
            next_link = response.links.get("next", {}).get("url")
            url = urljoin(response.url, next_link) if next_link else None
            params = None  # the next link carries the query
        if artifact_type:  # registries need not apply the filter (OCI-Filters-Applied)
            found = [d for d in found if d.get("artifactType") == artifact_type]
        return found

    # -- blobs ----------------------------------------------------------------

    def blob_exists(self, repository: str, digest: str) -> bool:
        """True when the repository already holds the blob."""
        response = self._request(
            "HEAD",
            repository,
            f"blobs/{digest}",
            what=self._name(repository, digest),
            ok=(200, 404),
        )
        return response.status_code == 200

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
        if not location:
            msg = f"{what}: the registry started an upload without a Location header"
            raise RegistryError(msg)
        response = self._request(
            "PUT",
            repository,
            "",
            url=urljoin(started.url, location),
            what=what,
            headers={"Content-Type": "application/octet-stream"},
            params={"digest": digest},
            data=data,
            ok=(201, 204),
        )
        stored = response.headers.get("Docker-Content-Digest")
        if stored and stored != digest:
            msg = f"{what}: the registry stored digest {stored} for a blob whose digest is {digest}"
            raise DigestMismatch(msg)
        return descriptor

    def get_blob(self, repository: str, digest: str) -> bytes:
        """The blob's bytes, checked against its digest."""
        what = self._name(repository, digest)
        data = self._request("GET", repository, f"blobs/{digest}", what=what).content
        _verify(data, digest, what)
        return data

    # -- HTTP -----------------------------------------------------------------

    def _name(self, repository: str, reference: str) -> str:
        sep = "@" if _is_digest(reference) else ":"
        return f"{self.host}/{repository}{sep}{reference}"

    def _url(self, repository: str, path: str) -> str:
        return f"{self.base_url}/v2/{repository}/{path}"

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
    ) -> requests.Response:
        """Send with auth (one challenge answered per request) and retries; raise on failure."""
        target = url or self._url(repository, path)
        authenticated_now = False
        while True:
            all_headers = {
                "User-Agent": _USER_AGENT,
                **(headers or {}),
                **self._auth_header(repository),
            }
            response = self._send(method, target, all_headers, params, data, what)
            status = response.status_code
            if status in ok:
                return response
            if status == 401 and not authenticated_now:
                self._authenticate(response, repository, what)
                authenticated_now = True
                continue
            raise self._error(response, method, repository, what)

    def _send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        params: Mapping[str, str] | None,
        data: bytes | None,
        what: str,
    ) -> requests.Response:
        """One request with retries on connection errors, 429 and 5xx."""
        attempt = 0
        while True:
            attempt += 1
            last = attempt >= self.tries
            try:
                response = self.session.request(
                    method,
                    url,
                    headers=dict(headers),
                    params=params,
                    data=data,
                    timeout=self.timeout,
                )
            except requests.exceptions.SSLError as exc:
                msg = (
                    f"cannot reach registry {self.host} for {what}: TLS verification failed "
                    f"({_cause(exc)}); set REQUESTS_CA_BUNDLE to the CA bundle that signs it"
                )
                raise RegistryUnreachable(msg) from None
            except requests.RequestException as exc:
                if last:
                    msg = (
                        f"cannot reach registry {self.host} for {what} after {self.tries} tries "
                        f"({_cause(exc)}); check that it runs and that the host:port is right"
                    )
                    raise RegistryUnreachable(msg) from None
                log.warning("%s %s failed (%s); retrying", method, _no_query(url), _cause(exc))
                self._pause(attempt, None)
                continue
            status = response.status_code
            if status == 429 or status >= 500:
                if last:
                    msg = (
                        f"registry {self.host} answered HTTP {status} to {what} {self.tries} "
                        "times; it is failing or overloaded, try again later"
                    )
                    raise RegistryUnreachable(msg)
                log.warning("%s %s answered HTTP %s; retrying", method, _no_query(url), status)
                self._pause(attempt, response.headers.get("Retry-After"))
                continue
            log.debug("%s %s -> %s", method, _no_query(url), status)
            return response

    def _pause(self, attempt: int, retry_after: str | None) -> None:
        delay = self.backoff * 2 ** (attempt - 1)
        if retry_after is not None and retry_after.isdigit():
            delay = max(delay, min(float(retry_after), 10.0))
        if delay > 0:
            time.sleep(delay)

    def _auth_header(self, repository: str) -> dict[str, str]:
        token = self._tokens.get(repository)
        if token:
            return {"Authorization": f"Bearer {token}"}
        if self._basic and self._credentials is not None:
            return {"Authorization": _basic_header(self._credentials)}
        return {}

    def _authenticate(self, response: requests.Response, repository: str, what: str) -> None:
        """Answer a 401's WWW-Authenticate challenge: Basic, or a Bearer token from the realm."""
        challenge = _parse_challenge(response.headers.get("WWW-Authenticate", ""))
        if challenge is None or challenge.scheme not in ("basic", "bearer"):
            raise self._auth_error(response.status_code, what)
        if challenge.scheme == "basic":
            if self._credentials is None or self._credentials.identity_token:
                raise self._auth_error(response.status_code, what)
            self._basic = True
            self._tokens.pop(repository, None)
            return
        realm = challenge.params.get("realm")
        if not realm:
            msg = f"registry {self.host} asked for a bearer token without naming a realm"
            raise RegistryError(msg)
        scope = challenge.params.get("scope") or (
            f"repository:{repository}:pull" if repository else ""
        )
        service = challenge.params.get("service")
        self._tokens[repository] = self._fetch_token(realm, service, scope, what)

    def _fetch_token(self, realm: str, service: str | None, scope: str, for_what: str) -> str:
        token_service = urlsplit(realm).netloc or realm
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
            body = urlencode(form).encode("ascii")
            headers = {
                "User-Agent": _USER_AGENT,
                "Content-Type": "application/x-www-form-urlencoded",
            }
            response = self._send("POST", realm, headers, None, body, what)
        else:
            params = {k: v for k, v in (("service", service), ("scope", scope)) if v}
            headers = {"Authorization": _basic_header(credentials)} if credentials else {}
            response = self._send(
                "GET", realm, {"User-Agent": _USER_AGENT, **headers}, params, None, what
            )
        if response.status_code in (401, 403):
            raise self._auth_error(response.status_code, for_what, token_service=token_service)
        if response.status_code != 200:
            msg = f"registry {self.host}: {what} failed with HTTP {response.status_code}"
            raise RegistryError(msg)
        data = _json_or_none(response.content)
        token = data.get("token") or data.get("access_token") if isinstance(data, dict) else None
        if not isinstance(token, str) or not token:
            msg = f"registry {self.host}: {what} answered without a token"
            raise RegistryError(msg)
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

    def _error(
        self, response: requests.Response, method: str, repository: str, what: str
    ) -> RegistryError:
        status = response.status_code
        codes = _error_codes(response)
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
        detail = "; ".join(f"{code}: {message}" for code, message in codes.items())
        msg = f"registry {self.host} refused {method} {what} with HTTP {status}" + (
            f" ({detail[:300]})" if detail else ""
        )
        return RegistryRejected(" ".join(msg.split()), status=status)


def _basic_header(credentials: Credentials) -> str:
    raw = f"{credentials.username}:{credentials.password}".encode()
    return "Basic " + base64.b64encode(raw).decode("ascii")


def _error_codes(response: requests.Response) -> dict[str, str]:
    """OCI error codes and messages of an error body ({"errors": [{"code", "message"}]})."""
    data = _json_or_none(response.content)
    errors = data.get("errors") if isinstance(data, dict) else None
    if not isinstance(errors, list):
        return {}
    return {
        str(e.get("code")): " ".join(str(e.get("message", "")).split())
        for e in errors
        if isinstance(e, dict)
    }


def _json_or_none(body: bytes) -> Any:
    try:
        return json.loads(body)
    except ValueError:
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
        msg = f"{what}: cannot verify a {algorithm} digest (envbuild checks sha256 and sha512)"
        raise DigestMismatch(msg)
    actual = hasher(data).hexdigest()
    if actual != expected:
        msg = f"{what}: the registry sent content whose digest is {algorithm}:{actual}"
        raise DigestMismatch(msg)


def _no_query(url: str) -> str:
    # Upload URLs carry state tokens in the query; keep logs short and free of them.
    return url.split("?", 1)[0]


def _cause(exc: BaseException) -> str:
    """The innermost OS-level reason ("Connection refused"), else the exception's class name.

    Not str(exc): requests' messages carry whole URLs (upload state) and proxy addresses.
    """
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.strerror:
            return " ".join(str(current.strerror).split())[:200]
        linked = (getattr(current, "reason", None), current.__cause__, current.__context__)
        stack += [e for e in (*linked, *current.args) if isinstance(e, BaseException)]
    return type(exc).__name__
