"""One deadline per registry operation, whatever the registry does with the time.

Each kind of slow answer (never answering, headers then nothing, bytes dripped just under the
per-read timeout, a chunked trickle, a 503 whose Retry-After is then followed by a stall or
would pass the deadline, a hang-up just before it, valid answers that each take most of it, a
token service that stalls, a redirect to a server that stalls) meets each operation: `envbuild
verify` as a process, and the client's operations in this process. Each must end with one line
that names the registry, what it was doing and ENVBUILD_REGISTRY_TIMEOUT, also when the deadline
leaves no time for another try. A name whose many addresses all drop the handshake gets one
deadline, not one per address. The deadlines are a few seconds; the hang guards (the subprocess
timeout, a thread's join) are 20 s, which a deadline started again on each try, request or
address overruns.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from envbuild.core.errors import EnvbuildError
from envbuild.publish.verify import Target, published_already
from envbuild.registry import DEADLINE_ENV, RegistryClient
from tests.hostile.test_registry_hostile import (
    CREDENTIALS,
    DEADLINE,
    PUBLISHED,
    SUBJECT,
    behind_auth,
    error_line,
    token_realm,
    verify,
)
from tests.support.hostile_registry import (
    EVIDENCE_TYPE,
    OCI_MANIFEST,
    REPOSITORY,
    TAG,
    Answer,
    Handler,
    HostileRegistry,
    Seen,
    chunked,
    one_byte_at_a_time,
)

HANG_GUARD = 20  # seconds; a hang guard, not a timing assertion
CLIENT_DEADLINE = 2.0  # seconds: the in-process client's deadline, short to keep the tier quick
STATUS_AND_HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"


def stall(seen: Seen) -> Answer:
    return Answer(stall=True)


def headers_then_stall(seen: Seen) -> Answer:
    """Headers announcing a body that never comes (to a HEAD, which has no body: half the
    headers)."""
    if seen.method == "HEAD":
        return Answer(raw=[STATUS_AND_HEADERS], hold=True)
    return Answer(raw=[STATUS_AND_HEADERS + b"Content-Length: 1000\r\n\r\n{"], hold=True)


def dripped(pause: float) -> Callable[[Seen], Answer]:
    """The status line and headers a byte at a time, each byte `pause` after the last."""
    return lambda seen: Answer(raw=one_byte_at_a_time(STATUS_AND_HEADERS * 20), pause=pause)


def trickled(pause: float) -> Callable[[Seen], Answer]:
    """A chunked body of one-byte chunks, `pause` apart (to a HEAD: its headers dripped)."""

    def answer(seen: Seen) -> Answer:
        if seen.method == "HEAD":
            return dripped(pause)(seen)
        body = chunked(one_byte_at_a_time(PUBLISHED.manifest()))
        return Answer(headers={"Transfer-Encoding": "chunked"}, body=body, length=None, pause=pause)

    return answer


def first_then(first: Answer, then: Callable[[Seen], Answer]) -> Callable[[Seen], Answer]:
    """`first` to the first request for each method and path, `then` to every later one."""
    asked: set[tuple[str, str]] = set()
    lock = threading.Lock()

    def answer(seen: Seen) -> Answer:
        with lock:
            fresh = (seen.method, seen.path) not in asked
            asked.add((seen.method, seen.path))
        return first if fresh else then(seen)

    return answer


def slowly(delay: float, inner: Handler) -> Handler:
    """`inner`'s answers, each after `delay` seconds: every one in time, not all of them."""

    def answer(seen: Seen) -> Answer:
        time.sleep(delay)
        return inner(seen)

    return answer


Serve = Callable[[HostileRegistry], Handler]  # given the server that stalls, the registry


def everywhere(answer: Callable[[Seen], Answer]) -> Serve:
    return lambda stalling: answer


def slow_kinds(seconds: float) -> dict[str, Serve]:
    """Each way a registry can spend an operation's `seconds`, as the registry's handler."""
    under = 0.8 * seconds  # the per-read timeout is at most what is left of the deadline
    past = f"{2 * seconds:g}"
    return {
        "never-answers": everywhere(stall),
        "headers-then-stall": everywhere(headers_then_stall),
        "dripped-under-the-read-timeout": everywhere(dripped(under)),
        "chunked-trickle": everywhere(trickled(under)),
        "503-retry-after-then-stall": everywhere(
            first_then(Answer(status=503, headers={"Retry-After": "1"}), stall)
        ),
        "503-retry-after-past-the-deadline": everywhere(
            lambda seen: Answer(status=503, headers={"Retry-After": past})
        ),
        "hangs-up-just-before-the-deadline": everywhere(
            lambda seen: Answer(raw=[b""], pause=0.9 * seconds)
        ),
        "valid-answers-each-taking-most-of-it": lambda stalling: slowly(
            0.6 * seconds, behind_auth(PUBLISHED.routes())
        ),
        "token-service-stalls": token_realm("http://{self}/token", stall),
        "token-service-elsewhere-stalls": lambda stalling: token_realm(
            f"{stalling.url}/token", stall
        )(stalling),
        "redirect-to-a-stalling-server": lambda stalling: (
            lambda seen: Answer(status=303, headers={"Location": stalling.url + seen.path})
        ),
    }


