"""The host side of `envbuild bench` without Docker: the measurement arithmetic (nccl-tests' busbw,
the spread), the advice rules on recorded payload outputs (every figure an advice line cites is in
the document, printed as the text shows it), comparisons and their regressions, the history in the
store, the terminal report, and running a payload through the in-memory engine."""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from envbuild.bench.advice import (
    advise,
    allreduce_advice,
    batch_advice,
    cited_text,
    compile_advice,
    framework_advice,
    loader_advice,
    precision_advice,
)
from envbuild.bench.compare import compare_documents
from envbuild.bench.document import bench_document, checked_document, load_document
from envbuild.bench.figures import image_figures, pointer
from envbuild.bench.run import BenchRun, bench_image, vetted_images
from envbuild.bench.terminal import bench_lines
from envbuild.cli.main import main
from envbuild.core import labels as label_keys
from envbuild.core.errors import BadInput
from envbuild.core.results import SmokeCheck, SmokeResult
from envbuild.core.store import ResultStore
from envbuild.engine.interface import RunResult
from envbuild.host.probes import host_key
from envbuild.payload import bench_harness
from tests.support.engine_double import InMemoryEngine

RECORDED = Path(__file__).parent / "recorded" / "bench"
HOST = {"cpu_model": "Test CPU", "cores": 2, "memory_bytes": 24 * 10**9, "gpus": [], "engine": None}


def recorded() -> dict[str, dict[str, Any]]:
    """The real payload outputs recorded from the CPU images (see recorded/bench/README.md)."""
    found = {
        p.stem.split("-")[0]: json.loads(p.read_text()) for p in sorted(RECORDED.glob("*.json"))
    }
    assert set(found) == {"torch", "tensorflow", "jax"}, "record every framework's payload output"
    return found


def run_of(framework: str, payload: dict[str, Any], *, image: str | None = None) -> BenchRun:
    return BenchRun(
        image=image or f"envbuild/{framework}:cpu",
        image_id="sha256:" + (framework * 64)[:64],
        framework=framework,
        framework_version=str((payload.get("versions") or {}).get("framework")),
        cuda="cpu",
        python="3.11",
        gpus=False,
        seconds=100.0,
        exit_code=0,
        errors=tuple(payload.get("errors") or ()),
        skipped=tuple(payload.get("skipped") or ()),
        bench=payload,
    )


def document(payloads: dict[str, dict[str, Any]]) -> dict[str, Any]:
    runs = [run_of(fw, p) for fw, p in payloads.items()]
    doc = bench_document(runs, HOST, budget_s=150, created="2026-12-01T00:00:00Z")
    doc["advice"] = [a.as_dict() for a in advise(doc)]
    return doc


# --------------------------------------------------------------------------
# arithmetic


