"""The JAX bench payload's pure rules, run on the host without jax: the batch sweep's stop rules,
the repetitions a section's clock allows, the all-reduce points (nccl-tests' busbw), and the work
the loader and the models do in numpy (the sample transform, the parameters' sizes)."""

from __future__ import annotations

import importlib
import itertools
import math
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envbuild.payload import bench_harness as bench

PAYLOAD = Path(bench.__file__).parent
HANG_GUARD_S = 120
GB = 1_000_000_000


@pytest.fixture(scope="module")
def jb() -> Iterator[ModuleType]:
    """jax_bench.py as the container imports it (its siblings from its own folder)."""
    sys.path.insert(0, str(PAYLOAD))
    try:
        yield importlib.import_module("jax_bench")
    finally:
        sys.path.remove(str(PAYLOAD))
        for name in (
            "jax_bench", "jax_smoke", "smoke_harness", "bench_harness", "smoke_verdicts",
            "package_imports", "payload_versions",
        ):  # fmt: skip
            sys.modules.pop(name, None)


def test_the_payload_imports_without_jax() -> None:
    # The loader's worker processes re-import the payload: jax must load only inside main().
    code = (
        "import sys; sys.modules['jax'] = None; sys.modules['numpy'] = None; "
        f"sys.path.insert(0, {str(PAYLOAD)!r}); import jax_bench; print(jax_bench.PAYLOAD)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=HANG_GUARD_S
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "jax_bench"


# --------------------------------------------------------------------------
# the batch sweep


def test_the_sweep_doubles_from_the_start_to_the_largest(jb: ModuleType) -> None:
    batches = jb.bench.sweep_batches()
    assert batches[0] == bench.BATCH_START
    assert all(b * 2 == n for b, n in itertools.pairwise(batches))
    assert batches[-1] <= bench.BATCH_MAX < batches[-1] * 2


@given(
    peak=st.integers(1, 64 * GB),
    available=st.integers(0, 256 * GB),
    rss=st.integers(0, 64 * GB),
    batch=st.sampled_from([16, 1024, 65536]),
)
def test_memory_stops_a_sweep_exactly_when_twice_the_peak_passes_the_fraction(
    jb: ModuleType, peak: int, available: int, rss: int, batch: int
) -> None:
    why = jb.bench.memory_stop(batch, peak, available, rss)
    over = 2 * peak > bench.CPU_MEMORY_FRACTION * (available + rss)
    assert (why is not None) == over
    if why is not None:
        # the host calls largest_fit "the largest that fits" only for a reason starting so
        assert why.startswith(f"memory: batch {batch} would need about ")
        assert "GB available" in why


@pytest.mark.parametrize(("peak", "available"), [(None, 8 * GB), (GB, None), (None, None)])
def test_an_unknown_peak_or_memory_never_stops_a_sweep(
    jb: ModuleType, peak: int | None, available: int | None
) -> None:
    assert jb.bench.memory_stop(32, peak, available, GB) is None


@given(last=st.none() | st.floats(0.0, 1000.0), left=st.floats(0.0, 1000.0))
def test_time_stops_a_sweep_when_the_next_point_would_not_fit(
    jb: ModuleType, last: float | None, left: float
) -> None:
    # ``last``: the last point's step (None before the first point, which expects a warm-up).
    if last is None:
        need = jb.bench.point_seconds(0.0, jb.FIRST_WARMUP_S)
    else:
        need = jb.bench.next_point_seconds(last, 0.0)
    why = jb.bench.time_stop(256, need, left)
    assert (why is None) == (need <= left)
    if why is not None:
        assert why.startswith("time: batch 256 would need about ")


# --------------------------------------------------------------------------
# repetitions within a section's clock


def test_no_measurement_starts_without_its_minimum_time(jb: ModuleType) -> None:
    assert jb.reps_for(jb.MIN_ITEM_S - 0.01, 1, 0.0) is None
    assert jb.reps_for(1000.0, 0, 0.0) is None


@given(left=st.floats(0.0, 600.0), items=st.integers(1, 20), warmup=st.floats(0.0, 30.0))
def test_repetitions_are_full_when_the_equal_part_holds_them_else_the_minimum(
    jb: ModuleType, left: float, items: int, warmup: float
) -> None:
    reps = jb.reps_for(left, items, warmup)
    full = warmup + (bench.REPS + 2) * bench.TARGET_REP_S
    if left < jb.MIN_ITEM_S:
        assert reps is None
    elif left / items >= full:
        assert reps == bench.REPS
    else:
        assert reps == bench.MIN_REPS


def test_items_expect_the_warmup_they_last_saw(jb: ModuleType) -> None:
    clock = bench.Clock(10.0)
    items = jb.Items(clock, 2)
    assert items.reps() == bench.REPS  # 5 s each holds 1 s of warm-up and 7 x 0.25 s
    items.seen({"warmup_seconds": 9.0})
    assert items.reps() == bench.MIN_REPS  # 10 s left, but a 9 s warm-up is now expected


# --------------------------------------------------------------------------
# all-reduce points and per-batch figures


def rates_figure(rates: list[float], steps: int) -> dict[str, Any]:
    figure = bench.stats(rates, "allreduces/s")
    figure.update(steps_per_rep=steps, warmup_seconds=0.1)
    return figure


@pytest.mark.parametrize("world", [2, 3, 4, 8])
@pytest.mark.parametrize("nbytes", bench.ALLREDUCE_SIZES[::4])
def test_an_allreduce_point_has_nccl_tests_bandwidths(
    jb: ModuleType, world: int, nbytes: int
) -> None:
    point = jb.allreduce_point(nbytes, world, rates_figure([100.0, 200.0, 400.0], 7))
    assert point["bytes"] == nbytes
    assert point["seconds"] == pytest.approx(1 / 200.0)
    assert point["algbw_gbps"] == pytest.approx(nbytes * 200.0 / 1e9)
    assert point["busbw_gbps"] == pytest.approx(point["algbw_gbps"] * 2 * (world - 1) / world)
    assert point["iterations"] == 7 * 3
    busbw = point["busbw"]
    assert busbw["unit"] == "GB/s"
    assert busbw["median"] == pytest.approx(point["busbw_gbps"])
    assert len(busbw["samples"]) == 3
    assert "note" not in point


def test_one_rank_has_no_bus_bandwidth_and_says_why(jb: ModuleType) -> None:
    point = jb.allreduce_point(1024, 1, rates_figure([10.0, 11.0, 12.0], 1))
    assert point["busbw_gbps"] == 0.0
    assert point["busbw"]["samples"] == [0.0, 0.0, 0.0]
    assert point["note"] == "one rank: no communication"


def test_a_samples_figure_becomes_batches_per_second(jb: ModuleType) -> None:
    figure = bench.stats([640.0, 1280.0, 960.0], "samples/s")
    figure.update(steps_per_rep=4, warmup_seconds=2.0)
    out = jb.bench.per_batch(figure, 64)
    assert out["unit"] == "batches/s"
    assert out["samples"] == [10.0, 20.0, 15.0]
    assert out["median"] == 15.0
    assert out["steps_per_rep"] == 4


# --------------------------------------------------------------------------
# the loader's samples and the models' arrays (numpy, as in the container)


@pytest.fixture(scope="module")
def np() -> ModuleType:
    numpy: ModuleType = pytest.importorskip("numpy")
    return numpy


@pytest.mark.parametrize("index", [0, 1, 2, 63, 64, 10_000, 2**31 - 1])
def test_a_loader_sample_is_a_normalised_crop_of_its_seeded_image(
    jb: ModuleType, np: ModuleType, index: int
) -> None:
    sample = jb.loader_sample(np, index)
    assert sample.shape == (3, jb.bench.LOADER_CROP_SIDE, jb.bench.LOADER_CROP_SIDE)
    assert sample.dtype == np.float32
    # undoing the normalisation gives back uint8 pixel values
    mean = np.asarray(jb.bench.LOADER_MEAN, np.float32).reshape(3, 1, 1)
    std = np.asarray(jb.bench.LOADER_STD, np.float32).reshape(3, 1, 1)
    pixels = sample * std + mean
    assert np.allclose(pixels, np.round(pixels), atol=1e-3)
    assert pixels.min() > -0.5
    assert pixels.max() < 255.5
    assert np.array_equal(sample, jb.loader_sample(np, index))
    assert not np.array_equal(sample, jb.loader_sample(np, index + 1))


def test_a_loader_batch_stacks_its_samples(jb: ModuleType, np: ModuleType) -> None:
    images, labels = jb.loader_batch(3, batch=8)
    assert images.shape == (8, 3, jb.bench.LOADER_CROP_SIDE, jb.bench.LOADER_CROP_SIDE)
    assert np.array_equal(images[5], jb.loader_sample(np, 3 * 8 + 5))
    assert labels.tolist() == [(24 + i) % 10 for i in range(8)]


def parameter_count(np: ModuleType, tree: Any) -> int:
    if isinstance(tree, dict):
        return sum(parameter_count(np, v) for v in tree.values())
    if isinstance(tree, list):
        return sum(parameter_count(np, v) for v in tree)
    assert tree.dtype == np.float32
    return int(tree.size)


def test_the_models_have_the_shared_definitions_sizes(jb: ModuleType, np: ModuleType) -> None:
    # the definitions the payload imports beside itself, as in the container
    conv: dict[str, Any] = jb.bench.CONV
    block: dict[str, Any] = jb.bench.TRANSFORMER
    c0, (c1, c2, c3), classes = conv["input"][0], conv["channels"], conv["classes"]
    conv_count = sum(i * o * 9 + o for i, o in ((c0, c1), (c1, c2), (c2, c3))) + c3 * classes
    conv_count += classes
    width, ffn = block["width"], block["ffn"]
    block_count = 2 * 2 * width + 4 * (width * width + width)
    block_count += (width * ffn + ffn) + (ffn * width + width) + (width * classes + classes)
    assert parameter_count(np, jb.model_arrays(np, conv)) == conv_count
    assert parameter_count(np, jb.model_arrays(np, block)) == block_count


@pytest.mark.parametrize("name", ["conv", "transformer"])
def test_weights_and_batches_are_fixed_by_their_seed(
    jb: ModuleType, np: ModuleType, name: str
) -> None:
    model: dict[str, Any] = {m["name"]: m for m in jb.bench.MODELS}[name]
    first, again = jb.model_arrays(np, model), jb.model_arrays(np, model)
    assert np.array_equal(first["head"]["w"], again["head"]["w"])
    bound = 1 / math.sqrt(first["head"]["w"].shape[0])
    assert np.abs(first["head"]["w"]).max() <= bound
    x, y = jb.batch_arrays(np, model, 16)
    x2, y2 = jb.batch_arrays(np, model, 16)
    assert np.array_equal(x, x2)
    assert np.array_equal(y, y2)
    assert x.shape[0] == 16
    assert x.dtype == np.float32
    assert 0 <= y.min() <= y.max() < model["classes"]
