"""The reports of a build run: the JSON document, JUnit XML (parsed back) and the Markdown summary."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.core.models import Entry, Knowledge
from envbuild.core.redact import forget_all, register_url
from envbuild.core.results import SmokeResult
from envbuild.report.documents import (
    EntryResult,
    build_document,
    junit_xml,
    markdown_summary,
    write_json,
    write_text,
)
from tests.support.result_support import four_entries, image
from tests.support.result_support import smoke as shared_smoke

SKIPPED = "not built: an earlier entry failed (use --keep-going to build the rest)"
BUILD_ERROR = "build failed: exit 1 (last output: Collecting jax | ERROR: No matching distribution)"
PAYLOAD = {
    "train": {"loss_first": 2.3, "loss_last": 1.1, "loss_fell": True},
    "allreduce": {"backend": "gloo", "world_size": 2, "busbw_gbps": 0.5, "correct": True},
}


@pytest.fixture
def entries(knowledge: Knowledge) -> tuple[Entry, ...]:
    return four_entries(knowledge)


def smoke(entry: Entry, image_id: str, *, passed: bool) -> SmokeResult:
    return shared_smoke(entry, image_id, passed=passed, payload=PAYLOAD)


def results_of(entries: tuple[Entry, ...], first_error: str = BUILD_ERROR) -> list[EntryResult]:
    """Built and passed; found and reused; build failed; built but the smoke test failed."""
    a, b, c, d = entries
    built, found, smoke_failed = image(a, "a", built=True), image(b, "b", built=False), image(d, "d", built=True)  # fmt: skip
    return [
        EntryResult(entry=a, image=built, smoke=smoke(a, built.id, passed=True), error=None, seconds=20),
        EntryResult(
            entry=b, image=found, smoke=smoke(b, found.id, passed=True), error=None,
            smoke_reused=True, seconds=1,
        ),
        EntryResult(entry=c, image=None, smoke=None, error=first_error, seconds=5),
        EntryResult(entry=d, image=smoke_failed, smoke=smoke(d, smoke_failed.id, passed=False), error=None),
    ]  # fmt: skip


def test_the_json_report_says_what_happened_to_each_entry(
    entries: tuple[Entry, ...], tmp_path: Path
) -> None:
    path = tmp_path / "out" / "report.json"
    write_json(path, build_document(results_of(entries)))
    document = json.loads(path.read_text(encoding="utf-8"))

    assert document["passed"] is False
    rows = document["results"]
    assert [r["entry"]["id"] for r in rows] == [e.id for e in entries]
    assert [r["status"] for r in rows] == ["built", "found", "failed", "built"]
    assert [r["passed"] for r in rows] == [True, True, False, False]
    assert [r["smoke_reused"] for r in rows] == [False, True, False, False]
    assert rows[2]["error"] == BUILD_ERROR
    assert rows[2]["image"] is None
    assert rows[0]["image"]["id"] == "sha256:" + "a" * 64
    assert rows[0]["smoke"]["passed"] is True
    assert rows[0]["smoke"]["train"] == PAYLOAD["train"]
    assert rows[3]["smoke"]["checks"][1] == {
        "name": "allreduce", "passed": False, "detail": "gloo all-reduce over 2 ranks: got 2.0",
    }  # fmt: skip
    assert list(tmp_path.joinpath("out").iterdir()) == [path]  # no temporary file left


def test_junit_has_one_case_per_entry_and_each_failure_carries_its_reason(
    entries: tuple[Entry, ...],
) -> None:
    suite = ET.fromstring(junit_xml(results_of(entries)))

    assert suite.tag == "testsuite"
    assert (suite.get("tests"), suite.get("failures")) == ("4", "2")
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [e.id for e in entries]
    assert [c.get("classname") for c in cases] == [f"envbuild.{e.framework}" for e in entries]
    assert [c.find("failure") is None for c in cases] == [True, True, False, False]
    build_failure = cases[2].find("failure")
    assert build_failure is not None
    assert (build_failure.get("message"), build_failure.text) == (BUILD_ERROR, BUILD_ERROR)
    smoke_failure = cases[3].find("failure")
    assert smoke_failure is not None
    assert smoke_failure.get("message") == "allreduce: gloo all-reduce over 2 ranks: got 2.0"
    out = cases[0].find("system-out")
    assert out is not None
    assert (out.text or "").startswith("PASS smoke")


def test_junit_of_skipped_entries_names_the_way_to_build_them(entries: tuple[Entry, ...]) -> None:
    skipped = [EntryResult(entry=e, image=None, smoke=None, error=SKIPPED) for e in entries]
    suite = ET.fromstring(junit_xml(skipped))
    reasons = [c.find("failure").get("message") for c in suite.iter("testcase")]  # type: ignore[union-attr]
    assert reasons == [SKIPPED] * len(entries)


def hostile_reasons() -> Iterator[str]:
    """Failure reasons with what XML must escape, and very long ones."""
    for special in ("<", ">", "&", '"', "'", "]]>", "<!--", "&amp;"):
        yield f"pip said {special}torch{special}"
    yield "x" * 5000
    yield "ünïcödé → ✓"


@pytest.mark.parametrize("reason", list(hostile_reasons()))
def test_junit_stays_well_formed_whatever_the_reason_holds(
    entries: tuple[Entry, ...], reason: str
) -> None:
    suite = ET.fromstring(junit_xml(results_of(entries, first_error=reason)))
    failure = suite.findall("testcase")[2].find("failure")
    assert failure is not None
    assert failure.text == reason
    assert failure.get("message") == reason[:500]


def control_reasons() -> Iterator[str]:
    """What a build's output can carry into a reason: ANSI colours, a NUL, a backspace."""
    for char in ("\x1b", "\x00", "\x08", "\x0c"):
        yield f"ERROR:{char}[31m No matching distribution"