@pytest.mark.parametrize(("world", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_busbw_is_algbw_times_2_n_minus_1_over_n(world: int, factor: float) -> None:
    # nccl-tests' definition for all-reduce (doc/PERFORMANCE.md): busbw = algbw * 2(n-1)/n.
    assert bench_harness.busbw(10.0, world) == pytest.approx(10.0 * factor)


def test_the_recorded_all_reduce_points_follow_nccl_tests_definitions() -> None:
    for framework, payload in recorded().items():
        part = payload["allreduce"]
        world = part["world_size"]
        assert world == 2, framework
        assert part["correct"] is True, framework
        assert len(part["points"]) >= 5, (framework, payload.get("skipped"))
        for point in part["points"]:
            algbw = point["bytes"] / point["seconds"] / 1e9
            assert point["algbw_gbps"] == pytest.approx(algbw, rel=1e-6), (framework, point)
            assert point["busbw_gbps"] == pytest.approx(algbw * 2 * (world - 1) / world, rel=1e-6)
            assert point["busbw"]["unit"] == "GB/s"
        sizes = [p["bytes"] for p in part["points"]]
        assert sizes == sorted(sizes), framework
        assert sizes[0] == 8, framework


def test_stats_median_and_spread() -> None:
    figure = bench_harness.stats([4.0, 1.0, 3.0, 2.0], "samples/s")
    assert (figure["median"], figure["min"], figure["max"]) == (2.5, 1.0, 4.0)
    assert figure["spread"] == pytest.approx(3.0 / (2 * 2.5))
    assert figure["samples"] == [4.0, 1.0, 3.0, 2.0]  # in the order they were measured
    assert bench_harness.stats([], "x")["median"] is None


def test_the_all_reduce_sizes_are_nccl_tests_8_bytes_to_256_mib_by_4() -> None:
    sizes = bench_harness.ALLREDUCE_SIZES
    assert sizes[0] == 8
    assert sizes[-1] == 256 * 1024 * 1024
    assert all(b == 4 * a for a, b in itertools.pairwise(sizes[:-1]))
    assert sizes[-1] == 2 * sizes[-2]  # 8 * 4**13 would pass 256 MiB: nccl-tests stops at -e


# --------------------------------------------------------------------------
# the recorded payloads


@pytest.mark.parametrize("framework", ["torch", "tensorflow", "jax"])
def test_a_recorded_payload_has_every_part(framework: str) -> None:
    payload = recorded()[framework]
    assert payload["errors"] == []
    assert payload["ok"] is True
    assert payload["bench_version"] == bench_harness.BENCH_VERSION
    precisions = {
        (r["model"], r["precision"]) for r in payload["throughput"]["results"] if "median" in r
    }
    assert {
        ("conv", "fp32"),
        ("conv", "bf16"),
        ("transformer", "fp32"),
        ("transformer", "bf16"),
    } <= precisions
    fp16 = [r for r in payload["throughput"]["results"] if r["precision"] == "fp16"]
    assert fp16
    assert all("unsupported" in r for r in fp16)
    assert all(r["eager"] and r["compiled"] for r in payload["compile"]["results"])
    assert {s["precision"] for s in payload["batch"]["sweeps"]} == {"fp32", "bf16"}
    assert all(len(s["points"]) >= 2 for s in payload["batch"]["sweeps"])
    assert [p["workers"] for p in payload["loader"]["points"]] == list(bench_harness.LOADER_WORKERS)
    assert payload["loader"]["step"]["unit"] == "batches/s"


# --------------------------------------------------------------------------
# advice


def test_every_advice_line_cites_figures_present_in_the_document() -> None:
    doc = document(recorded())
    assert doc["advice"], "recorded results of three frameworks give advice"
    topics = {a["topic"] for a in doc["advice"]}
    assert {"precision", "compile", "batch", "loader", "allreduce", "framework"} <= topics
    for advice in doc["advice"]:
        assert advice["figures"], advice
        for cited in advice["figures"]:
            assert pointer(doc, cited["path"]) == cited["value"], advice
            assert cited["shown"] == cited_text(cited["path"], cited["value"])
            assert cited["shown"] in advice["text"], advice


def _throughput(model: str, precision: str, median: float, spread: float = 0.01) -> dict[str, Any]:
    return {"model": model, "precision": precision, "batch": 64, "mode": "eager",
            **bench_harness.stats([median * (1 - spread), median, median * (1 + spread)], "samples/s")}  # fmt: skip


def one_image(**parts: Any) -> dict[str, Any]:
    payload = {**bench_harness.bench_parts(), **parts}
    return bench_document([run_of("torch", payload)], HOST, budget_s=150)


def test_precision_advice_says_use_autocast_when_bf16_is_faster() -> None:
    doc = one_image(
        throughput={
            "results": [_throughput("conv", "fp32", 1000), _throughput("conv", "bf16", 2100)]
        }
    )
    (advice,) = precision_advice(doc, 0)
    assert advice.text.startswith(
        "bf16 is 2.1× fp32 on the conv here (2,100 against 1,000 samples/s)"
    )
    assert "autocast" in advice.text


def test_precision_advice_keeps_fp32_when_bf16_is_slower_and_calls_a_difference_within_the_spread_alike() -> (
    None
):
    slower = one_image(
        throughput={
            "results": [_throughput("conv", "fp32", 1000), _throughput("conv", "bf16", 400)]
        }
    )
    assert "keep fp32" in precision_advice(slower, 0)[0].text
    noisy = one_image(
        throughput={
            "results": [
                _throughput("conv", "fp32", 1000, 0.2),
                _throughput("conv", "bf16", 1250, 0.2),
            ]
        }
    )
    assert "run alike" in precision_advice(noisy, 0)[0].text


def _rate_sweep(model: str, precision: str, rates: dict[int, float]) -> dict[str, Any]:
    points = [
        {"batch": batch, "peak_bytes": 2**20 * batch,
         **bench_harness.stats([rate * 0.99, rate, rate * 1.01], "samples/s")}
        for batch, rate in rates.items()
    ]  # fmt: skip
    return {"model": model, "precision": precision, "points": points,
            "largest_fit": max(rates), "stopped": "batch limit"}  # fmt: skip


def _cited_in_text(doc: dict[str, Any], advice: Any) -> None:
    for path, value in advice.figures:
        assert pointer(doc, path) == value
        assert cited_text(path, value) in advice.text


# The H200's own figures at batch 64 (benchmarks/gpu_probe.py `bench`, torch 2.11.0+cu130):
# the tiny transformer's bf16 step is slower than fp32's there, bound by launches and casts.
H200_BATCH_64 = {"fp32": 19436.0, "bf16": 15331.0}


def h200_transformer(*sweeps: dict[str, Any]) -> dict[str, Any]:
    """A document of the H200's transformer throughput at batch 64, with these batch sweeps."""
    results = [_throughput("transformer", p, rate) for p, rate in H200_BATCH_64.items()]
    return one_image(throughput={"results": results}, batch={"sweeps": list(sweeps)})


def test_precision_advice_reads_the_largest_batch_both_sweeps_measured_when_the_small_step_is_slower() -> (
    None
):
    doc = h200_transformer(
        _rate_sweep("transformer", "fp32", {64: 19000.0, 1024: 200000.0, 2048: 260000.0}),
        _rate_sweep("transformer", "bf16", {64: 15000.0, 1024: 300000.0, 2048: 440000.0, 4096: 500000.0}),
    )  # fmt: skip
    (advice,) = precision_advice(doc, 0)
    assert advice.text.startswith(
        "bf16 is 1.69× fp32 on the transformer at batch 2,048 here (440,000 against 260,000 samples/s), "
        "0.79× at batch 64 (15,331 against 19,436 samples/s)"
    )
    assert "train with bf16 autocast at large batches" in advice.text
    assert "no fast" not in advice.text
    _cited_in_text(doc, advice)


def test_precision_advice_keeps_fp32_when_mixed_precision_is_slower_at_every_batch_measured() -> (
    None
):
    doc = h200_transformer(
        _rate_sweep("transformer", "fp32", {64: 19000.0, 2048: 260000.0}),
        _rate_sweep("transformer", "bf16", {64: 15000.0, 2048: 250000.0}),
        _rate_sweep("conv", "bf16", {4096: 900000.0}),  # another model: not compared
    )
    (advice,) = precision_advice(doc, 0)
    assert advice.text == (
        "bf16 is 0.79× fp32 on the transformer at batch 64 here (15,331 against 19,436 samples/s), "
        "0.96× at batch 2,048 (250,000 against 260,000 samples/s): this device gains nothing "
        "from bf16 at the batches measured; keep fp32 for speed"
    )
    _cited_in_text(doc, advice)
    # Sweeps that reach no batch above the throughput's own say nothing more.
    small = h200_transformer(
        _rate_sweep("transformer", "fp32", {32: 9000.0, 64: 19000.0}),
        _rate_sweep("transformer", "bf16", {32: 9500.0, 64: 15000.0}),
    )
    (advice,) = precision_advice(small, 0)
    assert (
        "batch 64 here (15,331 against 19,436 samples/s): this device gains nothing" in advice.text
    )


def test_allreduce_advice_over_one_rank_claims_no_link_speed() -> None:
    # The H200's largest size over its one GPU (benchmarks/gpu_probe.py `bench`, NCCL 2.28.9):
    # 256 MiB in 27 microseconds, twice what its memory can copy: NCCL moved nothing.
    point = {
        "bytes": 268435456, "iterations": 7465, "seconds": 2.698388412591949e-05,
        "algbw_gbps": 9947.991725259193, "busbw_gbps": 0.0,
        "busbw": bench_harness.stats([0.0] * 5, "GB/s"), "correct": True,
        "note": "one rank: no communication",
    }  # fmt: skip
    doc = one_image(allreduce={"backend": "nccl", "world_size": 1, "points": [point]})
    (advice,) = allreduce_advice(doc, 0)
    assert advice.text == (
        "one rank: nccl has nothing to exchange (9,948 GB/s algbw at 256 MiB times the call, "
        "not a link); bus bandwidth needs 2 or more GPUs"
    )
    _cited_in_text(doc, advice)


def _loader(step: float, rates: dict[int, float]) -> dict[str, Any]:
    return {
        "kind": "test",
        "batch": 64,
        "step": {
            "model": "conv",
            "precision": "fp32",
            "batch": 64,
            **bench_harness.stats([step], "batches/s"),
        },
        "points": [
            {"workers": w, **bench_harness.stats([r], "batches/s")} for w, r in rates.items()
        ],
    }


def test_loader_advice_names_the_workers_that_starve_the_step_and_the_count_that_does_not() -> None:
    doc = one_image(loader=_loader(520, {0: 200, 1: 160, 2: 310, 4: 600}))
    (advice,) = loader_advice(doc, 0)
    assert (
        advice.text
        == "2 loader workers starve the step (loader 310 batches/s, step 520): use 4 (600 batches/s)"
    )


def test_loader_advice_when_no_worker_count_keeps_up_or_one_is_enough() -> None:
    starved = one_image(loader=_loader(520, {0: 100, 1: 110, 2: 200, 4: 300}))
    assert loader_advice(starved, 0)[0].text.startswith("even 4 loader workers starve the step")
    easy = one_image(loader=_loader(50, {0: 100, 1: 110, 2: 200, 4: 300}))
    assert loader_advice(easy, 0)[0].text.startswith("1 loader worker keeps up with the step")


def _sweep(points: dict[int, float], stopped: str) -> dict[str, Any]:
    largest = max(points)
    return {
        "model": "transformer",
        "precision": "bf16",
        "points": [
            {"batch": b, **bench_harness.stats([r], "samples/s"), "peak_bytes": b * 10**7}
            for b, r in points.items()
        ],
        "largest_fit": largest,
        "largest_fit_peak_bytes": largest * 10**7,
        "stopped": stopped,
    }


def test_batch_advice_calls_a_batch_the_largest_that_fits_only_when_memory_ended_the_sweep() -> (
    None
):
    oom = one_image(
        batch={"sweeps": [_sweep({256: 900, 512: 1000}, "out of memory at batch 1024")]}
    )
    texts = [a.text for a in batch_advice(oom, 0)]
    assert "largest transformer bf16 batch that fits: 512 (5.12 GB peak memory)" in texts
    assert (
        "transformer bf16 throughput levels off from batch 256 (900 samples/s, 90% of the best: 1,000 at batch 512)"
        in texts
    )
    timed = one_image(batch={"sweeps": [_sweep({8: 100, 16: 300}, "time: no time left")]})
    (first, *_) = batch_advice(timed, 0)
    assert first.text.startswith("largest transformer bf16 batch measured: 16")
    assert "time" in first.text


def test_compile_advice_gives_the_steps_that_pay_for_the_compile_time() -> None:
    result = {
        "model": "conv", "precision": "fp32", "batch": 64, "compile_seconds": 20.0, "speedup": 2.0,
        "eager": bench_harness.stats([1000.0], "samples/s"),
        "compiled": bench_harness.stats([2000.0], "samples/s"),
    }  # fmt: skip
    doc = one_image(
        compile={
            "eager_mode": "eager",
            "compiled_mode": "torch.compile (inductor)",
            "results": [result],
        }
    )
    (advice,) = compile_advice(doc, 0)
    # 1/1000 - 1/2000 = 0.5 ms saved per sample: 20 s pay for 40,000 samples = 625 steps of 64.
    assert advice.text == (
        "torch.compile (inductor) is 2× eager on the conv (2,000 against 1,000 samples/s) after 20 s "
        "compiling: worth it for runs longer than 625 steps of batch 64"
    )


def test_framework_advice_compares_the_same_model_across_frameworks() -> None:
    a = {
        **bench_harness.bench_parts(),
        "throughput": {"results": [_throughput("transformer", "fp32", 1300)]},
    }
    b = {
        **bench_harness.bench_parts(),
        "throughput": {"results": [_throughput("transformer", "fp32", 1000)]},
    }
    doc = bench_document([run_of("jax", a), run_of("torch", b)], HOST, budget_s=150)
    (advice,) = framework_advice(doc)
    assert (
        advice.text
        == "jax is 1.3× torch on the transformer at fp32 on this host (1,300 against 1,000 samples/s)"
    )


# --------------------------------------------------------------------------
# comparisons and history


def test_a_comparison_flags_only_changes_beyond_the_measured_spread() -> None:
    before = document(recorded())
    after = copy.deepcopy(before)
    results = after["images"][0]["bench"]["throughput"]["results"]
    slowed = next(r for r in results if r.get("median"))
    slowed["median"] *= 0.5  # half as fast: a regression whatever the spread
    cut = next(r for r in results if r.get("median") and r is not slowed)
    cut["median"] *= 1 - min(0.01, (cut["spread"] or 0) / 2)  # within the spread: not one
    comparison = compare_documents(after, before, against="before.json")
    flagged = {(r["image"], r["figure"]) for r in comparison["rows"] if r["regression"]}
    image = after["images"][0]["image"]
    assert (image, f"throughput {slowed['model']} {slowed['precision']}") in flagged
    assert (image, f"throughput {cut['model']} {cut['precision']}") not in flagged
    assert len(flagged) == 1
    assert len(comparison["rows"]) == sum(len(image_figures(after, i)) for i in range(3))
    doc = {**after, "comparison": comparison}
    assert any("REGRESSION" in line and "-50.0%" in line for line in bench_lines(doc))


def test_the_store_keeps_bench_results_per_image_and_host(tmp_path: Path) -> None:
    store = ResultStore(tmp_path / "results.sqlite3")
    doc = document(recorded())
    first = doc["images"][0]
    assert store.latest_bench(first["image"], "host-a") is None
    store.record_bench("host-a", first)
    newer = {**first, "seconds": 1.0}
    store.record_bench("host-a", newer)
    assert store.latest_bench(first["image"], "host-a") == newer
    assert store.latest_bench(first["image"], "host-b") is None


def test_hosts_differ_by_cpu_cores_memory_and_gpus() -> None:
    assert host_key(HOST) == host_key(dict(HOST))
    for change in (
        {"cores": 4},
        {"cpu_model": "Other"},
        {"gpus": [{"name": "H200", "memory_bytes": 1}]},
    ):
        assert host_key({**HOST, **change}) != host_key(HOST)


# --------------------------------------------------------------------------
# documents read back: hostile input


def hostile_documents() -> list[tuple[str, bytes]]:
    nested = b"[" * 100_000 + b"]" * 100_000
    good = json.dumps({"schema": "envbuild-bench", "version": 1, "images": []}).encode()
    return [
        ("empty", b""),
        ("not json", b"\x00\xff{not json"),
        ("a list", b"[1, 2]"),
        ("nested past the recursion limit", nested),
        ("another schema", json.dumps({"schema": "other", "version": 1, "images": []}).encode()),
        ("a later version", good.replace(b'"version": 1', b'"version": 2', 1)),
        (
            "images not a list",
            json.dumps({"schema": "envbuild-bench", "version": 1, "images": "x"}).encode(),
        ),
        (
            "images of numbers",
            json.dumps({"schema": "envbuild-bench", "version": 1, "images": [1]}).encode(),
        ),
    ]


@pytest.mark.parametrize(
    ("name", "content"), hostile_documents(), ids=[n for n, _ in hostile_documents()]
)
def test_a_hostile_compare_file_is_one_clear_error(
    tmp_path: Path, name: str, content: bytes
) -> None:
    path = tmp_path / "old.json"
    path.write_bytes(content)
    with pytest.raises(BadInput) as caught:
        load_document(path)
    message = caught.value.message
    assert message.startswith(f"--compare {path}: ")
    assert "\n" not in message
    assert "envbuild bench" in message


def test_an_oversized_compare_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "huge.json"
    with path.open("wb") as handle:  # sparse: the size is what is checked, nothing is read
        handle.truncate(65 * 1024 * 1024)
    with pytest.raises(BadInput, match="more than a bench document can be"):
        load_document(path)


def odd_values() -> list[Any]:
    return [
        None,
        True,
        -1,
        0,
        1e308,
        "x" * 10_000,
        [],
        {},
        [None],
        {"median": "fast"},
        float("nan"),
    ]


def test_tables_advice_and_comparisons_survive_documents_of_odd_shapes() -> None:
    base = document(recorded())
    for path, _ in [("/images/0/bench/throughput/results/0", None), ("/images/1/bench/loader", None),
                    ("/images/2/bench/batch/sweeps", None), ("/images/0/bench/allreduce/points/0/busbw", None),
                    ("/images/1/bench", None), ("/images/0", None)]:  # fmt: skip
        for value in odd_values():
            doc = copy.deepcopy(base)
            parent, key = path.rsplit("/", 1)
            container = pointer(doc, parent)
            container[int(key) if isinstance(container, list) else key] = value
            with contextlib.suppress(BadInput):  # a document with a non-dict image is refused
                checked_document(json.loads(json.dumps(doc, allow_nan=True)), source="test")
            lines = bench_lines({**doc, "advice": [a.as_dict() for a in advise(doc)]})
            assert lines
            assert all(isinstance(line, str) for line in lines)
            compare_documents(doc, base, against="x")
            compare_documents(base, doc, against="x")


# --------------------------------------------------------------------------
# running the payload (through the in-memory engine: the real run is in tests/e2e/test_bench.py)


def test_bench_image_passes_the_budget_and_the_images_run_options_and_reads_the_report() -> None:
    engine = InMemoryEngine()
    payload = recorded()["torch"]
    labels = {label_keys.FRAMEWORK: "torch", label_keys.FRAMEWORK_VERSION: "2.13.0",
              label_keys.CUDA: "cpu", label_keys.RUN_SHM_SIZE: "1g"}  # fmt: skip
    engine.add_image("torch", tags=("envbuild/torch:cpu",), labels=labels)
    engine.outputs["envbuild/torch:cpu"] = RunResult(
        exit_code=0, stdout="noise\n" + json.dumps(payload), stderr="", timed_out=False, seconds=1.0
    )
    run = bench_image(engine, "envbuild/torch:cpu", gpus="none", budget_s=90)
    (call,) = engine.runs
    assert call.environment == {"ENVBUILD_BENCH_BUDGET_S": "90"}
    assert call.shm_size == "1g"
    assert call.gpus is False
    # The payload folder goes in whole, as for the smoke test (one runner for both).
    assert {Path(f).name for f in call.files} >= {
        "torch_bench.py",
        "bench_harness.py",
        "smoke_harness.py",
        "torch_smoke.py",
    }
    assert run.ok
    assert run.bench["throughput"] == payload["throughput"]
    assert run.bench["run_with"] == "--shm-size=1g"


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        ("", "exited 137 without a JSON report"),
        (json.dumps({"bench_version": 99}), "reported version 99"),
    ],
)
def test_a_payload_without_a_usable_report_is_an_error_not_a_crash(
    stdout: str, expected: str
) -> None:
    engine = InMemoryEngine()
    engine.add_image("jax", tags=("envbuild/jax:cpu",), labels={label_keys.FRAMEWORK: "jax"})
    engine.outputs["envbuild/jax:cpu"] = RunResult(
        exit_code=137, stdout=stdout, stderr="Killed", timed_out=False, seconds=1.0
    )
    run = bench_image(engine, "envbuild/jax:cpu", gpus="none", budget_s=30)
    assert not run.ok
    assert expected in run.errors[0]


