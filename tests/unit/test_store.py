"""envbuild's local record (envbuild.core.store): smoke results, builds and publications in SQLite.

Every case uses a real database file under tmp_path; a damaged record is made by code (junk
bytes, another program's schema, a truncated database) and must end in one StateError line
that names the file and the fix.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild.core.errors import EXIT_BAD_INPUT
from envbuild.core.places import StateError, data_dir
from envbuild.core.results import SmokeCheck, SmokeResult
from envbuild.core.store import ResultStore

IMAGE_A = "sha256:" + "a" * 64
IMAGE_B = "sha256:" + "b" * 64
HASH = "c" * 64


@pytest.fixture
def store(tmp_path: Path) -> ResultStore:
    return ResultStore(tmp_path / "results.sqlite3")


def smoke(image_id: str, *, passed: bool, note: str = "") -> SmokeResult:
    check = SmokeCheck(name="payload", passed=passed, detail=note or "recorded by the test")
    return SmokeResult(
        image="team/torch:2.4", image_id=image_id, payload={"note": note}, checks=(check,),
        exit_code=0 if passed else 1, seconds=1.5, stderr_tail="",
    )  # fmt: skip


def one_line(error: StateError) -> str:
    assert "\n" not in error.message
    assert error.exit_code == EXIT_BAD_INPUT
    return error.message


# -- smoke results ----------------------------------------------------------------------


def test_the_newest_smoke_result_of_an_image_wins(store: ResultStore) -> None:
    store.record_smoke(smoke(IMAGE_A, passed=True, note="first"))
    store.record_smoke(smoke(IMAGE_A, passed=False, note="second"))

    latest = store.latest_smoke(IMAGE_A)
    assert latest is not None
    assert latest.passed is False
    assert latest.report["note"] == "second"
    assert latest.report["image_id"] == IMAGE_A
    assert latest.image_id == IMAGE_A


def test_smoke_results_are_kept_per_image_id(store: ResultStore) -> None:
    store.record_smoke(smoke(IMAGE_A, passed=True, note="a"))
    store.record_smoke(smoke(IMAGE_B, passed=False, note="b"))

    a, b = store.latest_smoke(IMAGE_A), store.latest_smoke(IMAGE_B)
    assert a is not None
    assert b is not None
    assert (a.passed, a.report["note"]) == (True, "a")
    assert (b.passed, b.report["note"]) == (False, "b")
    assert store.latest_smoke("sha256:" + "0" * 64) is None


def test_a_recorded_report_stands_for_the_result_it_came_from(store: ResultStore) -> None:
    result = smoke(IMAGE_A, passed=True, note="round trip")
    store.record_smoke(result)

    latest = store.latest_smoke(IMAGE_A)
    assert latest is not None
    again = SmokeResult.from_report(latest.report, image=result.image, image_id=IMAGE_A)
    assert again.passed
    assert again.checks == result.checks
    assert again.payload == result.payload


def test_the_record_outlives_the_store_object(tmp_path: Path) -> None:
    ResultStore(tmp_path / "r.sqlite3").record_smoke(smoke(IMAGE_A, passed=True))
    reopened = ResultStore(tmp_path / "r.sqlite3").latest_smoke(IMAGE_A)
    assert reopened is not None
    assert reopened.passed


def test_a_damaged_smoke_report_is_one_state_error(store: ResultStore) -> None:
    store.record_smoke(smoke(IMAGE_A, passed=True))
    for damage in ("{not json", "[1, 2]", '"text"', "null"):
        with sqlite3.connect(store.path) as db:
            db.execute("UPDATE smoke SET report = ?", (damage,))
        with pytest.raises(StateError) as caught:
            store.latest_smoke(IMAGE_A)
        message = one_line(caught.value)
        assert str(store.path) in message
        assert "envbuild smoke" in message


# -- builds -----------------------------------------------------------------------------


def test_a_build_is_found_by_its_content_hash(store: ResultStore) -> None:
    assert store.built_image(HASH) is None
    store.record_built(HASH, "torch-2.4.1-cpu-py3.11", "team/torch:2.4", IMAGE_A)

    found = store.built_image(HASH)
    assert found is not None
    assert (found.content_hash, found.entry_id, found.image_ref, found.image_id) == (
        HASH, "torch-2.4.1-cpu-py3.11", "team/torch:2.4", IMAGE_A,
    )  # fmt: skip
    assert store.built_image("d" * 64) is None


def test_rebuilding_a_content_hash_replaces_the_image_it_names(store: ResultStore) -> None:
    store.record_built(HASH, "entry", "team/torch:2.4", IMAGE_A)
    store.record_built(HASH, "entry", "team/torch:2.4", IMAGE_B)

    found = store.built_image(HASH)
    assert found is not None
    assert found.image_id == IMAGE_B


def test_each_engine_that_built_a_content_hash_keeps_its_own_record(store: ResultStore) -> None:
    # One data folder, two engines (the local one and a remote or rootless one): each built the
    # same content into an image of its own; neither record hides the other.
    store.record_built(HASH, "entry", "team/torch:2.4", IMAGE_A)
    store.record_built(HASH, "entry", "team/torch:2.4", IMAGE_B)
    store.record_built(HASH, "entry", "team/torch:2.4", IMAGE_A)  # built again on the first

    assert [record.image_id for record in store.built_images(HASH)] == [IMAGE_A, IMAGE_B]
    assert [record.image_id for record in store.built_images(HASH, limit=1)] == [IMAGE_A]
    assert store.built_images("d" * 64) == []


# -- publications -----------------------------------------------------------------------


def test_publications_are_listed_oldest_first_per_image(store: ResultStore) -> None:
    assert store.publications(IMAGE_A) == []
    store.record_published(IMAGE_A, "r.example/team/torch:2.4", "sha256:" + "1" * 64)
    store.record_published(IMAGE_B, "r.example/team/jax:0.4", "sha256:" + "2" * 64)
    store.record_published(IMAGE_A, "r.example/team/torch:latest", "sha256:" + "1" * 64)

    listed = store.publications(IMAGE_A)
    assert [p.reference for p in listed] == [
        "r.example/team/torch:2.4",
        "r.example/team/torch:latest",
    ]
    assert {p.image_id for p in listed} == {IMAGE_A}
    assert [p.reference for p in store.publications(IMAGE_B)] == ["r.example/team/jax:0.4"]


# -- a record that cannot be used ---------------------------------------------------------


def junk(path: Path) -> None:
    path.write_bytes(bytes(range(256)) * 64)


def text(path: Path) -> None:
    path.write_text("image_id,passed\nsha256:aaa,true\n", encoding="utf-8")


def sqlite_header_then_junk(path: Path) -> None:
    path.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)


def truncated_database(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE filler (x TEXT)")
        db.executemany("INSERT INTO filler VALUES (?)", [("x" * 500,)] * 200)
    db.close()
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])


def another_programs_schema(path: Path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE smoke (id INTEGER PRIMARY KEY, verdict TEXT)")
        db.execute("CREATE TABLE built (x)")
        db.execute("CREATE TABLE published (x)")
    db.close()


def record_everything(path: Path) -> None:
    store = ResultStore(path)
    store.record_smoke(smoke(IMAGE_A, passed=True))
    store.record_built(HASH, "entry", "team/torch:2.4", IMAGE_A)
    store.record_published(IMAGE_A, "r.example/team/torch:2.4", IMAGE_A)


DAMAGE: dict[str, Callable[[Path], None]] = {
    f.__name__: f
    for f in (junk, text, sqlite_header_then_junk, truncated_database, another_programs_schema)
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_file_that_is_not_envbuilds_record_is_one_state_error(
    tmp_path: Path, damage: Callable[[Path], None]
) -> None:
    path = tmp_path / "results.sqlite3"
    damage(path)
    before = path.read_bytes()

    with pytest.raises(StateError) as caught:
        record_everything(path)  # the schema is created first, or a first write fails
    message = one_line(caught.value)
    assert str(path) in message
    assert "move the file away" in message
    assert "ENVBUILD_DATA_DIR" in message
    assert path.read_bytes() == before  # nobody's file is "repaired" behind their back


def test_a_folder_where_the_record_should_be_is_one_state_error(tmp_path: Path) -> None:
    path = tmp_path / "results.sqlite3"
    path.mkdir()
    with pytest.raises(StateError) as caught:
        ResultStore(path)
    message = one_line(caught.value)
    assert str(path) in message
    assert "ENVBUILD_DATA_DIR" in message


def test_a_file_where_the_data_directory_should_be_is_one_state_error(tmp_path: Path) -> None:
    occupied = tmp_path / "envbuild"
    occupied.write_text("not a directory\n")
    with pytest.raises(StateError) as caught:
        ResultStore(occupied / "results.sqlite3")
    message = one_line(caught.value)
    assert str(occupied) in message
    assert "ENVBUILD_DATA_DIR" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes files whatever their mode")
def test_a_read_only_record_is_one_state_error(store: ResultStore) -> None:
    store.record_smoke(smoke(IMAGE_A, passed=True))
    store.path.chmod(0o444)
    with pytest.raises(StateError) as caught:
        store.record_smoke(smoke(IMAGE_A, passed=False))
    assert str(store.path) in one_line(caught.value)


def test_an_empty_file_is_a_fresh_record(tmp_path: Path) -> None:
    path = tmp_path / "results.sqlite3"
    path.touch()
    store = ResultStore(path)
    assert store.latest_smoke(IMAGE_A) is None
    store.record_smoke(smoke(IMAGE_A, passed=True))
    assert store.latest_smoke(IMAGE_A) is not None


# -- where the record lives ---------------------------------------------------------------


@pytest.fixture
def environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    for name in ("ENVBUILD_DATA_DIR", "XDG_DATA_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_envbuild_data_dir_wins(environ: pytest.MonkeyPatch, tmp_path: Path) -> None:
    environ.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    environ.setenv("ENVBUILD_DATA_DIR", str(tmp_path / "mine"))
    assert data_dir() == tmp_path / "mine"


def test_xdg_data_home_comes_next(environ: pytest.MonkeyPatch, tmp_path: Path) -> None:
    environ.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert data_dir() == tmp_path / "xdg" / "envbuild"
    environ.setenv("ENVBUILD_DATA_DIR", "")  # empty means unset
    assert data_dir() == tmp_path / "xdg" / "envbuild"


def test_the_home_directory_is_the_last_resort(environ: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert data_dir() == tmp_path / "home" / ".local" / "share" / "envbuild"
    environ.setenv("XDG_DATA_HOME", "")
    assert data_dir() == tmp_path / "home" / ".local" / "share" / "envbuild"


def test_the_default_store_is_created_in_the_data_dir(
    environ: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    environ.setenv("ENVBUILD_DATA_DIR", str(tmp_path / "deep" / "data"))
    store = ResultStore.default()
    store.record_smoke(smoke(IMAGE_A, passed=True))
    assert store.path == tmp_path / "deep" / "data" / "results.sqlite3"
    assert store.path.is_file()


# -- writers at once ----------------------------------------------------------------------


def test_concurrent_writers_lose_no_records(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "results.sqlite3"
    writers, each = 6, 8
    start = threading.Barrier(writers)
    failures: list[BaseException] = []

    def write(worker: int) -> None:
        try:
            start.wait(30)
            store = ResultStore(path)  # every writer creates the schema too
            image = f"sha256:{worker:064x}"
            for n in range(each):
                store.record_smoke(smoke(image, passed=n % 2 == 0, note=str(n)))
                store.record_built(f"{worker:02d}{n:062x}", "entry", "team/torch:2.4", image)
                store.record_published(image, f"r.example/team/torch:{n}", image)
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)  # a hang guard
    assert failures == []

    store = ResultStore(path)
    for worker in range(writers):
        image = f"sha256:{worker:064x}"
        assert len(store.publications(image)) == each
        latest = store.latest_smoke(image)
        assert latest is not None
        assert latest.report["note"] == str(each - 1)
        for n in range(each):
            built = store.built_image(f"{worker:02d}{n:062x}")
            assert built is not None
            assert built.image_id == image
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT COUNT(*) FROM smoke").fetchone() == (writers * each,)
    db.close()
