"""The build run's progress as a log reads it (stderr is not a terminal under pytest): one line
per change of state, whole lines from many workers, and the summary table at the end."""

from __future__ import annotations

import re
import threading

import pytest

from envbuild.cli.progress import ProgressView
from envbuild.core.models import Entry, Knowledge
from envbuild.core.results import EntryResult
from envbuild.pipeline.entries import Event
from tests.support.result_support import four_entries, image, smoke

STAMP = re.compile(r"^\[ *\d+\.\d+s\] ")


def event(entry_id: str, state: str, detail: str = "") -> Event:
    return Event(entry_id=entry_id, state=state, detail=detail)


def logged(err: str) -> list[str]:
    """The lines printed, without their elapsed-time stamps (each line must have one)."""
    lines = err.splitlines()
    assert all(STAMP.match(line) for line in lines), lines
    return [STAMP.sub("", line) for line in lines]


def test_each_change_of_state_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with ProgressView(["torch", "jax"]) as view:
        for change in (
            event("torch", "building"),
            event("torch", "step", "1/12"),  # steps redraw a terminal; a log skips them
            event("torch", "step", "2/12"),
            event("torch", "building"),  # no change, nothing new to say
            event("torch", "smoke"),
            event("torch", "passed"),
            event("jax", "building"),
            event("jax", "failed", "build failed: exit 1"),
            event("bench", "skipped", "an earlier entry failed"),  # an id not planned
        ):
            view.event(change)

    assert logged(capsys.readouterr().err) == [
        "torch: building",
        "torch: smoke",
        "torch: passed",
        "jax: building",
        "jax: failed: build failed: exit 1",
        "bench: skipped: an earlier entry failed",
    ]


def test_a_repeated_state_with_news_is_logged_again(capsys: pytest.CaptureFixture[str]) -> None:
    view = ProgressView(["torch"])
    view.event(event("torch", "smoke", "payload"))
    view.event(event("torch", "smoke", "all-reduce"))
    assert logged(capsys.readouterr().err) == ["torch: smoke: payload", "torch: smoke: all-reduce"]


def test_workers_logging_at_once_print_whole_lines(capsys: pytest.CaptureFixture[str]) -> None:
    ids = [f"entry-{n}" for n in range(8)]
    view = ProgressView(ids)

    def work(entry_id: str) -> None:
        for state in ("building", "smoke", "passed"):
            view.event(event(entry_id, state, "x" * 200))

    threads = [threading.Thread(target=work, args=(entry_id,)) for entry_id in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)  # a hang guard

    lines = logged(capsys.readouterr().err)
    assert sorted(lines) == sorted(
        f"{entry_id}: {state}: {'x' * 200}"
        for entry_id in ids
        for state in ("building", "smoke", "passed")
    )


@pytest.fixture
def entries(knowledge: Knowledge) -> tuple[Entry, ...]:
    return four_entries(knowledge)


def test_the_summary_is_a_table_then_the_failures(entries: tuple[Entry, ...]) -> None:
    a, b, c, d = entries
    built, found, bad = image(a, "a", built=True), image(b, "b", built=False), image(d, "d", built=True)  # fmt: skip
    results = [
        EntryResult(entry=a, image=built, smoke=smoke(a, built.id, passed=True), error=None, seconds=20.04),
        EntryResult(entry=b, image=found, smoke=smoke(b, found.id, passed=True), error=None, smoke_reused=True),
        EntryResult(entry=c, image=None, smoke=None, error="build failed: exit 1", seconds=5),
        EntryResult(entry=d, image=bad, smoke=smoke(d, bad.id, passed=False), error=None),
    ]  # fmt: skip

    lines = ProgressView([]).summary(results)

    header, *rows = lines[:5]
    assert header.split() == ["ENTRY", "RESULT", "IMAGE", "SMOKE", "TIME"]
    assert rows[0].split() == [a.id, "ok", "a" * 12, "built", "passed", "20.0s"]
    assert rows[1].split() == [
        b.id,
        "ok",
        "b" * 12,
        "found",
        "passed",
        "(vetted",
        "before)",
        "0.0s",
    ]
    assert rows[2].split() == [c.id, "FAILED", "-", "-", "5.0s"]
    assert rows[3].split() == [d.id, "FAILED", "d" * 12, "built", "FAILED", "0.0s"]
    result_column = header.index("RESULT")
    assert {row[result_column - 2 : result_column] for row in rows} == {"  "}  # aligned
    assert {row[result_column] for row in rows} == {"o", "F"}
    assert lines[5:] == [
        f"FAILED {c.id}: build failed: exit 1",
        f"FAILED {d.id}: allreduce: gloo all-reduce over 2 ranks: got 2.0",
        "2/4 entries passed",
    ]


def test_an_empty_run_summarises_to_nothing_passed() -> None:
    assert ProgressView([]).summary([])[-1] == "0/0 entries passed"
