"""Whether the indexes a resolution needs answer at all, asked once before uv runs.

uv retries a host that does not resolve, refuses or never answers, for seconds to minutes, and
then names neither the index nor what would do without it. One short request to each index
(the framework's page, no credentials sent) finds such an index at once; the line it gives names
the index without credentials and the options that do without it. Anything that answers, even
with an error status or a certificate requests does not trust, is left to uv to judge.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Iterator
from http.client import RemoteDisconnected

import requests

from envbuild.core.models import BuildOptions, Entry
from envbuild.core.names import public_url
from envbuild.lock.wheelhouse import framework_index
from envbuild.net.proxy import route_session
from envbuild.net.trust import trust_session

PYPI_SIMPLE = "https://pypi.org/simple"
# Seconds to connect and then to the first byte; lower when UV_HTTP_CONNECT_TIMEOUT or
# UV_HTTP_TIMEOUT say so, as uv itself would then give up sooner.
CONNECT_S = 5.0
ANSWER_S = 10.0


def _seconds(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, ""))
    except ValueError:
        return default
    return min(value, default) if value > 0 else default


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and every exception it wraps (requests and urllib3 nest them three deep)."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        found = todo.pop()
        if id(found) in seen:
            continue
        seen.add(id(found))
        yield found
        todo += [c for c in (found.__cause__, found.__context__) if c is not None]
        reason = getattr(found, "reason", None)
        todo += [reason] if isinstance(reason, BaseException) else []
        todo += [a for a in found.args if isinstance(a, BaseException)]


def why_unreachable(exc: requests.RequestException, connect_s: float, answer_s: float) -> str:
    """What a failed request says about its host, in a few words."""
    causes = list(_causes(exc))
    if any(isinstance(c, socket.gaierror) for c in causes):
        return "its host name does not resolve"
    if isinstance(exc, requests.exceptions.ProxyError):
        return "the proxy could not reach it"
    if isinstance(exc, requests.exceptions.ConnectTimeout):
        return f"no connection within {connect_s:g} s"
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return f"no answer within {answer_s:g} s"
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return "the connection was refused"
    if any(isinstance(c, (ConnectionResetError, RemoteDisconnected)) for c in causes):
        return "it closed the connection without answering"
    return "it cannot be connected to"


def _indexes(entry: Entry, options: BuildOptions) -> Iterator[tuple[str, str, str]]:
    """(URL, what it is, the fix when it cannot be reached) for each index uv uses for `entry`."""
    own = framework_index(entry, options)
    wheel = f"--wheelhouse DIR (a folder holding the {_framework_name(entry)} wheel)"
    every_wheel = "or --offline with a --wheelhouse holding every wheel"
    if options.index_url is not None:
        yield (
            options.index_url, f"--index-url {public_url(options.index_url)}",
            f"pass an index that answers, {every_wheel}",
        )  # fmt: skip
    else:
        yield (
            PYPI_SIMPLE,
            f"PyPI ({PYPI_SIMPLE})",
            f"pass --index-url URL (a mirror), {every_wheel}",
        )
    for url in options.extra_index_urls:
        yield url, f"--extra-index-url {public_url(url)}", "pass one that answers, or leave it out"
    if own is not None and options.framework_index is not None:
        yield own, f"--framework-index {public_url(own)}", f"pass a mirror that answers, or {wheel}"
    elif own is not None:
        yield (
            own,
            f"{entry.framework}'s own index {public_url(own)}",
            (
                f"pass --framework-index URL (a mirror of it) or {wheel}, or use locks committed "
                "beside the matrix (`envbuild lock -m MATRIX` where the index can be reached)"
            ),
        )


def _framework_name(entry: Entry) -> str:
    return re.split(r"[=<>!~\[; ]", entry.install.requirement, maxsplit=1)[0]


def _probe(page: str, options: BuildOptions) -> str | None:
    """Why `page` cannot be reached, in a few words; None when its host answers anything."""
    connect_s = _seconds("UV_HTTP_CONNECT_TIMEOUT", CONNECT_S)
    answer_s = _seconds("UV_HTTP_TIMEOUT", ANSWER_S)
    with requests.Session() as session:
        session.trust_env = False  # no .netrc, no REQUESTS_CA_BUNDLE: the choices below
        route_session(session, options.proxy)
        trust_session(session, options.ca_bundle)
        if options.proxy.empty:  # route_session chose nothing: what uv reads
            session.proxies = requests.utils.get_environ_proxies(page)
        try:
            answer = session.get(
                page, timeout=(connect_s, answer_s), allow_redirects=False, stream=True
            )
            answer.close()
        except requests.exceptions.SSLError:
            return None  # it answered; whether uv trusts it is uv's to say
        except (requests.ConnectionError, requests.Timeout) as exc:
            return why_unreachable(exc, connect_s, answer_s)
        except (requests.RequestException, ValueError):
            return None
    return None


class Reachability:
    """What one run has learnt of each index: asked once, by whichever entry needs it first,
    while the entries resolved at the same time that need it too wait for the answer."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[tuple[str, str, str], threading.Lock] = {}
        self._answers: dict[tuple[str, str, str], str | None] = {}

    def _why(self, page: str, options: BuildOptions) -> str | None:
        key = (page, repr(options.proxy), str(options.ca_bundle))
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            if key not in self._answers:
                self._answers[key] = _probe(page, options)
            return self._answers[key]

    def unreachable_index(self, entry: Entry, options: BuildOptions) -> str | None:
        """One line for the first index `entry`'s resolution needs that cannot be reached (its
        host does not resolve, refuses, or never answers); None when each answers something.

        The request goes through the chosen proxy (or, without one, the environment's, which
        uv reads too) and trusts the --ca-bundle; it carries no credentials."""
        if options.offline:
            return None
        for url, what, fix in _indexes(entry, options):
            page = f"{public_url(url) or url}".rstrip("/") + f"/{_framework_name(entry)}/"
            why = self._why(page, options)
            if why is not None:
                return f"{what} cannot be reached ({why}); {fix}"
        return None
