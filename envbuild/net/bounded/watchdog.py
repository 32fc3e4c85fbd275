"""The watchdog: a deadline that holds even inside one socket read."""

from __future__ import annotations

import contextlib
import socket
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ConnectTimeoutError
from urllib3.util.connection import allowed_gai_family

from envbuild.net.bounded.bodies import MAX_REDIRECTS, Deadline

#
# Timeouts bound each socket read, and read_body checks the deadline between reads, but a
# status line, a header or a chunk-size line dripped a byte at a time is read inside http.client,
# where no check runs. So, while an operation is `watched`, each socket that its requests open
# or reuse is noted, and when the deadline passes a timer shuts them down: the blocked read
# returns, the request fails, and the caller sees the deadline gone.
#
# Before a socket exists there is nothing to shut down, and urllib3 gives each address of a
# name the whole connect timeout: a name with many addresses that all drop the handshake would
# take that many timeouts. So a watched connection tries the addresses itself, each within what
# is left of the deadline.

_watching = threading.local()


class _Watch:
    def __init__(self, deadline: Deadline) -> None:
        self.deadline = deadline
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
    watch = _Watch(deadline)
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


def _connect(conn: HTTPConnection, connect: Callable[[], socket.socket]) -> socket.socket:
    """`connect()` (urllib3's _new_conn) address by address, each given at most what is left
    of the watched deadline; as urllib3 does it when no operation is watched."""
    watch: _Watch | None = getattr(_watching, "watch", None)
    if watch is None:
        return connect()
    name, timeout = conn._dns_host, conn.timeout
    try:
        found = socket.getaddrinfo(name, conn.port, allowed_gai_family(), socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return connect()  # which fails the same way, with urllib3's own error
    failure: ConnectTimeoutError | None = None
    try:
        for address in dict.fromkeys(_numeric(info[4]) for info in found):
            left = watch.deadline.remaining()
            if left <= 0:
                break
            conn._dns_host = address
            conn.timeout = min(timeout, left) if isinstance(timeout, int | float) else left
            try:
                return connect()
            except ConnectTimeoutError as exc:  # NewConnectionError (refused, unreachable) too
                failure = exc
    finally:
        conn._dns_host, conn.timeout = name, timeout
    if failure is None:
        raise ConnectTimeoutError(conn, f"Connection to {name} timed out: the deadline passed")
    raise failure


def _numeric(sockaddr: tuple[Any, ...]) -> str:
    """The address of a getaddrinfo sockaddr as text, an IPv6 scope kept (fe80::1%2)."""
    scope = sockaddr[3] if len(sockaddr) == 4 else 0
    return f"{sockaddr[0]}%{scope}" if scope else str(sockaddr[0])


class _WatchedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = _connect(self, super()._new_conn)
        _note(sock)  # before the TLS handshake, which can be dripped too
        return sock

    def request(self, *args: Any, **kwargs: Any) -> None:
        _note(self.sock)  # a connection reused from the pool
        super().request(*args, **kwargs)


class _WatchedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        sock = _connect(self, super()._new_conn)
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
