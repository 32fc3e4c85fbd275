"""Bounded HTTP for servers that may be broken or hostile: body caps, deadlines, origins, redirects.

Nothing here knows about registries. Each piece bounds one way a server could make a client
hang or eat memory, or hand credentials to someone else:

- `Deadline`: one monotonic deadline per operation, checked across retries and between socket
  reads; `watched` shuts the operation's sockets down when it passes, so even a status line or
  header dripped a byte at a time ends on time (sessions from `watched_session`).
- `read_body`: streamed reads that stop at a cap, whatever Content-Length says or omits.
- `Transport`: retries (429/5xx honour Retry-After, bounded) and redirects followed by hand:
  at most MAX_REDIRECTS, never from https down to plain http, Authorization only to its origin.
- `same_origin`, `safe_for_credentials`, `next_link`: where a link or secret may go.
- `printable`: text from a server made safe for one terminal line.

Failures are the small exceptions below; the caller turns them into messages that name the
server and what it was asked for.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urljoin, urlsplit

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

log = logging.getLogger(__name__)

KIB = 1024
MIB = 1024 * KIB
MANIFEST_LIMIT = 4 * MIB  # the OCI distribution spec's limit for manifests (and image indexes)
BLOB_LIMIT = 64 * MIB  # evidence blobs: a smoke report and a package list are kilobytes
TOKEN_LIMIT = 256 * KIB  # a token answer: a JWT with its scopes
SMALL_LIMIT = 64 * KIB  # error bodies and other answers read only for a message
MAX_REDIRECTS = 5
MAX_PAGES = 20
MAX_RETRY_AFTER = 10.0  # seconds; a longer Retry-After is honoured only up to this
CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 30.0  # per socket read; the operation's deadline bounds the total
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})

_CHUNK = 64 * KIB
_DEFAULT_PORTS = {"http": 80, "https": 443}
# C0 and C1 controls (ESC starts every ANSI sequence), line/paragraph separators and the
# bidirectional overrides that make text display in another order than it reads.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


class BodyTooLarge(Exception):
    """The body is (or says it is) larger than the cap for what it holds."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


class DeadlineExceeded(Exception):
    """The operation's total time ran out."""


class ReadFailed(Exception):
    """The connection failed or timed out while the body was read."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class TlsFailed(Exception):
    """The server's certificate could not be verified (retrying will not help)."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class Unreachable(Exception):
    """Connecting or sending failed on every try."""

    def __init__(self, cause: str, tries: int) -> None:
        super().__init__(cause, tries)
        self.cause = cause
        self.tries = tries


class Overloaded(Exception):
    """The server answered 429 or 5xx on every try."""

    def __init__(self, status: int, tries: int) -> None:
        super().__init__(status, tries)
        self.status = status
        self.tries = tries


class RedirectRefused(Exception):
    """A redirect envbuild does not follow; `why` completes "redirected <what> ..."."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


class Deadline:
    """A point on the monotonic clock by which an operation must be done."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._end = clock() + seconds

    def remaining(self) -> float:
        """Seconds left; zero or less once it has passed."""
        return self._end - self._clock()

    def check(self) -> None:
        """Raise DeadlineExceeded once the deadline has passed."""
        if self.remaining() <= 0:
            raise DeadlineExceeded

    def timeout(self) -> tuple[float, float]:
        """(connect, read) timeouts for one request: the usual ones, never past the deadline."""
        remaining = self.remaining()
        if remaining <= 0:
            raise DeadlineExceeded
        return min(CONNECT_TIMEOUT, remaining), min(READ_TIMEOUT, remaining)


