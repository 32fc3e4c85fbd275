"""The smoke payloads' shared harness, run on the host: sections, deadlines, the report, the layout.

The harness runs inside containers that hold only the standard library and one framework; here it
is exercised in-process (sections, JSON cleaning, version parsing) and as a subprocess laid out the
way `smoke_image` injects it (`python3 FOLDER/x_smoke.py` importing `smoke_harness` from FOLDER).
"""

from __future__ import annotations

import importlib
import json
import math
import os
import platform
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envbuild.core.resources import payload_dir
from envbuild.payload import payload_versions
from envbuild.payload import smoke_harness as harness
from envbuild.smoke.checks import check_report
from envbuild.smoke.runner import PAYLOAD_DIR, payload_files

# A hang guard for every subprocess: a harness that fails to end its run fails the test.
HANG_GUARD_S = 120


PAYLOAD = Path(harness.__file__).parent


def new_run(**kwargs: Any) -> harness.Run:
    return harness.Run("fake", **kwargs)


@pytest.fixture(scope="module")
def verdicts() -> Iterator[ModuleType]:
    """smoke_verdicts.py as the container imports it (its siblings from its own folder)."""
    sys.path.insert(0, str(PAYLOAD))
    try:
        yield importlib.import_module("smoke_verdicts")
    finally:
        sys.path.remove(str(PAYLOAD))
        for name in (
            "smoke_verdicts", "smoke_harness", "package_imports", "payload_versions", "image_user",
        ):  # fmt: skip
            sys.modules.pop(name, None)


# --------------------------------------------------------------------------
# sections


def test_a_section_that_raises_is_recorded_and_the_run_goes_on() -> None:
    run = new_run()

    def explode(doc: dict[str, Any]) -> None:
        doc["train"]["steps"] = 7
        raise ValueError("boom\n   on two   lines")

    assert run.section("explode", 30, explode) is False
    assert run.section("next", 30, lambda doc: doc["train"].update(loss_fell=True)) is True
    assert run.errors == ["explode: ValueError: boom on two lines"]
    assert run.doc["train"]["steps"] == 7  # what it did before raising is kept
    assert run.doc["train"]["loss_fell"] is True


def test_even_system_exit_in_a_section_is_only_an_error() -> None:
    run = new_run()
    assert run.section("leave", 30, lambda doc: sys.exit(3)) is False
    assert run.errors == ["leave: SystemExit: 3"]


def test_a_python_loop_past_its_deadline_is_stopped_and_recorded() -> None:
    run = new_run()
    cleaned_up = threading.Event()

    def spin(doc: dict[str, Any]) -> None:
        try:
            while True:
                doc["train"]["steps"] += 1
        finally:
            cleaned_up.set()

    assert run.section("spin", 0.2, spin) is False
    assert run.errors == ["spin: no result within 0.2 s, stopped"]
    assert cleaned_up.is_set()  # its `finally` ran: the thread is gone, not abandoned
    assert run.abandoned == []
    assert run.section("next", 30, lambda doc: doc["allreduce"].update(correct=True)) is True
    assert run.doc["allreduce"]["correct"] is True


def test_a_section_stuck_in_native_code_is_abandoned_and_cannot_change_the_report() -> None:
    run = new_run()
    release = threading.Event()
    held: list[dict[str, Any]] = []

    def stuck(doc: dict[str, Any]) -> None:
        held.append(doc)
        doc["train"]["steps"] = 5
        release.wait(HANG_GUARD_S)  # a lock wait in C: no Python instruction to interrupt

    try:
        assert run.section("stuck", 0.2, stuck) is False
        assert run.errors == ["stuck: no result within 0.2 s (hung?), abandoned"]
        assert len(run.abandoned) == 1
        # What the abandoned section does from now on lands in a document nobody reports.
        (orphan,) = held
        orphan["train"]["loss_fell"] = True
        orphan["errors"].append("written late")
        assert run.section("next", 30, lambda doc: doc["allreduce"].update(correct=True))
        report = run.document()
        assert report["train"]["steps"] == 5  # what it wrote before its deadline is kept
        assert report["train"]["loss_fell"] is False
        assert report["allreduce"]["correct"] is True
        assert report["errors"] == ["stuck: no result within 0.2 s (hung?), abandoned"]
    finally:
        release.set()
        for thread in run.abandoned:
            thread.join(HANG_GUARD_S)


def test_a_used_up_budget_skips_the_section() -> None:
    run = new_run(total_s=0.0)
    called: list[bool] = []
    assert run.section("late", 30, lambda doc: called.append(True)) is False
    assert called == []
    assert run.errors == ["late: skipped, the payload's 0 s are used up"]