def names_the_deadline(line: str, host: str, seconds: float) -> None:
    """The registry, what it was doing, the deadline and its setting, on one line."""
    assert f"registry {host} " in line, line
    assert REPOSITORY in line, line
    assert f"within {seconds:g} s" in line, line
    assert DEADLINE_ENV in line, line
    assert "\n" not in line


VERIFY_KINDS = slow_kinds(float(DEADLINE))


@pytest.mark.parametrize("kind", list(VERIFY_KINDS))
def test_verify_ends_within_its_deadline(kind: str, tmp_path: Path) -> None:
    with HostileRegistry(stall) as stalling, HostileRegistry() as registry:
        registry.handler = VERIFY_KINDS[kind](stalling)
        result = verify(registry.host, tmp_path, timeout=HANG_GUARD)
    names_the_deadline(error_line(result), registry.host, float(DEADLINE))


def published(client: RegistryClient) -> Any:
    where = Target(host=client.host, repository=REPOSITORY, tag=TAG, immutable=TAG)
    return published_already(client, where)


OPERATIONS: dict[str, Callable[[RegistryClient], Any]] = {
    "manifest_digest": lambda client: client.manifest_digest(REPOSITORY, TAG),
    "get_manifest": lambda client: client.get_manifest(REPOSITORY, TAG),
    "referrers": lambda client: client.referrers(REPOSITORY, SUBJECT, EVIDENCE_TYPE),
    "push_blob": lambda client: client.push_blob(REPOSITORY, b"evidence", "text/plain"),
    "push_manifest": lambda client: client.push_manifest(
        REPOSITORY, TAG, PUBLISHED.manifest(), OCI_MANIFEST
    ),
    "published_already": published,
}
CLIENT_KINDS = slow_kinds(CLIENT_DEADLINE)


def failure_of(client: RegistryClient, operation: str) -> str:
    """The one error `operation` ends with, run in a thread that the hang guard waits for."""
    outcome: list[BaseException] = []

    def attempt() -> None:
        try:
            OPERATIONS[operation](client)
        except EnvbuildError as exc:
            outcome.append(exc)

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(HANG_GUARD)
    assert not worker.is_alive()
    client.close()
    assert len(outcome) == 1
    return str(outcome[0])


@pytest.mark.parametrize("kind", list(CLIENT_KINDS))
@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_a_client_operation_ends_within_its_deadline(operation: str, kind: str) -> None:
    with HostileRegistry(stall) as stalling, HostileRegistry() as registry:
        registry.handler = CLIENT_KINDS[kind](stalling)
        client = RegistryClient(registry.host, credentials=CREDENTIALS, deadline=CLIENT_DEADLINE)
        line = failure_of(client, operation)
    names_the_deadline(line, registry.host, CLIENT_DEADLINE)


NAME = "registry.many-addresses.example"


@contextlib.contextmanager
def blackholes(count: int) -> Iterator[tuple[list[str], int]]:
    """`count` loopback addresses listening on one port, each with its queue of connections
    full: a handshake with any of them waits until the connect timeout, as with a server whose
    network drops it."""
    for _ in range(20):  # another process may hold the port on one of the addresses
        listeners: list[socket.socket] = []
        addresses = [f"127.0.0.{n}" for n in range(2, count + 2)]
        try:
            for address in addresses:
                listener = socket.socket()
                listeners.append(listener)
                port = listeners[0].getsockname()[1] if len(listeners) > 1 else 0
                listener.bind((address, port))
                listener.listen(0)
        except OSError:
            for listener in listeners:
                listener.close()
            continue
        port = listeners[0].getsockname()[1]
        fillers = [socket.create_connection((address, port), timeout=5) for address in addresses]
        try:
            yield addresses, port
        finally:
            for sock in [*fillers, *listeners]:
                sock.close()
        return
    pytest.fail("no port free on every loopback address")


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_a_name_with_many_silent_addresses_gets_one_deadline_not_one_each(
    operation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with blackholes(12) as (addresses, port):
        resolve = socket.getaddrinfo

        def many(host: Any, *args: Any, **kwargs: Any) -> Any:
            """The resolver's answer for a name with many addresses (round-robin DNS)."""
            if host != NAME:
                return resolve(host, *args, **kwargs)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in addresses]

        monkeypatch.setattr(socket, "getaddrinfo", many)
        host = f"{NAME}:{port}"
        client = RegistryClient(host, credentials=None, scheme="http", deadline=CLIENT_DEADLINE)
        client.session.trust_env = False  # no proxy from the environment: these addresses
        line = failure_of(client, operation)
    names_the_deadline(line, host, CLIENT_DEADLINE)
