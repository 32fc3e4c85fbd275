"""Requests with bounded retries and hand-followed redirects: one retry policy for every client."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from urllib.parse import urljoin

import requests

from envbuild.net.bounded.bodies import (
    MAX_REDIRECTS,
    MAX_RETRY_AFTER,
    REDIRECT_STATUSES,
    Deadline,
    DeadlineExceeded,
    Overloaded,
    RedirectRefused,
    TlsFailed,
    Unreachable,
    close_quietly,
    describe_failure,
)
from envbuild.net.bounded.origins import is_downgrade, origin, same_origin
from envbuild.net.bounded.text import for_log, origin_text

log = logging.getLogger(__name__)


def redirected_method(status: int, method: str) -> str:
    """The method a redirect asks for: 303 (and 301/302 after POST) become GET, as browsers do."""
    if (status == 303 and method != "HEAD") or (status in (301, 302) and method == "POST"):
        return "GET"
    return method


def retry_after_seconds(value: str | None, *, longest: float = MAX_RETRY_AFTER) -> float | None:
    """A Retry-After header (seconds or an HTTP date) as seconds, within 0..`longest`."""
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
    return max(0.0, min(seconds, longest))


class Retries:
    """The tries of one request: how many, how long to wait between them, when to give up.

    One policy for every HTTP client of envbuild: a failed connection, 429 or 5xx is tried
    again after the server's Retry-After (at most `longest` seconds), else an exponential
    backoff. Redirects followed in between count toward the same tries. With a deadline, every
    try and every wait comes out of it: a wait that would not end before it is not started,
    and the request ends in DeadlineExceeded, naming the last try's answer.
    """

    def __init__(
        self,
        *,
        tries: int,
        backoff: float,
        deadline: Deadline | None = None,
        longest: float = MAX_RETRY_AFTER,
    ) -> None:
        self.tries = max(1, tries)
        self.backoff = backoff
        self.deadline = deadline
        self.longest = longest
        self.failed = 0

    def send(self, request: Callable[[], requests.Response], *, label: str) -> requests.Response:
        """The first answer that is neither 429 nor 5xx (its body unread).

        Raises TlsFailed at once; Unreachable or Overloaded when the tries are spent;
        DeadlineExceeded when the deadline passed or leaves no time for the next wait.
        """
        while True:
            try:
                response = request()
            except requests.exceptions.SSLError as exc:
                raise TlsFailed(describe_failure(exc), error=exc) from None
            except requests.RequestException as exc:
                self.failed += 1
                cause = describe_failure(exc)
                if self.deadline is not None:
                    self.deadline.check()  # cut short by the deadline: its cause is no news
                if not self._wait(None, last=f"failed: {cause}"):
                    raise Unreachable(cause, self.failed, error=exc) from None
                log.warning("%s failed (%s); retrying", label, cause)
                continue
            status = response.status_code
            if status != 429 and status < 500:
                return response
            close_quietly(response)
            self.failed += 1
            if not self._wait(response.headers.get("Retry-After"), last=f"answered HTTP {status}"):
                raise Overloaded(status, self.failed, reason=response.reason or "")
            log.warning("%s answered HTTP %s; retrying", label, status)

    def _wait(self, retry_after: str | None, *, last: str) -> bool:
        """Sleep before another try; False when no try is left. DeadlineExceeded when the wait
        would not end before the deadline: then no other try starts."""
        if self.failed >= self.tries:
            return False
        delay = retry_after_seconds(retry_after, longest=self.longest)
        if delay is None:
            delay = min(self.backoff * 2 ** (self.failed - 1), self.longest)
        if self.deadline is not None and delay >= self.deadline.remaining():
            raise DeadlineExceeded(tries=self.failed, last=last)
        if delay > 0:
            time.sleep(delay)
        return True


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
        retries = Retries(tries=self.tries, backoff=self.backoff, deadline=deadline)
        hops = 0
        while True:
            sent = {"Accept-Encoding": "identity", **headers}
            if authorization and credentials_origin and same_origin(url, credentials_origin):
                sent["Authorization"] = authorization

            once = functools.partial(self._send, method, url, sent, params, data, deadline)
            response = retries.send(once, label=f"{method} {for_log(url)}")
            log.debug("%s %s -> %s", method, for_log(response.url), response.status_code)
            if response.status_code not in REDIRECT_STATUSES:
                return response
            close_quietly(response)
            hops += 1
            url, method, data = _follow(response, url, method, data, hops)
            params = None  # the Location carries the query

    def _send(
        self,
        method: str,
        url: str,
        headers: Mapping[str, str],
        params: Mapping[str, str] | None,
        data: bytes | None,
        deadline: Deadline,
    ) -> requests.Response:
        """One try, redirects not followed, its timeouts what is left of the deadline."""
        return self.session.request(
            method,
            url,
            headers=headers,
            params=params,
            data=data,
            timeout=deadline.timeout(),
            stream=True,
            allow_redirects=False,
        )


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
