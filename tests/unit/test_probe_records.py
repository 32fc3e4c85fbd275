"""A base image's probe record: read back only as it was written, for the same image and script;
any other file in its place (generated below) is no record, and never an error or a hang."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from envbuild.core.places import base_probes_dir
from envbuild.engine import probe_records
from envbuild.engine.probe_records import ProbeFindings, recalled, record_path, remember

IMAGE = "sha256:" + "ab" * 32
SCRIPT = "echo os=debian bookworm"
BOOKWORM = ProbeFindings(os_id="debian", os_codename="bookworm", python="3.11")
FILES = settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])


def good_record() -> dict[str, object]:
    return {
        "version": probe_records.RECORD_VERSION,
        "image": IMAGE,
        "script": probe_records.script_digest(SCRIPT),
        "os_id": "debian",
        "os_codename": "bookworm",
        "python": "3.11",
    }


def place(data: bytes) -> Path:
    path = record_path(IMAGE)
    assert path is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("python", ["3.11", None])
def test_what_was_remembered_is_recalled_for_that_image_and_script(python: str | None) -> None:
    findings = ProbeFindings(os_id="debian", os_codename="bookworm", python=python)
    assert recalled(IMAGE, SCRIPT) is None
    remember(IMAGE, SCRIPT, findings)
    assert recalled(IMAGE, SCRIPT) == findings
    path = record_path(IMAGE)
    assert path is not None
    assert path.parent == base_probes_dir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # the user's cache: private, as written
    assert recalled("sha256:" + "cd" * 32, SCRIPT) is None  # another image
    assert recalled(IMAGE, SCRIPT + " ") is None  # another probe script: probe again


@given(image=st.text(max_size=80))
@example(image="sha256:" + "AB" * 32)
@example(image="sha256:../../../../etc/passwd")
@example(image="sha256:" + "ab" * 32 + "\n")
@example(image="../" + "ab" * 32)
@settings(max_examples=80)
def test_an_id_that_is_not_a_sha256_digest_names_no_record(image: str) -> None:
    if (
        image.startswith("sha256:")
        and len(image) == 71
        and set(image[7:]) <= set("0123456789abcdef")
    ):
        return  # a real id
    before = set(base_probes_dir().rglob("*")) if base_probes_dir().exists() else set()
    remember(image, SCRIPT, BOOKWORM)
    assert record_path(image) is None
    assert recalled(image, SCRIPT) is None
    after = set(base_probes_dir().rglob("*")) if base_probes_dir().exists() else set()
    assert after == before


FIELDS = ("version", "image", "script", "os_id", "os_codename", "python")
WRONG_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=40),
    st.lists(st.text(max_size=5), max_size=3),
    st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
)


@given(field=st.sampled_from(FIELDS), value=WRONG_VALUES)
@example(field="python", value="3.11; rm -rf /")
@example(field="python", value="3.11\n")
@example(field="os_id", value="Debian GNU/Linux")
@example(field="os_codename", value="bookworm\nos=evil")
@example(field="os_id", value="")
@example(field="version", value=True)  # True == 1 in Python
@example(field="version", value=1.0)
@FILES
def test_a_record_with_a_field_changed_is_no_record_or_holds_only_what_a_probe_can_find(
    field: str, value: object
) -> None:
    record = good_record()
    record[field] = value
    place(json.dumps(record).encode())
    found = recalled(IMAGE, SCRIPT)
    if found is None:
        return
    # Only a value a probe can find is taken: the record as written.
    assert record["version"] == 1
    assert type(record["version"]) is int
    assert (record["image"], record["script"]) == (IMAGE, probe_records.script_digest(SCRIPT))
    for word in (found.os_id, found.os_codename):
        assert word == word.strip()
        assert word
        assert set(word) <= set("abcdefghijklmnopqrstuvwxyz0123456789._-")
    assert found.python is None or found.python.replace(".", "").isdigit()


@given(data=st.binary(max_size=300))
@example(data=b"")
@example(data=b"\xff\xfe\x00")
@example(data=b"[" * 5000)
@example(data=b'{"version": 1}')
@example(data=json.dumps(good_record()).encode() + b"\x00")
@FILES
def test_a_record_of_any_bytes_is_read_without_an_error(data: bytes) -> None:
    place(data)
    found = recalled(IMAGE, SCRIPT)
    assert found is None or found == BOOKWORM


def test_a_record_too_large_a_link_a_folder_or_a_fifo_is_no_record(tmp_path: Path) -> None:
    good = json.dumps(good_record()).encode()
    place(good)
    assert recalled(IMAGE, SCRIPT) == BOOKWORM
    path = place(good + b" " * probe_records.RECORD_LIMIT)
    assert recalled(IMAGE, SCRIPT) is None
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_bytes(good)
    path.unlink()
    path.symlink_to(elsewhere)
    assert recalled(IMAGE, SCRIPT) is None
    path.unlink()
    path.mkdir()
    assert recalled(IMAGE, SCRIPT) is None
    remember(IMAGE, SCRIPT, BOOKWORM)  # cannot replace a folder: no error
    path.rmdir()
    os.mkfifo(path)
    assert recalled(IMAGE, SCRIPT) is None  # opened without blocking: no hang
    remember(IMAGE, SCRIPT, BOOKWORM)  # a new record replaces the FIFO
    assert recalled(IMAGE, SCRIPT) == BOOKWORM


@pytest.mark.parametrize(
    "findings",
    [
        ProbeFindings(os_id="Debian GNU/Linux", os_codename="bookworm", python="3.11"),
        ProbeFindings(os_id="debian", os_codename="", python="3.11"),
        ProbeFindings(os_id="debian", os_codename="bookworm\npython=3.12", python=None),
        ProbeFindings(os_id="debian", os_codename="bookworm", python="3.11rc1"),
    ],
)
def test_findings_a_record_cannot_hold_are_not_written(findings: ProbeFindings) -> None:
    remember(IMAGE, SCRIPT, findings)
    path = record_path(IMAGE)
    assert path is not None
    assert not path.exists()
    assert recalled(IMAGE, SCRIPT) is None


def test_a_cache_that_cannot_be_written_costs_only_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))  # below a file
    remember(IMAGE, SCRIPT, BOOKWORM)
    assert recalled(IMAGE, SCRIPT) is None
