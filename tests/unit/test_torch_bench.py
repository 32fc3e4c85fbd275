"""The torch bench payload's rules that run without torch: the batch sweep's memory and time
stops, the all-reduce's repetitions and the combining of the ranks' samples, the loader's crop,
message-size names; importing the payload must not import torch."""

from __future__ import annotations

import importlib
import random
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from envbuild.payload import smoke_harness as harness

PAYLOAD = Path(harness.__file__).parent
LOADED = (
    "torch_bench", "torch_smoke", "torch_ranks", "bench_harness", "smoke_harness",
    "smoke_verdicts", "package_imports", "payload_versions",
)  # fmt: skip


@pytest.fixture(scope="module")
def tb() -> Iterator[ModuleType]:
    """torch_bench.py as the container imports it: its folder first on sys.path."""
    before = "torch" in sys.modules
    sys.path.insert(0, str(PAYLOAD))
    try:
        module = importlib.import_module("torch_bench")
        assert ("torch" in sys.modules) == before, "importing the payload imported torch"
        yield module
    finally:
        sys.path.remove(str(PAYLOAD))
        for name in LOADED:
            sys.modules.pop(name, None)


# --------------------------------------------------------------------------
# the batch sweep


def test_a_point_takes_at_least_its_minimum_repetitions(tb: ModuleType) -> None:
    bench = tb.bench
    assert tb.bench.point_seconds(0.0) == pytest.approx(bench.MIN_REPS * bench.TARGET_REP_S)
    # A step longer than a repetition: warm-up, sizing call and MIN_REPS steps.
    assert tb.bench.point_seconds(2.0) == pytest.approx((2 + bench.MIN_REPS) * 2.0)
    times = [tb.bench.point_seconds(0.01 * 2**i) for i in range(12)]
    assert times == sorted(times)


@pytest.mark.parametrize("peak_mb", [100, 500, 2_000, 4_000, 4_250])
def test_the_memory_stop_leaves_a_sweep_running_while_twice_the_peak_fits(
    tb: ModuleType, peak_mb: int
) -> None:
    peak = peak_mb * 10**6
    available, rss = 16 * 10**9, 1 * 10**9  # half of 17 GB: 8.5 GB, twice 4.25 GB
    assert tb.bench.memory_stop(64, peak, available, rss) is None


@pytest.mark.parametrize(
    ("peak", "available", "rss"),
    [(5 * 10**9, 16 * 10**9, 10**9), (3 * 10**9, 10**9, 10**9), (10**9, 10**9, None)],
)
def test_the_memory_stop_names_the_batch_the_need_and_the_room(
    tb: ModuleType, peak: int, available: int, rss: int | None
) -> None:
    why = tb.bench.memory_stop(2048, peak, available, rss)
    room = available + (rss or 0)
    assert why is not None
    assert why.startswith(
        f"memory: batch 2048 would need about {2 * peak / 1e9:.1f} GB of {room / 1e9:.1f} GB available"
    )


def test_the_memory_stop_cannot_judge_without_figures(tb: ModuleType) -> None:
    assert tb.bench.memory_stop(16, None, 10**9, 10**9) is None
    assert tb.bench.memory_stop(16, 10**12, None, 10**9) is None


def test_a_figure_gets_an_equal_piece_or_the_floor(tb: ModuleType) -> None:
    assert tb.piece_seconds(40.0, 4) == pytest.approx(10.0)
    assert tb.piece_seconds(8.0, 4) == pytest.approx(tb.MIN_PIECE_S)
    assert tb.piece_seconds(1.0, 4) == pytest.approx(1.0)  # never more than is left
    assert tb.piece_seconds(5.0, 0) == pytest.approx(5.0)


# --------------------------------------------------------------------------
# the all-reduce


def once_times() -> Iterator[float]:
    rng = random.Random(13)
    for _ in range(40):
        yield 10 ** rng.uniform(-6, 1)


@pytest.mark.parametrize("once", list(once_times()))
@pytest.mark.parametrize("sizes_left", [1, 3, 14])
@pytest.mark.parametrize("left", [0.0, 0.5, 3.0, 30.0])
def test_the_allreduce_plan_fits_what_is_left(
    tb: ModuleType, once: float, sizes_left: int, left: float
) -> None:
    bench = tb.bench
    calls, reps = tb.allreduce_plan(once, left, sizes_left)
    assert calls >= 1
    if calls > 1:  # repetitions of about ALLREDUCE_REP_S
        assert calls * once <= tb.ALLREDUCE_REP_S * 1.0000001
        assert (calls + 1) * once > tb.ALLREDUCE_REP_S
    assert reps == 0 or bench.MIN_REPS <= reps <= bench.REPS
    assert reps * calls * once <= max(left, 0.0) + 1e-9
    if bench.REPS * calls * once <= left / sizes_left:
        assert reps == bench.REPS


def test_the_allreduce_plan_gives_no_repetitions_without_time(tb: ModuleType) -> None:
    assert tb.allreduce_plan(1.0, 2.0, 1)[1] == 0
    assert tb.allreduce_plan(1.0, 3.0, 5)[1] == tb.bench.MIN_REPS


def test_message_sizes_are_named_as_nccl_tests_tables_do(tb: ModuleType) -> None:
    names = [tb.size_text(n) for n in tb.bench.ALLREDUCE_SIZES]
    assert names[:3] == ["8 B", "32 B", "128 B"]
    assert "2 KiB" in names
    assert "32 MiB" in names
    assert names[-1] == "256 MiB"
    assert tb.size_text(1000) == "1000 B"