def test_a_section_knows_the_time_it_has_left() -> None:
    run = new_run()
    seen: list[float] = []
    run.section("measure", 30, lambda doc: seen.append(run.time_left()))
    assert 0 < seen[0] <= 30
    assert run.time_left() > 30  # outside a section: the payload's whole budget


def test_a_missing_framework_is_an_import_error_not_a_crash() -> None:
    run = new_run()
    assert run.load("envbuild_no_such_framework") is None
    assert run.errors == [
        "import: ModuleNotFoundError: No module named 'envbuild_no_such_framework'"
    ]


# --------------------------------------------------------------------------
# the document


def test_the_document_has_the_shape_the_host_reads() -> None:
    run = new_run(extra={"cuda_needs_gpu": True})
    report = run.document()
    assert list(report) == [
        "payload", "payload_version", "cuda_needs_gpu", "ok",
        "versions", "devices", "train", "allreduce", "checks", "errors",
    ]  # fmt: skip
    assert report["ok"] is False
    assert report["checks"] == {"loss_fell": False, "allreduce_correct": False}
    run.doc["train"]["loss_fell"] = True
    run.doc["allreduce"]["correct"] = True
    assert run.document()["ok"] is True
    run.errors.append("devices: RuntimeError: x")
    assert run.document()["ok"] is False  # any error fails the run, whatever the checks say


def test_an_added_part_brings_its_own_check() -> None:
    parts = harness.standard_parts()
    parts["checkpoint"] = {"round_trip": False}
    checks = (*harness.STANDARD_CHECKS, ("checkpoint_ok", "checkpoint", "round_trip"))
    run = new_run(parts=parts, checks=checks)
    run.section(
        "checkpoint", 30, lambda doc: doc["checkpoint"].update(round_trip=True)
    )  # fmt: skip
    report = run.document()
    assert report["checkpoint"] == {"round_trip": True}
    assert report["checks"]["checkpoint_ok"] is True


def test_render_cleans_non_finite_numbers_into_valid_json() -> None:
    run = new_run()
    run.doc["train"]["losses"] = [1.0, math.nan, math.inf]
    run.doc["train"]["loss_first"] = -math.inf
    text, ok = run.render()
    report = json.loads(text)
    assert report["train"]["losses"] == [1.0, None, None]
    assert report["train"]["loss_first"] is None
    assert ok is False


def test_render_still_emits_json_when_the_document_cannot_be_encoded() -> None:
    run = new_run()
    loop: list[Any] = []
    loop.append(loop)  # a cycle: no cleaning can encode it
    run.doc["devices"] = loop
    text, ok = run.render()
    report = json.loads(text)
    assert ok is False
    assert report["ok"] is False
    assert report["devices"] == []
    assert report["checks"] == {"loss_fell": False, "allreduce_correct": False}
    assert report["errors"][-1].startswith("json: RecursionError")


class Scalar:
    """A framework scalar (numpy, torch, jax): a value behind `.item()`."""

    def __init__(self, value: object) -> None:
        self.value = value

    def item(self) -> object:
        return self.value


class BrokenScalar:
    def item(self) -> object:
        raise RuntimeError("a tensor with more than one element")

    def __str__(self) -> str:
        return "tensor([1, 2])"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (math.nan, None),
        (-math.inf, None),
        ((1, 2.5, math.inf), [1, 2.5, None]),
        ({1: "one", None: math.nan}, {"1": "one", "None": None}),
        (frozenset({3}), [3]),
        (Scalar(0.25), 0.25),
        (Scalar(math.nan), None),
        (Scalar(7), 7),
        (BrokenScalar(), "tensor([1, 2])"),
        (b"\x00bytes", "b'\\x00bytes'"),
        (object, "<class 'object'>"),
        (True, True),
    ],
)
def test_clean_json_turns_values_json_cannot_hold_into_ones_it_can(
    value: object, expected: object
) -> None:
    assert harness.clean_json(value) == expected


JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text()
    | st.binary()
    | st.builds(Scalar, st.floats(allow_nan=True, allow_infinity=True)),
    lambda inner: (
        st.lists(inner)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text() | st.integers() | st.floats(allow_nan=True), inner)
    ),
    max_leaves=30,
)


@given(JSONISH)
def test_clean_json_output_is_always_strict_json(value: object) -> None:
    text = json.dumps(harness.clean_json(value), allow_nan=False)
    assert json.loads(text) == harness.clean_json(value)


