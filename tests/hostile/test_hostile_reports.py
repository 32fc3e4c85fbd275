"""Hostile build reports given to `envbuild publish --merge` (CI's merge of per-platform jobs).

A report is read as untrusted: a file that is no report, a document of the wrong shape, an entry
id or a reference that is not what envbuild writes, two reports that disagree. Each is one line
naming `--merge`, the file and the place, exit 2, and the registry sees no request. A report of
a failed platform is no error of the input: that entry's index is refused (exit 1), after the
reports are read. Runs in-process; the tier refuses Docker.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from envbuild.cli.main import main
from envbuild.core.models import Entry, Knowledge, Selection
from envbuild.core.names import shown
from envbuild.core.platforms import AMD64, ARM64
from envbuild.plan.matrix import knowledge_matrix, make_plan
from envbuild.plan.matrix_file import default_matrix_path, load_matrix
from envbuild.publish.merge import MAX_REPORT_BYTES
from tests.support.hostile_registry import HostileRegistry

SELECTORS = ("--framework", "jax", "--cuda", "cpu", "--platform", f"{AMD64},{ARM64}")
GOOD_REFERENCE = (
    "127.0.0.1:5000/team/jax:0.10.2-cpu-py3.11-bookworm-0123456789ab@sha256:" + "e" * 64
)


@pytest.fixture
def watcher() -> Iterator[HostileRegistry]:
    with HostileRegistry() as server:
        yield server


@pytest.fixture(autouse=True)
def _own_docker_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "docker-config").mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))


def planned_ids(knowledge: Knowledge) -> list[str]:
    chosen = Selection(framework="jax", cuda="cpu", platform=f"{AMD64},{ARM64}")
    matrix = knowledge_matrix(knowledge, chosen, load_matrix(default_matrix_path(), knowledge))
    entries: list[Entry] = list(make_plan(knowledge, matrix, chosen).entries)
    return [e.id for e in entries]


def result(entry_id: str, **fields: Any) -> dict[str, Any]:
    return {"entry": {"id": entry_id}, "passed": True, "pushed": GOOD_REFERENCE, **fields}


def documents(entry_id: str) -> dict[str, tuple[bytes, str]]:
    """Broken reports and what the line says about each."""

    def doc(value: Any) -> bytes:
        return json.dumps(value).encode()

    return {
        "not-json": (b"<html>artifact expired</html>", "not JSON"),
        "deep-nesting": (b"[" * 100_000, "not JSON"),
        "a-list": (doc([result(entry_id)]), "no results list"),
        "results-object": (doc({"results": {"a": 1}}), "no results list"),
        "results-missing": (doc({"entries": []}), "no results list"),
        "result-string": (doc({"results": ["x"]}), "results[0]: entry.id is missing"),
        "entry-id-int": (doc({"results": [result(entry_id, entry={"id": 7})]}), "results[0]: entry.id"),
        "entry-id-path": (doc({"results": [result(entry_id, entry={"id": "../../etc"})]}), "entry.id"),
        "entry-id-newline": (doc({"results": [result(entry_id, entry={"id": "a\nb"})]}), "entry.id"),
        "entry-id-long": (doc({"results": [result(entry_id, entry={"id": "a" * 201})]}), "entry.id"),
        "pushed-int": (doc({"results": [result(entry_id, pushed=5)]}), "is not an image reference"),
        "pushed-no-digest": (doc({"results": [result(entry_id, pushed=GOOD_REFERENCE.split("@")[0])]}),
                             "is not an image reference"),
        "pushed-no-hash": (doc({"results": [result(entry_id, pushed="r/jax:latest@sha256:" + "e" * 64)]}),
                           "is not an image reference"),
        "pushed-spaces": (doc({"results": [result(entry_id, pushed=GOOD_REFERENCE + " x")]}),
                          "is not an image reference"),
        "pushed-ansi": (doc({"results": [result(entry_id, pushed="\x1b[31m" + GOOD_REFERENCE)]}),
                        "is not an image reference"),
    }  # fmt: skip


def files(tmp_path: Path) -> dict[str, tuple[Callable[[], Path], str]]:
    """Paths that are no report file."""

    def fifo() -> Path:
        path = tmp_path / "fifo.json"
        os.mkfifo(path)
        return path

    def folder() -> Path:
        path = tmp_path / "folder.json"
        path.mkdir()
        return path

    def huge() -> Path:
        path = tmp_path / "huge.json"
        with path.open("wb") as handle:
            handle.truncate(MAX_REPORT_BYTES + 1)
        return path

    return {
        "missing": (lambda: tmp_path / "nothing.json", "no such file"),
        "fifo": (fifo, "a named pipe (FIFO), not a report"),
        "folder": (folder, "a directory, not a report"),
        "device": (lambda: Path("/dev/zero"), "a character device, not a report"),
        "huge": (huge, "larger than 16 MiB"),
    }


def merge(watcher: HostileRegistry, *paths: Path) -> Any:
    arguments = [a for path in paths for a in ("--merge", str(path))]
    return CliRunner().invoke(
        main, ["publish", "--registry", f"{watcher.host}/team", *SELECTORS, *arguments]
    )


def assert_one_line(outcome: Any, code: int, *said: str) -> str:
    assert outcome.exit_code == code, outcome.output
    (line,) = outcome.stderr.strip().splitlines()
    for text in said:
        assert text in line
    assert "\x1b" not in line
    assert "Traceback" not in outcome.output
    return str(line)


@pytest.mark.parametrize("name", sorted(documents("x")))
def test_a_broken_report_is_one_line_naming_it_before_any_request(
    tmp_path: Path, watcher: HostileRegistry, knowledge: Knowledge, name: str
) -> None:
    body, said = documents(planned_ids(knowledge)[0])[name]
    path = tmp_path / f"{name}.json"
    path.write_bytes(body)
    assert_one_line(merge(watcher, path), 2, f"--merge {shown(str(path))}: ", said)
    assert watcher.seen == []


@pytest.mark.parametrize("name", ["missing", "fifo", "folder", "device", "huge"])
def test_a_path_that_is_no_report_is_refused_without_reading_it(
    tmp_path: Path, watcher: HostileRegistry, name: str
) -> None:
    make, said = files(tmp_path)[name]
    assert_one_line(merge(watcher, make()), 2, "--merge ", said)
    assert watcher.seen == []


def test_two_reports_that_disagree_on_an_image_are_refused(
    tmp_path: Path, watcher: HostileRegistry, knowledge: Knowledge
) -> None:
    entry_id = planned_ids(knowledge)[0]
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"results": [result(entry_id)]}))
    other = GOOD_REFERENCE.replace("0123456789ab", "ba9876543210")
    second.write_text(json.dumps({"results": [result(entry_id, pushed=other)]}))
    assert_one_line(merge(watcher, first, second), 2, f"{entry_id} was published as another image")
    assert watcher.seen == []


def test_reports_of_entries_not_selected_are_refused(
    tmp_path: Path, watcher: HostileRegistry
) -> None:
    path = tmp_path / "other.json"
    path.write_text(json.dumps({"results": [result("torch2.4.1-cu121-py3.11-bookworm")]}))
    assert_one_line(merge(watcher, path), 2, "the reports name no selected entry")
    assert watcher.seen == []