@pytest.mark.parametrize("reason", list(control_reasons()))
def test_junit_stays_well_formed_with_control_characters(
    entries: tuple[Entry, ...], reason: str
) -> None:
    suite = ET.fromstring(junit_xml(results_of(entries, first_error=reason)))
    failure = suite.findall("testcase")[2].find("failure")
    assert failure is not None
    assert "No matching distribution" in (failure.text or "")


def test_a_registered_secret_never_reaches_the_written_junit(
    entries: tuple[Entry, ...], tmp_path: Path
) -> None:
    register_url("https://ci:hunter2-pw@mirror.example/simple")
    try:
        reason = "pip: 401 from https://ci:hunter2-pw@mirror.example/simple/jax/"
        path = tmp_path / "junit.xml"
        write_text(path, junit_xml(results_of(entries, first_error=reason)))
        text = path.read_text(encoding="utf-8")
    finally:
        forget_all()
    assert "hunter2-pw" not in text
    failure = ET.fromstring(text).findall("testcase")[2].find("failure")
    assert failure is not None
    assert "mirror.example" in (failure.text or "")


def test_markdown_has_a_row_per_entry_with_its_verdict(entries: tuple[Entry, ...]) -> None:
    text = markdown_summary(results_of(entries))
    lines = text.splitlines()

    assert lines[0] == "### envbuild: 2/4 entries passed"
    rows = [line for line in lines if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == [e.id for e in entries]
    # The build error's "|" must not add a column: every row has the header's six.
    assert {row.count("|") for row in rows} == {lines[2].count("|")} == {7}
    cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]
    assert [c[1][:1] for c in cells] == ["✅", "✅", "❌", "❌"]
    assert cells[2][1] == "❌ " + BUILD_ERROR.replace("|", "/")
    assert cells[3][1] == "❌ smoke test failed"
    assert cells[0][2] == f"`{'a' * 12}` (built)"
    assert cells[1][2] == f"`{'b' * 12}` (found)"
    assert cells[2][2] == "-"
    assert cells[0][3] == "2.300 → 1.100"
    assert cells[0][4] == "gloo x2, 0.50 GB/s"
    assert cells[0][5] == "20s"