# --------------------------------------------------------------------------
# versions and measurements


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (21803, "2.18.3"),  # torch.cuda.nccl.version() on old torch, ncclGetVersion()
        (22005, "2.20.5"),
        ("21803", "2.18.3"),
        (2708, "2.7.8"),  # NCCL before 2.9: major*1000 + minor*100 + patch
        ((2, 18, 3), "2.18.3"),  # torch.cuda.nccl.version() on newer torch
        ((2, 20, 5, "cuda12.4"), "2.20.5"),
        ([2, 27, 7], "2.27.7"),
        ("2.18.3", "2.18.3"),  # a build-info string is kept
        (" 2.18.3\n", "2.18.3"),
        (None, None),
        (0, None),
        ("", None),
    ],
)
def test_nccl_version_from_the_forms_frameworks_report(value: object, expected: str) -> None:
    assert payload_versions.nccl_version_from(value) == expected


@given(st.integers(2, 9), st.integers(9, 99), st.integers(0, 99))
def test_nccl_version_codes_round_trip(major: int, minor: int, patch: int) -> None:
    want = f"{major}.{minor}.{patch}"
    assert payload_versions.nccl_version_from(major * 10000 + minor * 100 + patch) == want
    assert payload_versions.nccl_version_from((major, minor, patch)) == want
    assert payload_versions.nccl_version_from(want) == want


@pytest.mark.parametrize(
    ("value", "expected"), [(90100, "9.1.0"), (91002, "9.10.2"), (8902, "8.9.2"), (None, None)]
)
def test_cudnn_version_from_its_integer_code(value: int | None, expected: str | None) -> None:
    assert payload_versions.cudnn_version_from(value) == expected


def test_a_falling_loss_is_recorded(verdicts: ModuleType) -> None:
    train: dict[str, Any] = {"steps": 3}
    verdicts.judge_losses(train, [1.5, 1.0, 0.5])
    assert (train["loss_first"], train["loss_last"], train["loss_fell"]) == (1.5, 0.5, True)


@pytest.mark.parametrize(
    "losses",
    [[1.0, 1.0, 1.0], [1.0, 0.999999], [1.0, 2.0], [math.nan, 0.5], [1.0, math.nan], [1.0]],
    ids=["constant", "jitter", "rising", "nan-first", "nan-last", "one-step"],
)
def test_a_loss_that_did_not_fall_is_an_error(verdicts: ModuleType, losses: list[float]) -> None:
    train: dict[str, Any] = {"steps": len(losses), "loss_fell": False}
    with pytest.raises(RuntimeError, match="loss"):
        verdicts.judge_losses(train, losses)
    assert train["loss_fell"] is False


@pytest.mark.parametrize(
    ("raw", "steps", "error"),
    [("", 20, False), ("7", 7, False), ("1", 20, True), ("many", 20, True), ("-3", 20, True)],
)
def test_the_steps_knob(
    verdicts: ModuleType, monkeypatch: pytest.MonkeyPatch, raw: str, steps: int, error: bool
) -> None:
    monkeypatch.setenv("ENVBUILD_SMOKE_STEPS", raw)
    errors: list[str] = []
    assert verdicts.steps_from_env(errors) == steps
    assert bool(errors) is error
    assert all(e.startswith("train: ValueError: bad ENVBUILD_SMOKE_STEPS=") for e in errors)


def test_allreduce_bandwidth_and_verdict_follow_nccl_tests(verdicts: ModuleType) -> None:
    ar = harness.standard_parts()["allreduce"]
    errors: list[str] = []
    elements, warmup, iters = verdicts.plan_allreduce(ar, "gloo", gpu=False)
    assert verdicts.allreduce_world(ar, 4) == 10.0
    verdicts.record_bandwidth(ar, 0.001)
    verdicts.record_allreduce(ar, errors, correct=False, got=7.0)
    assert (elements * 4, warmup, iters) == verdicts.CPU_ALLREDUCE
    assert ar["algbw_gbps"] == pytest.approx(ar["bytes"] / 0.001 / 1e9)
    assert ar["busbw_gbps"] == pytest.approx(ar["algbw_gbps"] * 2 * 3 / 4)
    assert errors == ["allreduce: wrong result: expected 10.0 everywhere, got 7.0"]


