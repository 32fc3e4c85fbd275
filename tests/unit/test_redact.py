"""Secrets leave envbuild through no message, log record, report or local record."""

from __future__ import annotations

import base64
import json
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from envbuild.core import redact
from envbuild.core.errors import BuildFailed, EnvbuildError
from envbuild.core.places import StateError
from envbuild.core.store import ResultStore
from envbuild.report.documents import write_json, write_text

SECRET = "p%40ss%20w0rd%2Fwith%25-odd+chars"  # as written in a URL: percent-encoded
USER = "team-bot"
URL = f"https://{USER}:{SECRET}@pypi.corp.example/simple"
DECODED = "p@ss w0rd/with%-odd+chars"


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    redact.forget_all()
    yield
    redact.forget_all()


def leaks(text: str) -> list[str]:
    forms = [SECRET, DECODED, "w0rd/with"]
    return [form for form in forms if form in text]


def test_the_docker_py_build_url_is_redacted() -> None:
    redact.register_url(URL)
    # What docker-py puts in the /build query, and so into its APIError text.
    query = urlencode({"buildargs": json.dumps({"PIP_INDEX_URL": URL})})
    error = f"400 Client Error for http+docker://localhost/v1.41/build?{query}: Bad Request"
    assert "w0rd" in query, "the test must start from a text that holds the secret"
    assert leaks(redact.redact(error)) == []
    assert "w0rd" not in redact.redact(error)


@pytest.mark.parametrize(
    "render",
    [
        lambda s: s,
        lambda s: json.dumps({"url": s}),
        lambda s: urlencode({"q": s}),
        lambda s: urlencode({"q": urlencode({"q": s})}),
        lambda s: f"GET {s} HTTP/1.1",
        lambda s: repr(s),
    ],
    ids=["plain", "json", "query", "query-twice", "log-line", "repr"],
)
def test_every_form_of_the_url_is_redacted(render: object) -> None:
    redact.register_url(URL)
    text = render(URL)  # type: ignore[operator]
    assert "w0rd" not in redact.redact(text)


def test_basic_credentials_are_redacted_in_their_header_form() -> None:
    redact.register_credentials(USER, "hunter2-registry")
    header = "Basic " + base64.b64encode(f"{USER}:hunter2-registry".encode()).decode()
    assert redact.redact(f"Authorization: {header}") == "Authorization: Basic ***"


def test_error_messages_are_redacted_when_made() -> None:
    redact.register_url(URL)
    error = BuildFailed(f"the engine refused the build: {URL}")
    assert leaks(error.message) == []
    assert leaks(str(error)) == []
    assert isinstance(error, EnvbuildError)


def test_log_records_are_redacted_by_the_cli_filter(caplog: pytest.LogCaptureFixture) -> None:
    redact.register_url(URL)
    handler = logging.StreamHandler()
    records: list[str] = []
    handler.emit = lambda record: records.append(record.getMessage())  # type: ignore[method-assign]
    handler.addFilter(redact.RedactingFilter())
    logger = logging.getLogger("urllib3.connectionpool")
    logger.addHandler(handler)
    try:
        logger.warning(
            'http://localhost:None "POST /v1.41/build?%s HTTP/1.1" 200', urlencode({"b": URL})
        )
        try:
            raise ValueError(URL)
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    assert len(records) == 2
    assert all(leaks(r) == [] and "w0rd" not in r for r in records)


def test_reports_are_redacted(tmp_path: Path) -> None:
    redact.register_url(URL)
    write_json(tmp_path / "r.json", {"error": f"pip failed on {URL}"})
    write_text(tmp_path / "j.xml", f"<failure message='{URL}'/>")
    for name in ("r.json", "j.xml"):
        assert "w0rd" not in (tmp_path / name).read_text()


def test_an_unwritable_report_path_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(EnvbuildError) as caught:
        write_json(blocker / "r.json", {})
    assert str(blocker) in caught.value.message
    assert "\n" not in caught.value.message


def test_mask_url_hides_even_a_short_password() -> None:
    assert redact.mask_url("https://u:ab@host/simple") == "https://u:***@host/simple"
    assert redact.mask_url("https://host/simple") == "https://host/simple"


def test_a_garbage_store_is_one_line_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "results.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StateError) as caught:
        ResultStore(path)
    assert str(path) in caught.value.message
    assert caught.value.exit_code == 2


def test_a_data_dir_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "data"
    blocker.write_text("x")
    with pytest.raises(StateError) as caught:
        ResultStore(blocker / "results.sqlite3")
    assert str(blocker) in caught.value.message


def test_a_damaged_smoke_report_in_the_store_is_one_line(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results.sqlite3")
    with sqlite3.connect(tmp_path / "results.sqlite3") as db:
        db.execute(
            "INSERT INTO smoke VALUES (?, ?, ?, ?, ?)", ("sha256:x", "img", 1, "[1, 2", "2026")
        )
    with pytest.raises(StateError) as caught:
        store.latest_smoke("sha256:x")
    assert "damaged" in caught.value.message


def test_built_records_return_the_newest_build(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results.sqlite3")
    assert store.built_image("h" * 64) is None
    store.record_built("h" * 64, "e", "repo:tag", "sha256:old")
    store.record_built("h" * 64, "e", "repo:tag", "sha256:new")
    record = store.built_image("h" * 64)
    assert record is not None
    assert record.image_id == "sha256:new"