def rank_result(
    samples: list[list[float]], *, nbytes: int = 1024, correct: bool = True
) -> dict[str, Any]:
    return {
        "ok": True,
        "points": [
            {
                "bytes": nbytes * 4**i,
                "calls": 7,
                "samples": s,
                "correct": correct,
                "got": 3.0 if correct else 2.0,
            }
            for i, s in enumerate(samples)
        ],
    }


def test_a_repetition_lasts_as_long_as_its_slowest_rank(tb: ModuleType) -> None:
    results = {
        0: rank_result([[1e-3, 4e-3, 2e-3], [0.5, 0.5, 0.5]]),
        1: rank_result([[2e-3, 1e-3, 3e-3]]),  # one size fewer: only the common ones count
    }
    (point,) = tb.combine_points(results, 2)
    assert point["bytes"] == 1024
    assert point["iterations"] == 7 * 3
    assert point["seconds"] == pytest.approx(3e-3)  # median of (2, 4, 3) ms
    assert point["algbw_gbps"] == pytest.approx(1024 / 3e-3 / 1e9)
    assert point["busbw_gbps"] == pytest.approx(point["algbw_gbps"])  # 2(n-1)/n = 1 for n = 2
    assert point["busbw"]["unit"] == "GB/s"
    assert sorted(point["busbw"]["samples"]) == pytest.approx(
        sorted(1024 / s / 1e9 for s in (2e-3, 4e-3, 3e-3))
    )
    assert point["correct"] is True
    assert "note" not in point


def test_one_rank_has_no_bus_bandwidth_and_says_why(tb: ModuleType) -> None:
    (point,) = tb.combine_points({0: rank_result([[1e-3, 1e-3, 1e-3]])}, 1)
    assert point["busbw_gbps"] == 0.0
    assert point["busbw"]["median"] == 0.0
    assert point["note"] == tb.bench.ONE_RANK_NOTE


def test_a_wrong_sum_is_kept_with_what_came_back(tb: ModuleType) -> None:
    results = {0: rank_result([[1e-3] * 3]), 1: rank_result([[1e-3] * 3], correct=False)}
    (point,) = tb.combine_points(results, 2)
    assert point["correct"] is False
    assert point["got"] == 2.0


# --------------------------------------------------------------------------
# the loader's sample


def draws() -> Iterator[Callable[[int], int]]:
    yield lambda n: 0
    yield lambda n: n - 1
    for seed in range(20):
        yield random.Random(seed).randrange


@pytest.mark.parametrize("draw", list(draws()))
def test_the_random_crop_stays_inside_the_image(tb: ModuleType, draw: Callable[[int], int]) -> None:
    top, left = tb.bench.crop_offsets(draw)
    for corner in (top, left):
        assert corner >= 0
        assert corner + tb.bench.LOADER_CROP_SIDE <= tb.bench.LOADER_IMAGE_SIDE


def test_the_crop_reaches_every_offset(tb: ModuleType) -> None:
    assert (
        tb.bench.crop_offsets(lambda n: n - 1)
        == (tb.bench.LOADER_IMAGE_SIDE - tb.bench.LOADER_CROP_SIDE,) * 2
    )


def test_a_step_figure_in_batches_per_second(tb: ModuleType) -> None:
    figure = tb.bench.stats([640.0, 320.0, 960.0], "samples/s")
    figure.update(steps_per_rep=4, warmup_seconds=0.5)
    out = tb.bench.per_batch(figure, 64)
    assert out["unit"] == "batches/s"
    assert out["samples"] == [10.0, 5.0, 15.0]
    assert out["median"] == 10.0
    assert out["spread"] == pytest.approx(figure["spread"])
    assert (out["steps_per_rep"], out["warmup_seconds"]) == (4, 0.5)


def test_passes_over_a_figure_merge_into_one_figure_of_all_their_samples(tb: ModuleType) -> None:
    first = tb.bench.stats([100.0, 110.0, 105.0], "samples/s")
    first.update(steps_per_rep=8, warmup_seconds=0.2)
    second = tb.bench.stats([90.0, 95.0, 92.0, 94.0], "samples/s")
    second.update(steps_per_rep=9, warmup_seconds=0.01)
    merged = tb.merge_figures([first, second])
    assert merged["samples"] == [100.0, 110.0, 105.0, 90.0, 95.0, 92.0, 94.0]
    assert merged["median"] == 95.0
    assert merged["spread"] == pytest.approx((110.0 - 90.0) / (2 * 95.0))
    assert (merged["steps_per_rep"], merged["warmup_seconds"], merged["passes"]) == (8, 0.2, 2)
    assert tb.merge_figures([first])["median"] == first["median"]


@pytest.mark.parametrize("workers", [0, 1, 2, 4, 16])
@pytest.mark.parametrize("prefetch", [1, 2, 8])
def test_a_timed_loader_call_reads_more_than_twice_the_prefetched_batches(
    tb: ModuleType, workers: int, prefetch: int
) -> None:
    group = tb.bench.loader_group(workers, prefetch)
    assert group > 2 * workers * prefetch
    assert group <= 2 * workers * prefetch + 1
    assert tb.bench.loader_group(workers) == tb.bench.loader_group(
        workers, tb.bench.LOADER_PREFETCH
    )