@pytest.mark.parametrize(
    ("first", "last", "verdict", "shown"),
    [
        ((True, 2.0), (True, 2.0), True, 2.0),
        ((False, 3.0), (True, 2.0), False, 3.0),  # the first wrong sum is the one shown
        ((True, 2.0), (False, 5.0), False, 5.0),
    ],
)
def test_finish_allreduce_judges_both_sums(
    verdicts: ModuleType,
    first: tuple[bool, float],
    last: tuple[bool, float],
    verdict: bool,
    shown: float,
) -> None:
    ar = harness.standard_parts()["allreduce"]
    verdicts.plan_allreduce(ar, "gloo", gpu=False)
    verdicts.allreduce_world(ar, 2)
    errors: list[str] = []
    versions: dict[str, object] = {}
    verdicts.finish_allreduce(
        ar, errors, versions, backend="gloo", seconds=0.5, first=first, last=last
    )
    assert (ar["correct"], ar["got"], bool(errors)) == (verdict, shown, not verdict)
    assert ar["seconds"] == 0.5
    assert "nccl" not in versions  # gloo: no NCCL version is looked for


# --------------------------------------------------------------------------
# the injected layout, as a subprocess

FAKE_PAYLOAD = """
import os
import subprocess
import sys
import time

import smoke_harness as harness


def noisy(doc):
    print("print() output must not reach the report")
    os.write(1, b"fd 1 output must not reach the report\\n")
    subprocess.run(["sh", "-c", "echo a child process writing to fd 1"], check=True)
    doc["train"]["loss_fell"] = True


def explode(doc):
    raise ValueError("boom")


def hang(doc):
    time.sleep(3600)  # native code: cannot be interrupted, only abandoned


def smoke(run):
    run.section("noisy", 60, noisy)
    if os.environ.get("FAKE_FAIL"):
        run.section("explode", 60, explode)
        run.section("hang", 1, hang)
    run.section("allreduce", 60, lambda doc: doc["allreduce"].update(correct=True))
    if os.environ.get("FAKE_BUG"):
        raise KeyError("bug outside any section")


if __name__ == "__main__":
    harness.main("fake", smoke)
"""


def run_payload(
    script: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
        cwd=script.parent.parent,  # not the payload's folder: the import must not rely on cwd
        env={**os.environ, **(env or {})},
        check=False,
    )


@pytest.fixture
def fake_payload(tmp_path: Path) -> Path:
    folder = tmp_path / "envbuild-smoke"
    folder.mkdir()
    (folder / "smoke_harness.py").write_bytes((payload_dir() / "smoke_harness.py").read_bytes())
    script = folder / "fake_smoke.py"
    script.write_text(textwrap.dedent(FAKE_PAYLOAD))
    return script


def test_a_passing_payload_prints_only_its_report_and_exits_0(fake_payload: Path) -> None:
    result = run_payload(fake_payload)
    report = json.loads(result.stdout)  # the whole of stdout is one JSON document
    assert result.returncode == 0, result.stderr
    assert report["payload"] == "fake"
    assert report["ok"] is True
    assert report["errors"] == []
    for noise in ("print() output", "fd 1 output", "a child process writing"):
        assert noise in result.stderr
        assert noise not in result.stdout
    assert "[fake_smoke] section noisy ..." in result.stderr


def test_a_failing_payload_still_reports_every_section_and_exits_1(fake_payload: Path) -> None:
    result = run_payload(fake_payload, {"FAKE_FAIL": "1"})
    report = json.loads(result.stdout)
    assert result.returncode == 1
    assert report["ok"] is False
    assert report["errors"] == [
        "explode: ValueError: boom",
        "hang: no result within 1 s (hung?), abandoned",
    ]
    # The sections before and after the failures ran and reported.
    assert report["checks"] == {"loss_fell": True, "allreduce_correct": True}
    assert "(a section hung)" in result.stderr


def test_a_bug_outside_the_sections_still_ends_in_a_report(fake_payload: Path) -> None:
    result = run_payload(fake_payload, {"FAKE_BUG": "1"})
    report = json.loads(result.stdout)
    assert result.returncode == 1
    assert report["errors"] == ["payload: KeyError: 'bug outside any section'"]


