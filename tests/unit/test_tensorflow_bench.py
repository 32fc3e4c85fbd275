"""The TensorFlow bench payload's logic that needs no TensorFlow: when a batch sweep stops (the
largest batch, the CPU memory rule, the time rule), the next point's time estimate, which
all-reduce sizes a short budget measures, and a figure rescaled to batches/s."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envbuild.payload import bench_harness as bench

PAYLOAD = Path(bench.__file__).parent
GB = 10**9


@pytest.fixture(scope="module")
def tfb() -> Iterator[ModuleType]:
    """tensorflow_bench.py as the container imports it (`import bench_harness` from its folder);
    it needs TensorFlow only inside its sections."""
    sys.path.insert(0, str(PAYLOAD))
    try:
        yield importlib.import_module("tensorflow_bench")
    finally:
        sys.path.remove(str(PAYLOAD))
        for name in (
            "tensorflow_bench", "tensorflow_smoke", "bench_harness", "smoke_harness",
            "smoke_verdicts", "package_imports",
        ):  # fmt: skip
            sys.modules.pop(name, None)


def stop(tfb: ModuleType, batch: int, **kwargs: object) -> str | None:
    args: dict[str, object] = {
        "peak_bytes": 1 * GB, "available_bytes": 20 * GB, "rss_bytes": 1 * GB,
        "seconds_left": 30.0, "next_s": 2.0,
    }  # fmt: skip
    args.update(kwargs)
    result: str | None = tfb.bench.sweep_stop(batch, **args)
    return result


# --------------------------------------------------------------------------
# sweep_stop


def test_a_point_that_fits_in_memory_and_time_goes_on(tfb: ModuleType) -> None:
    assert stop(tfb, 64) is None


def test_the_sweep_ends_past_the_largest_batch(tfb: ModuleType) -> None:
    assert stop(tfb, bench.BATCH_MAX) is None
    reason = stop(tfb, bench.BATCH_MAX * 2)
    assert reason is not None
    assert str(bench.BATCH_MAX) in reason
    # Not a memory or time verdict: the host must not call the last batch "the largest that fits".
    assert not reason.startswith(("memory", "out of memory", "time"))


@pytest.mark.parametrize("peak_gb", [x / 4 for x in range(1, 40)])
def test_the_cpu_memory_rule_is_twice_the_peak_against_half_of_what_the_process_may_hold(
    tfb: ModuleType, peak_gb: float
) -> None:
    available, rss = 14 * GB, 2 * GB
    reason = stop(tfb, 512, peak_bytes=int(peak_gb * GB), available_bytes=available, rss_bytes=rss)
    too_big = 2 * peak_gb * GB > bench.CPU_MEMORY_FRACTION * (available + rss)
    assert (reason is not None) == too_big
    if reason is not None:
        assert reason.startswith("memory: batch 512 would need about")
        assert f"{2 * peak_gb:.1f} GB" in reason
        assert f"{bench.CPU_MEMORY_FRACTION * 16:.1f} GB available" in reason


def test_the_memory_rule_is_for_the_cpu_alone(tfb: ModuleType) -> None:
    # On a GPU there is no available-memory figure: an out-of-memory error ends the sweep.
    assert stop(tfb, 512, peak_bytes=10**15, available_bytes=None) is None
    # Before the first point there is no peak yet.
    assert stop(tfb, 8, peak_bytes=None, available_bytes=1) is None


def test_memory_is_judged_before_time(tfb: ModuleType) -> None:
    reason = stop(tfb, 512, peak_bytes=100 * GB, seconds_left=0.0)
    assert reason is not None
    assert reason.startswith("memory")


@pytest.mark.parametrize("next_s", [0.5, 2.9, 3.0, 3.1, 60.0])
def test_the_time_rule_stops_when_the_next_point_would_not_fit(
    tfb: ModuleType, next_s: float
) -> None:
    reason = stop(tfb, 1024, seconds_left=3.0, next_s=next_s)
    assert (reason is not None) == (next_s > 3.0)
    if reason is not None:
        assert reason.startswith("time: batch 1024 would need about")


# --------------------------------------------------------------------------
# next_point_seconds


def test_a_fast_step_costs_its_setup_and_the_minimum_repetitions(tfb: ModuleType) -> None:
    assert tfb.bench.next_point_seconds(0.001, 1.5) == pytest.approx(
        1.5 + 4 * 0.001 + bench.MIN_REPS * bench.TARGET_REP_S
    )


@given(step=st.floats(0, 100), setup=st.floats(0, 100), more=st.floats(0, 100))
def test_the_estimate_grows_with_the_step_and_the_setup(
    tfb: ModuleType, step: float, setup: float, more: float
) -> None:
    estimate = tfb.bench.next_point_seconds(step, setup)
    assert estimate >= setup + bench.MIN_REPS * bench.TARGET_REP_S
    assert tfb.bench.next_point_seconds(step + more, setup) >= estimate
    assert tfb.bench.next_point_seconds(step, setup + more) >= estimate
    # A slow step (a repetition is one step): the doubled step, run 2 + MIN_REPS times.
    if step * 2 >= bench.TARGET_REP_S:
        assert estimate == pytest.approx(setup + (2 + bench.MIN_REPS) * 2 * step)


# --------------------------------------------------------------------------
# spread_pick


@given(count=st.integers(1, 40), fit=st.integers(-3, 50))
def test_a_short_budget_measures_sizes_spread_from_small_to_large(
    tfb: ModuleType, count: int, fit: int
) -> None:
    picked = tfb.spread_pick(count, fit)
    assert picked == sorted(set(picked))
    assert all(0 <= i < count for i in picked)
    assert len(picked) == min(count, max(0, fit))
    if fit >= 1:
        assert picked[-1] == count - 1  # the largest message is always measured
    if fit >= 2:
        assert picked[0] == 0


def test_spread_pick_on_the_real_sizes(tfb: ModuleType) -> None:
    sizes = bench.ALLREDUCE_SIZES
    assert [sizes[i] for i in tfb.spread_pick(len(sizes), 3)] == [8, 8 * 4**6, sizes[-1]]


# --------------------------------------------------------------------------
# per_batch (bench_harness)


def test_a_samples_per_second_figure_becomes_batches_per_second(tfb: ModuleType) -> None:
    figure = bench.stats([640.0, 1280.0, 960.0], "samples/s")
    figure.update(steps_per_rep=7, warmup_seconds=0.5)
    scaled = tfb.bench.per_batch(figure, 64)
    assert scaled["unit"] == "batches/s"
    assert scaled["samples"] == [10.0, 20.0, 15.0]
    assert scaled["median"] == 15.0
    assert scaled["spread"] == pytest.approx(figure["spread"])
    assert (scaled["steps_per_rep"], scaled["warmup_seconds"]) == (7, 0.5)
