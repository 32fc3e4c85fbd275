"""The deadline's arithmetic in the one retry policy (envbuild.net.bounded), on a clock the test
moves: each try and each wait come out of one deadline, and a wait that would not end before it
is never started."""

from __future__ import annotations

import io

import pytest
import requests

from envbuild.net.bounded import (
    CONNECT_TIMEOUT,
    READ_TIMEOUT,
    Deadline,
    DeadlineExceeded,
    Overloaded,
    Retries,
)


class Clock:
    """Monotonic seconds that pass only when a try says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def answer(status: int, **headers: str) -> requests.Response:
    response = requests.Response()
    response.status_code = status
    response.headers.update(headers)
    response.raw = io.BytesIO()
    return response


def failing(clock: Clock, seconds: float, tries: list[float]) -> requests.Response:
    """A try that fails after `seconds` (a connection closed without an answer)."""
    tries.append(clock.now)
    clock.now += seconds
    raise requests.ConnectionError("the connection was closed")


@pytest.mark.parametrize("spent", [2.6, 2.9, 2.99])
def test_a_failed_try_that_leaves_less_than_the_backoff_ends_the_request(spent: float) -> None:
    clock = Clock()
    retries = Retries(tries=4, backoff=0.5, deadline=Deadline(3, clock=clock))
    tries: list[float] = []
    with pytest.raises(DeadlineExceeded) as caught:
        retries.send(lambda: failing(clock, spent, tries), label="GET /v2/")
    assert len(tries) == 1  # never another try
    assert caught.value.tries == 1
    assert caught.value.last.startswith("failed: ")


@pytest.mark.parametrize("retry_after", ["3", "5", "86400"])
def test_a_retry_after_past_the_deadline_is_not_waited_for(retry_after: str) -> None:
    clock = Clock()
    retries = Retries(tries=4, backoff=0.5, deadline=Deadline(3, clock=clock))
    asked: list[float] = []

    def overloaded() -> requests.Response:
        asked.append(clock.now)
        return answer(503, **{"Retry-After": retry_after})

    with pytest.raises(DeadlineExceeded) as caught:
        retries.send(overloaded, label="GET /v2/")
    assert asked == [1000.0]
    assert (caught.value.tries, caught.value.last) == (1, "answered HTTP 503")


def test_a_try_cut_short_by_the_deadline_names_no_cause() -> None:
    clock = Clock()
    retries = Retries(tries=4, backoff=0.5, deadline=Deadline(3, clock=clock))
    with pytest.raises(DeadlineExceeded) as caught:
        retries.send(lambda: failing(clock, 3.0, []), label="GET /v2/")
    assert (caught.value.tries, caught.value.last) == (0, "")


def test_without_a_deadline_the_tries_are_counted() -> None:
    asked: list[int] = []

    def overloaded() -> requests.Response:
        asked.append(1)
        return answer(503)

    with pytest.raises(Overloaded) as caught:
        Retries(tries=4, backoff=0).send(overloaded, label="GET /simple/")
    assert (len(asked), caught.value.tries) == (4, 4)


@pytest.mark.parametrize("spent", [0.0, 1.0, 25.0, 99.5])
def test_each_try_gets_only_what_is_left(spent: float) -> None:
    clock = Clock()
    deadline = Deadline(100, clock=clock)
    clock.now += spent
    left = 100 - spent
    assert deadline.timeout() == (min(CONNECT_TIMEOUT, left), min(READ_TIMEOUT, left))
    clock.now += left
    with pytest.raises(DeadlineExceeded):
        deadline.timeout()