@pytest.mark.parametrize("framework", ["torch", "tensorflow", "jax"])
def test_the_injected_files_run_together(tmp_path: Path, framework: str) -> None:
    # Lay the files out exactly as smoke_image copies them into the container; the framework
    # itself is shadowed by a module that fails to import, so the host needs none of them.
    target, files = payload_files(f"{framework}_smoke.py")
    assert {Path(path).parent for path in files} == {Path(PAYLOAD_DIR)}
    assert Path(target).name == f"{framework}_smoke.py"
    root = tmp_path / "container"
    for path, data in files.items():
        (root / path.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (root / path.lstrip("/")).write_bytes(data)
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / f"{framework}.py").write_text("raise ImportError('not in this test')\n")
    result = run_payload(root / target.lstrip("/"), {"PYTHONPATH": str(shadow)})
    report = json.loads(result.stdout)
    assert result.returncode == 1, result.stderr
    assert report["payload"] == framework
    assert report["errors"] == ["import: ImportError: not in this test"]
    assert {"versions", "devices", "train", "allreduce", "checks"} <= set(report)
    assert report["versions"]["python"] == platform.python_version()
    # Who it ran as is said before the framework loads, so even a broken image reports it.
    assert (report["user"]["uid"], report["user"]["gid"]) == (os.getuid(), os.getgid())
    checks = {c.name: c.passed for c in check_report(report, {}, gpus=False)}
    # Without its framework nothing passes: neither the core checks nor a training section's.
    assert {"payload", "loss_fell", "allreduce"} <= set(checks)
    assert not any(checks.values()), checks


# -- the verdicts every framework's training sections share -----------------------------------


def test_a_checkpoint_that_resumes_where_it_stopped_passes(verdicts: ModuleType) -> None:
    part: dict[str, Any] = {}
    verdicts.judge_checkpoint(part, [1.0, 0.8], [0.7, 0.6], [0.7, 0.6], tolerance=1e-4)
    assert part["continued"] is True
    assert part["loss_fell"] is True
    assert (part["loss_before_save"], part["loss_after_resume"]) == (0.8, 0.7)


@pytest.mark.parametrize(
    ("resumed", "why"),
    [
        ([0.95, 0.9], "does not continue from 0.8"),  # restarted from scratch: state lost
        ([0.7, 0.71], "loss did not fall"),  # resumed right, then stopped learning
    ],
)
def test_a_checkpoint_that_lost_state_or_stopped_learning_fails(
    verdicts: ModuleType, resumed: list[float], why: str
) -> None:
    part: dict[str, Any] = {}
    uninterrupted = [resumed[0], 0.6] if why == "loss did not fall" else [0.7, 0.6]
    with pytest.raises(RuntimeError, match=why):
        verdicts.judge_checkpoint(part, [1.0, 0.8], uninterrupted, resumed, tolerance=1e-4)


def test_a_broken_numpy_round_trip_names_what_broke(verdicts: ModuleType) -> None:
    part: dict[str, Any] = {}
    with pytest.raises(RuntimeError, match="numpy interop is broken: dtype, values"):
        verdicts.judge_round_trip(part, {"round_trip": True, "dtype": False, "values": False})
    assert part["ok"] is False
    verdicts.judge_round_trip(part, {"round_trip": True})
    assert part["ok"] is True


def test_the_user_part_names_who_ran_and_each_folder_it_cannot_write(tmp_path: Path) -> None:
    # HOME is missing (the section makes it, as the tools would); XDG's cache lies below a
    # regular file and triton's inside /proc: no user, root included, can make either.
    (tmp_path / "file").write_text("")
    env = {
        "HOME": str(tmp_path / "home"),
        "XDG_CACHE_HOME": str(tmp_path / "file" / "cache"),
        "TRITON_CACHE_DIR": "/proc/envbuild-triton",
    }
    code = (
        f"import json, sys; sys.path.insert(0, {str(PAYLOAD)!r}); import image_user; "
        "part = image_user.user_part(); image_user.run_user(part); print(json.dumps(part))"
    )
    clean = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD_S,
        env={**clean, **env}, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    part = json.loads(result.stdout)
    assert (part["uid"], part["gid"]) == (os.getuid(), os.getgid())
    assert part["folders"] == env
    assert set(part["unwritable"]) == {"XDG_CACHE_HOME", "TRITON_CACHE_DIR"}
    assert part["unwritable"]["XDG_CACHE_HOME"].startswith("NotADirectoryError")
    assert (tmp_path / "home").is_dir()
    assert part["environment"] == sys.prefix
    assert (sys.prefix in part["environment_writable"]) == os.access(sys.prefix, os.W_OK)


def test_the_payload_digest_names_exactly_what_ran() -> None:
    from envbuild.smoke.runner import files_digest, payload_files

    _, files = payload_files("torch_smoke.py")
    digest = files_digest(files)
    assert digest.startswith("sha256:")
    assert files_digest(dict(reversed(list(files.items())))) == digest  # order does not matter
    name = next(iter(files))
    assert files_digest({**files, name: files[name] + b"\n"}) != digest
    # A name's end cannot pass for a content's start.
    assert files_digest({"ab": b"c"}) != files_digest({"a": b"bc"})
