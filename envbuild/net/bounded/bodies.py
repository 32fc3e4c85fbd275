"""Bounds on one exchange: body caps, the operation's deadline, and the failures that end it."""

from __future__ import annotations

import contextlib
import http.client
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urljoin

import requests
import urllib3

from envbuild.net.bounded.origins import next_link
from envbuild.net.bounded.text import printable

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


class BodyTooLarge(Exception):
    """The body is (or says it is) larger than the cap for what it holds."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


class DeadlineExceeded(Exception):
    """The operation's total time ran out, or what is left of it leaves no room for another try.

    `tries` and `last` (what the last try got: "answered HTTP 503", "failed: timed out") are
    set when a try ended on its own and the deadline stopped the retries; they stay empty when
    the deadline cut a try short, whose failure is then no news about the server.
    """

    def __init__(self, *, tries: int = 0, last: str = "") -> None:
        super().__init__(tries, last)
        self.tries = tries
        self.last = last


class ReadFailed(Exception):
    """The connection failed or timed out while the body was read."""

    def __init__(self, cause: str) -> None:
        super().__init__(cause)
        self.cause = cause


class TlsFailed(Exception):
    """The server's certificate could not be verified (retrying will not help)."""

    def __init__(self, cause: str, *, error: BaseException) -> None:
        super().__init__(cause)
        self.cause = cause
        self.error = error  # what requests raised, for callers that show its own text


class Unreachable(Exception):
    """Connecting or sending failed on every try."""

    def __init__(self, cause: str, tries: int, *, error: BaseException) -> None:
        super().__init__(cause, tries)
        self.cause = cause
        self.tries = tries
        self.error = error  # the last try's failure, as requests raised it


class Overloaded(Exception):
    """The server answered 429 or 5xx on every try."""

    def __init__(self, status: int, tries: int, *, reason: str = "") -> None:
        super().__init__(status, tries)
        self.status = status
        self.tries = tries
        self.reason = reason  # the last answer's reason phrase ("Service Unavailable")


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


def close_quietly(response: requests.Response) -> None:
    """Drop a response without reading its body (the connection goes with it)."""
    with contextlib.suppress(urllib3.exceptions.HTTPError, OSError):
        response.close()


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
        elif isinstance(current, http.client.RemoteDisconnected):
            return "the connection was closed without an answer"
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
