"""run_entries over an in-memory engine: fail-fast, --keep-going, shared stages, reuse.

Only the engine is a double; the knowledge base, rendering and the result store are real.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from envbuild.core.errors import BadInput
from envbuild.core.models import HASH_LABEL, BuildOptions, Entry, Knowledge, Lock, Selection
from envbuild.core.results import EntryResult
from envbuild.core.store import ResultStore
from envbuild.engine.interface import Engine, RunResult
from envbuild.pipeline.entries import Event, RunOptions, run_entries
from envbuild.plan.matrix import default_matrix_path, knowledge_matrix, load_matrix, make_plan
from tests.support.engine_double import InMemoryEngine
from tests.support.lock_support import placeholder_lock

SKIPPED = "not built: an earlier entry failed (use --keep-going to build the rest)"
# What the torch payload prints for a CPU image whose training step and all-reduce worked.
PASSING = {
    "ok": True,
    "errors": [],
    "versions": {"python": "3.11.9", "framework": "2.13.0+cpu", "cuda": None},
    "devices": [{"kind": "cpu", "name": "cpu"}],
    "train": {"loss_first": 2.31, "loss_last": 1.12, "loss_fell": True, "steps": 8, "device": "cpu"},
    "allreduce": {
        "backend": "gloo", "world_size": 2, "correct": True, "expected": 3.0, "got": 3.0,
        "busbw_gbps": 0.5,
    },
    "user": {
        "uid": 1000, "gid": 1000, "name": "envbuild", "folders": {"HOME": "/home/envbuild"},
        "unwritable": {}, "environment": "/opt/venv", "environment_writable": [],
    },
}  # fmt: skip


def printed(report: dict[str, object], exit_code: int = 0) -> RunResult:
    return RunResult(
        exit_code=exit_code, stdout=json.dumps(report) + "\n", stderr="", timed_out=False,
        seconds=1.0,
    )  # fmt: skip


def plan_entries(knowledge: Knowledge, *selections: Selection) -> tuple[Entry, ...]:
    defaults = load_matrix(default_matrix_path(), knowledge)
    found: list[Entry] = []
    for chosen in selections:
        matrix = knowledge_matrix(knowledge, chosen, defaults)
        found += make_plan(knowledge, matrix, chosen).entries
    return tuple(found)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ResultStore:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # build logs
    return ResultStore(tmp_path / "results.sqlite3")


@pytest.fixture
def torch_entries(knowledge: Knowledge) -> tuple[Entry, ...]:
    """torch 2.13.0 for the CPU, CUDA 12.6 and 13.0: one OS + Python stage shared by three."""
    found = plan_entries(
        knowledge,
        *(
            Selection(framework="torch", framework_version="2.13.0", cuda=cuda, python="3.11")
            for cuda in ("cpu", "12.6", "13.0")
        ),
    )
    assert [e.cuda for e in found] == ["cpu", "12.6", "13.0"]
    return found


def with_bases(entries: tuple[Entry, ...]) -> InMemoryEngine:
    double = InMemoryEngine()
    for entry in entries:
        if entry.base_image not in double.bases:
            double.add_base(entry.base_image, python=entry.python)
    return double


def run(
    double: InMemoryEngine,
    knowledge: Knowledge,
    entries: tuple[Entry, ...],
    store: ResultStore,
    events: list[Event] | None = None,
    **options: object,
) -> list[EntryResult]:
    connect: Callable[[], Engine] = lambda: double  # noqa: E731 - every thread shares the double
    return run_entries(
        knowledge, entries, BuildOptions(), RunOptions(**options),  # type: ignore[arg-type]
        store=store, on_event=(events if events is not None else []).append, connect=connect,
        locks=lambda: {e.id: placeholder_lock(e) for e in entries},
    )  # fmt: skip


def entry_builds(double: InMemoryEngine) -> list[str | None]:
    return [b.tag for b in double.builds if b.target is None]


@pytest.mark.parametrize("engine_dies", [False, True], ids=["build-fails", "engine-lost"])
def test_fail_fast_skips_every_later_entry_with_the_reason(
    knowledge: Knowledge, store: ResultStore, torch_entries: tuple[Entry, ...], engine_dies: bool
) -> None:
    double = with_bases(torch_entries)
    first = torch_entries[0]
    if engine_dies:
        double.unavailable = True
    else:
        double.failing_builds[first.image] = "pip could not install torch"
    events: list[Event] = []
    results = run(double, knowledge, torch_entries, store, events, smoke=False)

    assert [r.entry.id for r in results] == [e.id for e in torch_entries]
    reason = "lost the Docker engine" if engine_dies else "pip could not install torch"
    assert reason in (results[0].error or "")
    assert [r.error for r in results[1:]] == [SKIPPED, SKIPPED]
    assert all(r.image is None and not r.passed for r in results)
    assert entry_builds(double) == [first.image]  # nothing after the failure reached the engine
    skipped = [(e.entry_id, e.detail) for e in events if e.state == "skipped"]
    assert skipped == [(e.id, "an earlier entry failed") for e in torch_entries[1:]]


def test_keep_going_builds_every_entry_after_a_failure(
    knowledge: Knowledge, store: ResultStore, torch_entries: tuple[Entry, ...]
) -> None:
    double = with_bases(torch_entries)
    double.failing_builds[torch_entries[0].image] = "pip could not install torch"
    results = run(double, knowledge, torch_entries, store, smoke=False, keep_going=True)

    assert [r.passed for r in results] == [False, True, True]
    assert "pip could not install torch" in (results[0].error or "")
    assert entry_builds(double) == [e.image for e in torch_entries]
    for result in results[1:]:
        assert result.image is not None
        assert result.image.built
        record = store.built_image(double.images[result.image.id].labels[HASH_LABEL])
        assert record is not None
        assert record.image_id == result.image.id


@pytest.mark.parametrize(
    ("jobs", "no_cache", "stages"),
    [(2, False, 1), (4, False, 1), (1, False, 0), (2, True, 0)],
    ids=["jobs2", "jobs4", "serial", "no-cache"],
)
def test_a_stage_several_entries_share_is_built_once_before_parallel_builds(
    knowledge: Knowledge, store: ResultStore, torch_entries: tuple[Entry, ...],
    jobs: int, no_cache: bool, stages: int,
) -> None:  # fmt: skip
    alone = plan_entries(
        knowledge,
        Selection(framework="torch", framework_version="2.13.0", cuda="cpu", python="3.12"),
    )  # its own OS + Python stage: nothing to share
    entries = (*torch_entries, *alone)
    double = with_bases(entries)
    events: list[Event] = []
    results = run(
        double, knowledge, entries, store, events, smoke=False, jobs=jobs, no_cache=no_cache
    )

    assert all(r.passed for r in results)
    shared = [b for b in double.builds if b.target == "runtime"]
    assert len(shared) == stages
    assert sorted(entry_builds(double), key=str) == sorted(e.image for e in entries)
    if stages:
        (stage,) = shared
        assert stage.tag is None
        assert stage.dockerfile.startswith("FROM python:3.11-slim-bookworm AS runtime")
        assert "FROM runtime AS builder" not in stage.dockerfile
        assert double.builds.index(stage) == 0  # before any entry build
        told = {e.entry_id for e in events if e.detail == "shared OS + Python stage"}
        assert told == {e.id for e in torch_entries}
    assert all(b.no_cache == no_cache for b in double.builds if b.target is None)


def test_every_base_is_probed_once_and_checked_before_the_first_build(
    knowledge: Knowledge, store: ResultStore, torch_entries: tuple[Entry, ...]
) -> None:
    double = with_bases(torch_entries)
    run(double, knowledge, torch_entries, store, smoke=False)
    assert double.probes == [torch_entries[0].base_image]

    wrong = InMemoryEngine()
    wrong.add_base(torch_entries[0].base_image, python="3.12")
    asked: list[str] = []

    def locks() -> dict[str, Lock]:
        asked.append("locks")  # resolving takes the network: never for a run refused anyway
        return {e.id: placeholder_lock(e) for e in torch_entries}

    with pytest.raises(BadInput, match=r"brings Python 3\.12, but .* needs 3\.11"):
        run_entries(
            knowledge, torch_entries, BuildOptions(), RunOptions(smoke=False), store=store,
            on_event=lambda event: None, locks=locks, connect=lambda: wrong,
        )  # fmt: skip
    assert wrong.builds == []
    assert asked == []


def test_the_smoke_test_runs_in_the_built_image_and_is_recorded(
    knowledge: Knowledge, store: ResultStore, torch_entries: tuple[Entry, ...]
) -> None:
    entry = torch_entries[0]
    double = with_bases((entry,))
    double.outputs[entry.image] = printed(PASSING)
    (result,) = run(double, knowledge, (entry,), store, gpus="none")

    assert result.passed, result.smoke
    assert result.image is not None
    assert result.smoke is not None
    assert result.smoke.image == entry.image
    assert result.smoke.image_id == result.image.id
    (ran,) = double.runs
    assert ran.image_id == result.image.id
    assert not ran.gpus
    record = store.latest_smoke(result.image.id)
    assert record is not None
    assert record.passed
    assert record.report["train"]["loss_last"] == PASSING["train"]["loss_last"]  # type: ignore[index]
    assert not result.smoke_reused


def test_a_failed_smoke_test_fails_the_entry_and_names_the_check(
    knowledge: Knowledge, store: ResultStore, torch_entries: tuple[Entry, ...]
) -> None:
    entry = torch_entries[0]
    double = with_bases((entry,))
    double.outputs[entry.image] = printed(
        {**PASSING, "ok": False, "errors": ["checkpoint round trip changed the weights"]}, 1
    )
    events: list[Event] = []
    (result,) = run(double, knowledge, (entry,), store, events, gpus="none")

    assert not result.passed
    assert result.error is None  # built fine; the smoke test is what failed
    (failed,) = [e for e in events if e.state == "failed"]
    assert "payload: checkpoint round trip changed the weights" in failed.detail
    assert result.image is not None
    record = store.latest_smoke(result.image.id)
    assert record is not None
    assert not record.passed


def test_a_found_image_vetted_before_is_neither_rebuilt_nor_retested(
    knowledge: Knowledge, store: ResultStore, torch_entries: tuple[Entry, ...]
) -> None:
    entry = torch_entries[0]
    double = with_bases((entry,))
    double.outputs[entry.image] = printed(PASSING)
    (first,) = run(double, knowledge, (entry,), store, gpus="none")
    assert first.passed
    assert first.image is not None

    events: list[Event] = []
    (again,) = run(double, knowledge, (entry,), store, events, gpus="none")

    assert again.passed
    assert again.image is not None
    assert not again.image.built
    assert again.image.id == first.image.id
    assert again.smoke_reused
    assert len(double.builds) == 1
    assert len(double.runs) == 1
    assert again.smoke is not None
    assert again.smoke.payload["train"] == PASSING["train"]
    assert again.smoke.image_id == first.image.id
    details = [e.detail for e in events if e.entry_id == entry.id]
    assert "same content hash exists: not rebuilt" in details
    assert "vetted before: not rerun" in details


def test_a_found_image_whose_last_smoke_test_failed_is_tested_again(
    knowledge: Knowledge, store: ResultStore, torch_entries: tuple[Entry, ...]
) -> None:
    entry = torch_entries[0]
    double = with_bases((entry,))
    double.outputs[entry.image] = printed({**PASSING, "ok": False, "errors": ["nan loss"]}, 1)
    (first,) = run(double, knowledge, (entry,), store, gpus="none")
    assert not first.passed

    double.outputs[entry.image] = printed(PASSING)  # e.g. a fixed payload: no rebuild needed
    (again,) = run(double, knowledge, (entry,), store, gpus="none")

    assert again.passed
    assert not again.smoke_reused
    assert again.image is not None
    assert not again.image.built
    assert len(double.builds) == 1
    assert len(double.runs) == 2


def test_a_vetted_result_is_not_reused_for_a_rebuilt_image(
    knowledge: Knowledge, store: ResultStore, torch_entries: tuple[Entry, ...]
) -> None:
    entry = torch_entries[0]
    double = with_bases((entry,))
    double.outputs[entry.image] = printed(PASSING)
    (first,) = run(double, knowledge, (entry,), store, gpus="none")
    (again,) = run(double, knowledge, (entry,), store, gpus="none", no_cache=True)

    assert first.image is not None
    assert again.image is not None
    assert again.image.built
    assert again.image.id != first.image.id
    assert not again.smoke_reused
    assert [r.image_id for r in double.runs] == [first.image.id, again.image.id]


# -- build --push: what the registry holds already is neither built nor smoke-tested ---------


def test_an_entry_the_registry_holds_vetted_is_not_built_again(
    knowledge: Knowledge, store: ResultStore, torch_entries: tuple[Entry, ...]
) -> None:
    from envbuild.build.entry import prepare
    from envbuild.publish.verify import entry_target
    from tests.support.hostile_registry import (
        OCI_MANIFEST,
        HostileRegistry,
        Published,
        json_answer,
        sha256,
    )

    double = with_bases(torch_entries)
    first = torch_entries[0]
    content_hash = prepare(
        double, knowledge, first, BuildOptions(), None, placeholder_lock(first)
    ).content_hash
    content = Published()
    manifest = content.manifest()
    where = entry_target("127.0.0.1:1/team", first.image, content_hash)
    served = json_answer(manifest, OCI_MANIFEST, **{"Docker-Content-Digest": sha256(manifest)})
    routes = content.routes(**{f"/manifests/{where.immutable}$": lambda seen: served})
    events: list[Event] = []
    with HostileRegistry(routes) as server:
        results = run(
            double, knowledge, torch_entries, store, events, jobs=2,
            push_registry=f"{server.host}/team",
        )  # fmt: skip
    assert [r.status for r in results] == ["published", "built", "built"]
    assert results[0].published == (
        f"{server.host}/team/torch:{where.immutable}@{sha256(manifest)}"
    )
    assert results[0].passed  # the registry's evidence stands for it
    assert first.image not in entry_builds(double)
    said = [e for e in events if e.entry_id == first.id]
    assert [e.state for e in said] == ["published"]  # neither built nor smoke-tested
    assert "published already" in said[0].detail


def test_an_unreachable_registry_stops_the_run_before_any_build(
    knowledge: Knowledge,
    store: ResultStore,
    torch_entries: tuple[Entry, ...],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from envbuild.registry import RegistryUnreachable

    monkeypatch.setenv("ENVBUILD_REGISTRY_TIMEOUT", "2")
    double = with_bases(torch_entries)
    with pytest.raises(RegistryUnreachable):
        run(double, knowledge, torch_entries, store, push_registry="127.0.0.1:9/team")
    assert entry_builds(double) == []