def read_body(
    response: requests.Response, *, limit: int, deadline: Deadline, truncate: bool = False
) -> bytes:
    """At most `limit` bytes of a streamed body, checking the deadline between socket reads.

    Past the limit (declared by Content-Length or actually sent) it stops reading and closes the
    connection: BodyTooLarge, or the first `limit` bytes with `truncate` (for error bodies).
    The body is read as sent (no Content-Encoding decoding): what is counted is what arrives.
    """
    finished = False
    try:
        # A HEAD answer declares the size of what a GET would send; its body is empty, and
        # reading that empty body is what lets the connection be used again.
        head = response.request is not None and response.request.method == "HEAD"
        declared = response.headers.get("Content-Length", "")
        if not head and declared.isdigit() and int(declared) > limit and not truncate:
            raise BodyTooLarge(limit)
        raw = response.raw
        body = bytearray()
        while len(body) <= limit:
            deadline.check()
            # read1: one socket read, so a body dripped a byte at a time still meets the check.
            chunk = raw.read1(_CHUNK, decode_content=False)
            if not chunk:
                deadline.check()  # an end that the watchdog made is no end of the body
                finished = True
                return bytes(body)
            body += chunk
        if truncate:
            return bytes(body[:limit])
        raise BodyTooLarge(limit)
    except (urllib3.exceptions.HTTPError, requests.RequestException, OSError) as exc:
        raise ReadFailed(describe_failure(exc)) from None
    finally:
        if finished:
            response.raw.release_conn()  # read to its end: the connection can be reused
        else:
            close_quietly(response)  # stopped early: the rest of the body goes with the socket


# -- the watchdog: a deadline that holds even inside one socket read ------------------------
#
# Timeouts bound each socket read, and read_body checks the deadline between reads, but a
# status line, a header or a chunk-size line dripped a byte at a time is read inside http.client,
# where no check runs. So, while an operation is `watched`, each socket that its requests open
# or reuse is noted, and when the deadline passes a timer shuts them down: the blocked read
# returns, the request fails, and the caller sees the deadline gone.

_watching = threading.local()


class _Watch:
    def __init__(self) -> None:
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._fired = False

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)
            if self._fired:
                _shut(sock)

    def fire(self) -> None:
        with self._lock:
            self._fired = True
            for sock in list(self._sockets):
                _shut(sock)


def _shut(sock: socket.socket) -> None:
    # socket.socket's shutdown, not SSLSocket's (that one also drops the TLS object under
    # the reader's feet): the descriptor is what a blocked read waits on.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _note(sock: socket.socket | None) -> None:
    watch: _Watch | None = getattr(_watching, "watch", None)
    if watch is not None and sock is not None:
        watch.add(sock)


@contextlib.contextmanager
def watched(deadline: Deadline) -> Iterator[None]:
    """Shut down the sockets that requests made in this block use once `deadline` passes
    (requests over a session with a WatchedAdapter, in this thread)."""
    watch = _Watch()
    timer = threading.Timer(max(0.0, deadline.remaining()), watch.fire)
    timer.daemon = True
    outer = getattr(_watching, "watch", None)
    _watching.watch = watch
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        _watching.watch = outer


class _WatchedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _note(sock)  # before the TLS handshake, which can be dripped too
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        _note(self.sock)  # a connection reused from the pool
        super().request(*args, **kwargs)


class _WatchedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _note(sock)
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        _note(self.sock)  # the TLS socket (the one _new_conn noted is detached by then)
        super().request(*args, **kwargs)


class _WatchedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _WatchedHTTPConnection


class _WatchedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _WatchedHTTPSConnection


_WATCHED_POOLS = {"http": _WatchedHTTPPool, "https": _WatchedHTTPSPool}


