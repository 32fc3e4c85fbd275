"""One registry host over HTTP: sessions, deadlines, auth challenges, retries, errors.

Every operation is bounded (envbuild.net.bounded): body sizes, redirects, pages, retries and a
total deadline, so a broken or hostile registry ends in one clear error, never a hang.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Concatenate, ParamSpec, Self, TypeVar

import requests

from envbuild.core.models import ProxySettings
from envbuild.core.settings import seconds_setting
from envbuild.net.bounded import (
    SMALL_LIMIT,
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
    origin_text,
    printable,
    read_reply,
    same_origin,
    watched,
    watched_session,
)
from envbuild.net.credentials import Credentials, lookup_credentials
from envbuild.net.proxy import current, loopback_direct, requests_proxies, route_session
from envbuild.net.trust import chosen_bundle, trust_session
from envbuild.registry.auth import RegistryAuth
from envbuild.registry.content import json_or_none
from envbuild.registry.errors import (
    RegistryError,
    RegistryMalformed,
    RegistryNotFound,
    RegistryRejected,
    RegistryUnreachable,
)
from envbuild.registry.reference import default_scheme, is_digest

DEADLINE_ENV = "ENVBUILD_REGISTRY_TIMEOUT"
DEFAULT_DEADLINE = 120.0  # seconds per registry operation (connecting, retries, reading: all)
USER_AGENT = "envbuild-registry-client"

_C = TypeVar("_C", bound="RegistryConnection")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def bounded(
    method: Callable[Concatenate[_C, _P], _R],
) -> Callable[Concatenate[_C, _P], _R]:
    """Run a client method under one deadline: the caller's operation when one is open."""

    @functools.wraps(method)
    def wrapper(self: _C, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self.operation():
            return method(self, *args, **kwargs)

    return wrapper


def deadline_from_env(environ: Mapping[str, str] | None = None) -> float:
    """Seconds per registry operation: ENVBUILD_REGISTRY_TIMEOUT, else the default."""
    return seconds_setting(DEADLINE_ENV, DEFAULT_DEADLINE, environ)


class RegistryConnection:
    """One registry host: its session, auth and deadlines; each request one line on failure.

    Each public method of a subclass decorated with `bounded` is one operation with one
    deadline (`deadline` seconds for connecting, retrying and reading, together);
    `operation()` groups several calls under one. A connection is for one thread at a time.
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
        self.auth = RegistryAuth(host, credentials)
        self._owns_session = session is None
        # A session of the caller's keeps its adapters: its requests are bounded by timeouts and
        # checks between reads, but not cut off inside one read (see http_limits.watched).
        self.session = watched_session() if session is None else session
        self.transport = Transport(self.session, tries=tries, backoff=backoff)
        self.deadline = deadline
        self._operation: Deadline | None = None
        self.proxy = ProxySettings()  # what for_host routed the session through, for messages

    @classmethod
    def for_host(
        cls,
        host: str,
        *,
        session: requests.Session | None = None,
        proxy: ProxySettings | None = None,
    ) -> Self:
        """A client for `host` with the credentials lookup_credentials finds, the deadline
        ENVBUILD_REGISTRY_TIMEOUT sets and the proxy `proxy` (default: envbuild.net.proxy.current(),
        the CLI's --proxy, the environment or Docker's config); a loopback host goes direct.
        Its TLS certificates are checked against the default store and the CLI's --ca-bundle."""
        client = cls(
            host,
            credentials=lookup_credentials(host),
            session=session,
            deadline=deadline_from_env(),
        )
        if client._owns_session:
            chosen = current() if proxy is None else proxy
            client.proxy = loopback_direct(chosen, host)
            route_session(client.session, client.proxy)
            trust_session(client.session, chosen_bundle())
        return client

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(host={self.host!r}, scheme={self.scheme!r}, "
            f"authenticated={self.auth.credentials is not None})"
        )

    def close(self) -> None:
        """Close the HTTP session if this client made it."""
        if self._owns_session:
            self.session.close()

    def __enter__(self) -> Self:
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

    # What the registry answered.

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
        if not isinstance(item.get("digest"), str) or not is_digest(item["digest"]):
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

    def check_digest_header(self, digest: str, what: str) -> None:
        """RegistryMalformed unless a Docker-Content-Digest header holds a digest."""
        if not is_digest(digest):
            raise self.malformed(what, kind="Docker-Content-Digest header", why="not a digest")

    # HTTP.

    def name(self, repository: str, reference: str) -> str:
        """host/repository:tag or host/repository@digest, as messages show it."""
        sep = "@" if is_digest(reference) else ":"
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
            response = self.exchange(
                method,
                target,
                what=what,
                headers=headers,
                params=params,
                data=data,
                authorization=self.auth.header(repository),
                credentials_origin=self.base_url,
            )
            status = response.status_code
            if status in ok:
                return self.read(response, what, limit)
            # Only the registry's own challenge is answered: never one from a redirect target.
            if status == 401 and not authenticated_now and same_origin(response.url, self.base_url):
                challenge = response.headers.get("WWW-Authenticate", "")
                self.read(response, what, SMALL_LIMIT, truncate=True)  # keeps the connection
                self.auth.answer(challenge, repository, what, self)
                authenticated_now = True
                continue
            error = self.read(response, what, SMALL_LIMIT, truncate=True)
            raise self._error(error, method, repository, what)

    def exchange(
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
        naming the registry; the body is left unread (see `read`)."""
        deadline = self._deadline()
        try:
            return self.transport.exchange(
                method,
                url,
                deadline=deadline,
                headers={"User-Agent": USER_AGENT, **(headers or {})},
                params=params,
                data=data,
                authorization=authorization,
                credentials_origin=credentials_origin,
            )
        except TlsFailed as exc:
            msg = (
                f"cannot reach registry {self.host} for {what}: TLS verification failed "
                f"({exc.cause}); pass --ca-bundle FILE, the PEM bundle of the CA that signs its "
                f"certificate (Docker's engine, which pushes, reads the same CA from "
                f"/etc/docker/certs.d/{self.host}/ca.crt)"
            )
        except Unreachable as exc:
            through = requests_proxies(self.proxy, url).get(self.scheme)
            if through is not None and isinstance(exc.error, requests.exceptions.ProxyError):
                msg = (
                    f"cannot reach registry {self.host} for {what} through the proxy "
                    f"{origin_text(through)} after {_tries(exc.tries)} ({exc.cause}); check that "
                    "the proxy runs and accepts you (--proxy, HTTPS_PROXY), or list the registry "
                    "in NO_PROXY if it is reached directly"
                )
            else:
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
        except DeadlineExceeded as exc:
            raise self._too_slow(what, deadline, exc) from None
        raise RegistryUnreachable(msg) from None

    def read(
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

    def _too_slow(
        self, what: str, deadline: Deadline, exc: DeadlineExceeded | None = None
    ) -> RegistryUnreachable:
        """The one line for an operation that its deadline ended, with the last try's answer
        when the deadline ended the retries rather than a try."""
        tried = f" ({_tries(exc.tries)}; the last {exc.last})" if exc and exc.tries else ""
        msg = (
            f"registry {self.host} did not complete {what} within {deadline.seconds:g} s{tried}; "
            f"it is not answering or too slow: try again later, or set {DEADLINE_ENV} to more "
            "seconds"
        )
        return RegistryUnreachable(msg)

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
            return self.auth.error(status, what)
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
        return RegistryRejected(msg, status=status, codes=tuple(codes))


def _error_codes(body: bytes) -> dict[str, str]:
    """OCI error codes and messages of an error body ({"errors": [{"code", "message"}]})."""
    data = json_or_none(body)
    errors = data.get("errors") if isinstance(data, dict) else None
    if not isinstance(errors, list):
        return {}
    return {
        printable(e.get("code"), 60): printable(" ".join(str(e.get("message", "")).split()))
        for e in errors[:20]
        if isinstance(e, dict)
    }


def _tries(count: int) -> str:
    return "1 try" if count == 1 else f"{count} tries"


def _size(count: int) -> str:
    for unit, scale in (("MiB", 1024 * 1024), ("KiB", 1024)):
        if count >= scale:
            return f"{count / scale:g} {unit}"
    return f"{count} bytes"