def test_an_image_envbuild_did_not_build_is_refused_with_the_fix() -> None:
    engine = InMemoryEngine()
    engine.add_image("x", tags=("debian:12",), labels={})
    with pytest.raises(BadInput, match=r"no org\.envbuild\.framework label"):
        bench_image(engine, "debian:12", budget_s=30)
    engine.add_image("y", tags=("other:1",), labels={label_keys.FRAMEWORK: "mxnet"})
    with pytest.raises(BadInput, match="no bench payload for framework 'mxnet'"):
        bench_image(engine, "other:1", budget_s=30)


def test_nothing_nan_reaches_the_json() -> None:
    doc = document(recorded())
    json.dumps(doc, allow_nan=False)
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in _walk(doc))


def _walk(node: Any) -> list[Any]:
    if isinstance(node, dict):
        return [x for v in node.values() for x in _walk(v)]
    if isinstance(node, list):
        return [x for v in node for x in _walk(v)]
    return [node]


# --------------------------------------------------------------------------
# the command line: bad input fails before any engine is asked


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), "nothing to bench: give IMAGE references, or -m MATRIX"),
        (("img:1", "--framework", "torch"), "give either IMAGE references or selectors"),
        (("img:1", "--budget", "5"), "Invalid value for '--budget'"),
        (("img:1", "--gpus", "some"), "Invalid value for '--gpus'"),
    ],
)
def test_bench_refuses_bad_options_with_one_line(args: tuple[str, ...], expected: str) -> None:
    result = CliRunner().invoke(main, ["bench", *args])
    assert result.exit_code == 2
    assert expected in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("name", "content"), hostile_documents()[:4], ids=[n for n, _ in hostile_documents()[:4]]
)
def test_a_hostile_compare_file_stops_bench_before_any_image_runs(
    tmp_path: Path, name: str, content: bytes
) -> None:
    path = tmp_path / "old.json"
    path.write_bytes(content)
    result = CliRunner().invoke(main, ["bench", "img:1", "--compare", str(path)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"envbuild: error: --compare {path}: ")


def test_a_matrix_benches_only_the_images_whose_smoke_test_passed(tmp_path: Path) -> None:
    engine = InMemoryEngine()
    store = ResultStore(tmp_path / "results.sqlite3")
    refs = ["envbuild/torch:a", "envbuild/jax:b", "envbuild/tensorflow:c", "envbuild/torch:gone"]
    ids = {ref: engine.add_image(ref, tags=(ref,)) for ref in refs[:3]}
    for ref, passed in (("envbuild/torch:a", True), ("envbuild/jax:b", False)):
        check = SmokeCheck(name="loss_fell", passed=passed, detail="")
        store.record_smoke(
            SmokeResult(image=ref, image_id=ids[ref], payload={}, checks=(check,), exit_code=0,
                        seconds=1.0, stderr_tail="")
        )  # fmt: skip
    vetted, notes = vetted_images(engine, store, refs)
    assert vetted == ["envbuild/torch:a"]
    assert notes == [
        "skipping envbuild/jax:b: not vetted (its last smoke test failed; `envbuild smoke envbuild/jax:b` first)",
        "skipping envbuild/tensorflow:c: not vetted (never smoke-tested; `envbuild smoke envbuild/tensorflow:c` first)",
        "skipping envbuild/torch:gone: not built here",
    ]