class WatchedAdapter(HTTPAdapter):
    """requests' adapter whose connections the watchdog can shut down (see `watched`)."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        # PoolManager keeps its pool classes per instance so that they can be replaced.
        self.poolmanager.pool_classes_by_scheme = _WATCHED_POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if manager.pool_classes_by_scheme is urllib3.poolmanager.pool_classes_by_scheme:
            manager.pool_classes_by_scheme = _WATCHED_POOLS  # not SOCKS: it has its own
        return manager


def watched_session() -> requests.Session:
    """A requests session whose requests `watched` can cut off at a deadline."""
    session = requests.Session()
    session.max_redirects = MAX_REDIRECTS  # Transport follows redirects itself, but still
    adapter = WatchedAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def close_quietly(response: requests.Response) -> None:
    """Drop a response without reading its body (the connection goes with it)."""
    with contextlib.suppress(urllib3.exceptions.HTTPError, OSError):
        response.close()


# -- origins and where credentials may go --------------------------------------


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


def origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, ports filled in; None for anything else."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme]


def same_origin(url: str, other: str) -> bool:
    """True when both are http(s) URLs with the same scheme, host and port."""
    mine = origin(url)
    return mine is not None and mine == origin(other)


def safe_for_credentials(url: str) -> bool:
    """https, or plain http to a loopback host: where a secret may travel (as Docker allows)."""
    parts = origin(url)
    if parts is None or "@" in urlsplit(url).netloc:
        return False
    scheme, host, _ = parts
    return scheme == "https" or is_loopback(host)


def is_downgrade(source: str, target: str) -> bool:
    """True when following source -> target would leave https for plain http off loopback."""
    before, after = origin(source), origin(target)
    return (
        before is not None
        and after is not None
        and before[0] == "https"
        and after[0] == "http"
        and not is_loopback(after[1])
    )


def redirected_method(status: int, method: str) -> str:
    """The method a redirect asks for: 303 (and 301/302 after POST) become GET, as browsers do."""
    if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
        return "GET"
    return method


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header (seconds or an HTTP date) as seconds, within 0..MAX_RETRY_AFTER."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        seconds = float(value)
    else:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - time.time()
    return max(0.0, min(seconds, MAX_RETRY_AFTER))


def next_link(response: requests.Response) -> str | None:
    """The target of a `Link: <...>; rel="next"` header, if any."""
    header = response.headers.get("Link")
    if not header:
        return None
    try:
        links: list[dict[str, Any]] = requests.utils.parse_header_links(header)
    except (ValueError, IndexError):
        return None
    for link in links:
        if "next" in str(link.get("rel", "")).split() and link.get("url"):
            return str(link["url"])
    return None


# -- text from servers ------------------------------------------------------------------


def printable(text: object, limit: int = 200) -> str:
    """`text` safe to print on one terminal line: controls and ANSI escapes shown escaped,
    bidi overrides neutralised, and cut to about `limit` characters."""
    escaped = _UNPRINTABLE.sub(_escape, str(text))
    if len(escaped) > limit:
        return escaped[:limit] + "..."
    return escaped


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _ESCAPES.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    )


def describe_failure(exc: BaseException) -> str:
    """The innermost OS-level reason ("Connection refused"), else a timeout, else the class name.

    Not str(exc): requests' messages carry whole URLs (upload state) and proxy addresses.
    """
    seen: set[int] = set()
    stack: list[BaseException] = [exc]
    timed_out = False
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, TimeoutError | requests.Timeout | urllib3.exceptions.TimeoutError):
            timed_out = True
        elif isinstance(current, OSError) and current.strerror:
            return printable(" ".join(str(current.strerror).split()))
        linked = (getattr(current, "reason", None), current.__cause__, current.__context__)
        stack += [e for e in (*linked, *current.args) if isinstance(e, BaseException)]
    return "timed out" if timed_out else type(exc).__name__


@dataclass(frozen=True, kw_only=True)
class Reply:
    """A response whose body was read within its limits."""

    status: int
    url: str
    headers: requests.structures.CaseInsensitiveDict[str]
    body: bytes
    next_url: str | None  # Link rel="next", resolved against `url`; not yet checked


def read_reply(
    response: requests.Response, *, limit: int, deadline: Deadline, truncate: bool = False
) -> Reply:
    """The response with its body read by read_body (same limits, same exceptions)."""
    body = read_body(response, limit=limit, deadline=deadline, truncate=truncate)
    link = next_link(response)
    return Reply(
        status=response.status_code,
        url=response.url,
        headers=response.headers,
        body=body,
        next_url=urljoin(response.url, link) if link else None,
    )


class Transport:
    """Requests over one session with bounded retries and redirects, inside a deadline.

    Redirects are followed here (never by requests, which would read a redirect's body whole):
    at most MAX_REDIRECTS, never from https down to plain http off loopback, never carrying a
    request body to another origin, and the Authorization header goes only to the origin it
    was meant for, whatever a redirect names.
    """

    def __init__(self, session: requests.Session, *, tries: int, backoff: float) -> None:
        self.session = session
        self.tries = max(1, tries)
        self.backoff = backoff

    def exchange(
        self,
        method: str,
        url: str,
        *,
        deadline: Deadline,
        headers: Mapping[str, str],
        params: Mapping[str, str] | None = None,
        data: bytes | None = None,
        authorization: str | None = None,
        credentials_origin: str | None = None,
    ) -> requests.Response:
        """The final response of one request (its body unread: see read_reply).

        Raises TlsFailed, Unreachable, Overloaded, RedirectRefused or DeadlineExceeded.
        """
        attempt = hops = 0
        while True:
            sent = {"Accept-Encoding": "identity", **headers}
            if authorization and credentials_origin and same_origin(url, credentials_origin):
                sent["Authorization"] = authorization
            try:
                response = self.session.request(
                    method,
                    url,
                    headers=sent,
                    params=params,
                    data=data,
                    timeout=deadline.timeout(),
                    stream=True,
                    allow_redirects=False,
                )
            except requests.exceptions.SSLError as exc:
                raise TlsFailed(describe_failure(exc)) from None
            except requests.RequestException as exc:
                attempt += 1
                cause = describe_failure(exc)
                deadline.check()
                if attempt >= self.tries or not self._wait(attempt, None, deadline):
                    raise Unreachable(cause, attempt) from None
                log.warning("%s %s failed (%s); retrying", method, for_log(url), cause)
                continue
            status = response.status_code
            log.debug("%s %s -> %s", method, for_log(response.url), status)
            if status in REDIRECT_STATUSES:
                close_quietly(response)
                hops += 1
                url, method, data = _follow(response, url, method, data, hops)
                params = None  # the Location carries the query
                continue
            if status == 429 or status >= 500:
                close_quietly(response)
                attempt += 1
                retry_after = response.headers.get("Retry-After")
                if attempt >= self.tries or not self._wait(attempt, retry_after, deadline):
                    raise Overloaded(status, attempt)
                log.warning("%s %s answered HTTP %s; retrying", method, for_log(url), status)
                continue
            return response

    def _wait(self, attempt: int, retry_after: str | None, deadline: Deadline) -> bool:
        """Sleep before another try (Retry-After, bounded, else exponential backoff); False when
        the wait would not end before the deadline."""
        delay = retry_after_seconds(retry_after)
        if delay is None:
            delay = min(self.backoff * 2 ** (attempt - 1), MAX_RETRY_AFTER)
        if delay >= deadline.remaining():
            return False
        if delay > 0:
            time.sleep(delay)
        return True


def _follow(
    response: requests.Response, url: str, method: str, data: bytes | None, hops: int
) -> tuple[str, str, bytes | None]:
    """Where a redirect leads (url, method, body), or RedirectRefused."""
    if hops > MAX_REDIRECTS:
        msg = f"more than {MAX_REDIRECTS} times"
        raise RedirectRefused(msg)
    location = response.headers.get("Location", "")
    target = urljoin(response.url or url, location) if location else ""
    if origin(target) is None:
        msg = "to a Location that is not an http(s) URL"
        raise RedirectRefused(msg)
    if is_downgrade(url, target):
        msg = f"from https to plain http ({origin_text(target)})"
        raise RedirectRefused(msg)
    method_next = redirected_method(response.status_code, method)
    if method_next == "GET" and method != "GET":
        return target, method_next, None
    if data is not None and not same_origin(url, target):
        msg = f"with its request body to another origin ({origin_text(target)})"
        raise RedirectRefused(msg)
    return target, method_next, data


def origin_text(url: str) -> str:
    """scheme://host:port of a URL from a server, safe to print (no path, query or userinfo)."""
    parts = origin(url)
    if parts is None:
        return printable(url.split("?", 1)[0], 80)
    scheme, host, port = parts
    return printable(f"{scheme}://{host}:{port}", 120)


def for_log(url: str) -> str:
    """A URL for a log line: no query (upload URLs carry state tokens there), no controls."""
    return printable(url.split("?", 1)[0], 200)
