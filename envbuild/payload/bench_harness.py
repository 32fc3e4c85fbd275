"""What envbuild's bench payloads share; runs INSIDE the container, stdlib only.

``envbuild bench`` copies the payload folder into the container and runs one
``<framework>_bench.py``; its ``benchmark(run, budget)`` runs under this file's ``main``
(the smoke harness's run: one JSON document on stdout, sections under deadlines).  This file
holds what every framework measures alike, so that the figures compare fairly:

  * the two models, by their sizes (``CONV``, ``TRANSFORMER``): each framework
    builds exactly these, so "jax is 1.3x torch on the transformer block" compares
    the same arithmetic;
  * ``measure`` -- warm-up, then timed repetitions, each a median-able sample;
    ``stats`` -- median, min, max and the spread reported with every figure;
  * ``Budget`` -- the run's time (ENVBUILD_BENCH_BUDGET_S), shared out among
    the sections (``run_sections``); what a section had no time for is recorded in
    ``skipped``, never silently left out;
  * the batch sweep -- ``run_sweep``: its stop rules (``sweep_stop``: the largest batch,
    ``memory_stop`` on the CPU, ``time_stop`` from ``next_point_seconds``);
  * the loader's per-sample work (``LOADER_MEAN``, ``crop_offsets``, ``loader_group``);
  * memory: the peak resident memory of a step on the CPU (``/proc/self``);
  * the all-reduce message sizes and nccl-tests' bandwidth definitions.

Nothing here may import more than the standard library when it loads (the host imports it for
the document's version and the budget's bounds; ``main`` and ``run_sections`` import the smoke
harness beside it), and it must run on every Python an image can bring (3.8 and later).
"""

from __future__ import annotations

import copy
import functools
import math
import os
import platform
import time
from collections.abc import Callable
from typing import Any

# Version of the bench document's shape; the host refuses a document of another version.
BENCH_VERSION = 1

DEFAULT_BUDGET_S = 150.0
MIN_BUDGET_S = 20.0
# The harness's hard deadline is the budget plus this: sections skip what they have no time for
# well before it, so it only stops a section that hangs.
MARGIN_S = 60.0
# A section's hard deadline (Run.section) is its share plus this grace.
SECTION_GRACE_S = 30.0

# Each section's share of the budget, in the order the payloads run them.
SHARES = (
    ("throughput", 0.22),
    ("compile", 0.18),
    ("batch", 0.25),
    ("loader", 0.15),
    ("allreduce", 0.15),
)
# What is left (10%) covers start-up, imports and the report.

# The two standard models.  Every framework builds these and nothing else.
#   conv: NCHW input 3x32x32 -> conv3x3(3->32, stride 1, same) -> ReLU -> conv3x3(32->64,
#         stride 2, same) -> ReLU -> conv3x3(64->64, stride 2, same) -> ReLU -> global average
#         pool -> dense(64->10); softmax cross-entropy over 10 classes.
#   transformer: input (batch, 64, 128) float -> one pre-LayerNorm block:
#         x + MHA(LN(x)) with 4 heads of 32, then x + W2 GELU(W1 LN(x)) with 128->512->128;
#         mean over the sequence -> dense(128->10); softmax cross-entropy.
#   Both: plain SGD, learning rate 0.01, weights from a fixed seed, one fixed random batch.
CONV = {"name": "conv", "input": [3, 32, 32], "channels": [32, 64, 64], "classes": 10}
TRANSFORMER = {
    "name": "transformer",
    "sequence": 64,
    "width": 128,
    "heads": 4,
    "ffn": 512,
    "classes": 10,
}
MODELS = (CONV, TRANSFORMER)
LEARNING_RATE = 0.01
DEFAULT_BATCH = 64

# Precisions: fp32; bf16 autocast (GPU and CPU); fp16 autocast with loss scaling (GPU only).
PRECISIONS = ("fp32", "bf16", "fp16")

# Repetitions per figure, and how long one repetition should take (steps are grouped until it does).
WARMUP_REPS = 1
REPS = 5
MIN_REPS = 3
TARGET_REP_S = 0.25

# Batch-size sweep: from BATCH_START, doubling, up to BATCH_MAX, while memory and time allow.
BATCH_START = 8
BATCH_MAX = 65536
# Why a sweep that neither memory nor time stopped ended.
LARGEST_REACHED = f"reached the largest batch tried ({BATCH_MAX})"
# On the CPU, stop before a step's peak would pass this fraction of the memory available.
CPU_MEMORY_FRACTION = 0.5

# Loader: the worker counts tried.
LOADER_WORKERS = (0, 1, 2, 4)
# The loader's per-sample work, the same in every framework: a "decoded" uint8 image of
# 3 x LOADER_IMAGE_SIDE^2 made from the sample's index, a random LOADER_CROP_SIDE^2 crop, a random
# horizontal flip, then to float32 normalised per channel as (pixel - LOADER_MEAN) / LOADER_STD.
# One normalisation for every framework, so that their loaders do the same arithmetic: ImageNet's
# mean and std (torchvision's Normalize) in pixel units, 0-255, as mmcv's configs write them --
# what ToTensor's /255 and Normalize give, in one subtraction and one division of the raw pixels.
LOADER_IMAGE_SIDE = 48
LOADER_CROP_SIDE = 32
LOADER_MEAN = (123.675, 116.28, 103.53)
LOADER_STD = (58.395, 57.12, 57.375)
# Batches each loader worker holds ready (torch's DataLoader's default prefetch_factor).
LOADER_PREFETCH = 2

# All-reduce message sizes, 8 B to 256 MiB by factors of 4 (then the last), as nccl-tests' -b 8 -e 256M -f 4.
ALLREDUCE_SIZES = tuple(
    sorted({8 * 4**i for i in range(14) if 8 * 4**i <= 256 * 1024 * 1024} | {256 * 1024 * 1024})
)
# What an all-reduce point of a single rank says instead of a bus bandwidth.
ONE_RANK_NOTE = "one rank: no communication"


def stats(samples: list[float], unit: str) -> dict[str, Any]:
    """A figure: its samples, median, min, max and spread (half the range over the median)."""
    ordered = sorted(float(s) for s in samples)
    n = len(ordered)
    if n == 0:
        return {
            "unit": unit,
            "samples": [],
            "median": None,
            "min": None,
            "max": None,
            "spread": None,
        }
    mid = n // 2
    median = ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2.0
    spread = (ordered[-1] - ordered[0]) / (2.0 * median) if median else None
    return {
        "unit": unit,
        "samples": [float(s) for s in samples],
        "median": median,
        "min": ordered[0],
        "max": ordered[-1],
        "spread": spread,
    }


def busbw(algbw: float, world: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: algbw x 2(n-1)/n (0 for one rank)."""
    return algbw * 2.0 * (world - 1) / world if world > 1 else 0.0


class Budget:
    """The bench run's time: ENVBUILD_BENCH_BUDGET_S seconds from its start, shared by sections."""

    def __init__(self, total_s: float) -> None:
        self.total_s = float(total_s)
        self.start = time.monotonic()
        self.skipped: list[str] = []

    @classmethod
    def from_env(cls, errors: list[str]) -> Budget:
        """The budget the host asked for; a bad value is an error and the default is used."""
        raw = os.environ.get("ENVBUILD_BENCH_BUDGET_S", "").strip()
        if not raw:
            return cls(DEFAULT_BUDGET_S)
        try:
            value = float(raw)
            if not value >= MIN_BUDGET_S:
                raise ValueError(f"must be at least {MIN_BUDGET_S:g}")
            return cls(value)
        except ValueError as exc:
            errors.append(
                f"budget: bad ENVBUILD_BENCH_BUDGET_S={raw!r} ({exc}); using {DEFAULT_BUDGET_S:g}"
            )
            return cls(DEFAULT_BUDGET_S)

    def left(self) -> float:
        """Seconds left of the whole budget."""
        return max(0.0, self.total_s - (time.monotonic() - self.start))

    def share(self, section: str) -> float:
        """Seconds this section may use: its share of the budget, plus whatever earlier sections
        left unused, never more than what is left."""
        shares = dict(SHARES)
        before = 0.0
        for name, fraction in SHARES:
            if name == section:
                break
            before += fraction
        planned_end = (before + shares.get(section, 0.0)) * self.total_s
        return max(0.0, min(self.left(), planned_end - (time.monotonic() - self.start)))

    def skip(self, section: str, what: str, why: str = "no time left in the budget") -> None:
        """Record that ``what`` of ``section`` was not measured, and why."""
        self.skipped.append(f"{section}: {what}: {why}")


class Clock:
    """A section's own deadline, from its share of the budget."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + max(0.0, seconds)

    def left(self) -> float:
        return max(0.0, self.end - time.monotonic())


def measure(
    step: Callable[[], Any],
    *,
    items_per_step: float,
    unit: str,
    clock: Clock,
    sync: Callable[[], Any] | None = None,
    reps: int = REPS,
    warmup: int = WARMUP_REPS,
) -> dict[str, Any] | None:
    """Time ``step`` (one training step, one batch, ...): one untimed warm-up call per
    ``warmup``, then ``reps`` repetitions of as many calls as make about TARGET_REP_S each.
    Returns ``stats`` of items/s (``items_per_step`` per call) with ``steps_per_rep``, or None
    when the clock ran out before MIN_REPS repetitions (nothing half-measured is reported).
    ``sync`` waits for queued device work (CUDA streams, XLA's async dispatch) before a clock
    is read."""

    def done() -> None:
        if sync is not None:
            sync()

    t0 = time.perf_counter()
    for _ in range(max(1, warmup)):
        step()
    done()
    first = time.perf_counter() - t0
    # One more call, timed alone, to size the repetitions.
    t0 = time.perf_counter()
    step()
    done()
    once = max(time.perf_counter() - t0, 1e-6)
    calls = max(1, int(TARGET_REP_S / once))
    samples: list[float] = []
    for _ in range(reps):
        if clock.left() < once * calls * 1.2 and len(samples) >= MIN_REPS:
            break
        if clock.left() < once * calls:
            break
        t0 = time.perf_counter()
        for _ in range(calls):
            step()
        done()
        elapsed = time.perf_counter() - t0
        samples.append(items_per_step * calls / elapsed)
    if len(samples) < MIN_REPS:
        return None
    figure = stats(samples, unit)
    figure["steps_per_rep"] = calls
    figure["warmup_seconds"] = first
    return figure


def per_batch(figure: dict[str, Any], batch: int) -> dict[str, Any]:
    """A samples/s figure as batches/s of ``batch`` samples (each sample divided by the batch),
    its steps_per_rep and warmup_seconds kept."""
    out = stats([s / batch for s in figure["samples"]], "batches/s")
    for key in ("steps_per_rep", "warmup_seconds"):
        if key in figure:
            out[key] = figure[key]
    return out


def check_loss(errors: list[str], where: str, loss: float | None) -> bool:
    """Whether the last step's loss is finite; a loss that is not is an error (the precision
    does not train here)."""
    if loss is None or not math.isfinite(loss):
        errors.append(f"{where}: the loss is {loss!r}, not finite")
        return False
    return True


def point_seconds(step_s: float, setup_s: float = 0.0) -> float:
    """About how long a figure of a step of ``step_s`` seconds takes: ``setup_s`` (building a
    batch, tracing or compiling the step), ``measure``'s warm-up and sizing calls, then MIN_REPS
    repetitions of at least TARGET_REP_S each."""
    step = max(0.0, step_s)
    return max(0.0, setup_s) + 2.0 * step + MIN_REPS * max(TARGET_REP_S, step)


def next_point_seconds(step_s: float, setup_s: float) -> float:
    """About how long the next point of a sweep takes, its batch doubled: the last point's setup
    ``setup_s``, and a step twice the last one's ``step_s``."""
    return point_seconds(2.0 * max(0.0, step_s), setup_s)


def setup_seconds(point_s: float, figure: dict[str, Any], batch: int) -> float:
    """What a point of ``point_s`` seconds spent besides its steps (building the batch, tracing,
    compiling): its wall time less ``figure``'s repetitions and the warm-up and sizing calls,
    each a step of the figure's median."""
    step_s = batch / figure["median"]
    timed = sum(figure["steps_per_rep"] * batch / s for s in figure["samples"])
    return max(0.0, point_s - timed - 2.0 * step_s)


def _gigabytes(nbytes: float) -> str:
    return f"{nbytes / 1e9:.1f} GB"


def memory_stop(
    next_batch: int, peak_bytes: int | None, available_bytes: int | None, rss_bytes: int | None
) -> str | None:
    """Why a CPU sweep must not try ``next_batch``, or None: its step would need about twice the
    last point's peak, more than CPU_MEMORY_FRACTION of the memory this process could reach
    (what is available plus what it already holds).  None without a peak or a figure of the
    memory available: on a GPU, running out of memory ends the sweep."""
    if peak_bytes is None or available_bytes is None:
        return None
    reachable = available_bytes + (rss_bytes or 0)
    allowed = CPU_MEMORY_FRACTION * reachable
    need = 2 * peak_bytes
    if need <= allowed:
        return None
    return (
        f"memory: batch {next_batch} would need about {_gigabytes(need)} of "
        f"{_gigabytes(reachable)} available, more than the {_gigabytes(allowed)} available to "
        f"a sweep ({CPU_MEMORY_FRACTION:.0%} of it)"
    )


def time_stop(next_batch: int, need_s: float, left_s: float) -> str | None:
    """Why a sweep must not try ``next_batch``, or None: the point would need about ``need_s``
    seconds, more than the ``left_s`` left of the sweep's share."""
    if need_s <= left_s:
        return None
    return (
        f"time: batch {next_batch} would need about {need_s:.1f} s, "
        f"{left_s:.1f} s left of the sweep's share"
    )


def sweep_stop(
    next_batch: int,
    *,
    peak_bytes: int | None,
    available_bytes: int | None,
    rss_bytes: int | None,
    seconds_left: float,
    next_s: float,
) -> str | None:
    """Why a batch sweep ends before ``next_batch``, or None to go on: past BATCH_MAX; then, on
    the CPU (``available_bytes`` given), ``memory_stop``; then ``time_stop`` for a point of
    ``next_s`` seconds."""
    if next_batch > BATCH_MAX:
        return LARGEST_REACHED
    return memory_stop(next_batch, peak_bytes, available_bytes, rss_bytes) or time_stop(
        next_batch, next_s, seconds_left
    )


def sweep_batches(start: int = BATCH_START, largest: int = BATCH_MAX) -> list[int]:
    """The batch sizes of a sweep: ``start`` doubling up to ``largest``."""
    batches = []
    batch = start
    while batch <= largest:
        batches.append(batch)
        batch *= 2
    return batches


def new_sweep(model: str, precision: str) -> dict[str, Any]:
    """One sweep of the batch part before its first point."""
    return {
        "model": model,
        "precision": precision,
        "points": [],
        "largest_fit": None,
        "largest_fit_peak_bytes": None,
        "stopped": None,
    }


def late_point(batch: int) -> str:
    """Why a sweep stops where its share ran out during a point."""
    return f"time: batch {batch} did not finish {MIN_REPS} repetitions in the sweep's share"


def run_sweep(
    sweep: dict[str, Any],
    clock: Clock,
    budget: Budget,
    measure_point: Callable[[int, Clock], dict[str, Any] | str],
    *,
    first_setup_s: float,
    on_cpu: bool,
) -> None:
    """Fill ``sweep`` (``new_sweep``): its model at each of ``sweep_batches`` in turn until
    ``sweep_stop`` or a point says stop.  ``measure_point(batch, clock)`` gives the point,
    ``{"batch", **figure, "peak_bytes"}``, or why the sweep stops at that batch (out of memory,
    ``late_point``); what time cut off goes into the budget's ``skipped``.  ``first_setup_s``:
    what the first point is expected to spend besides its steps; ``on_cpu``: the memory rule
    applies."""
    what = f"{sweep['model']} {sweep['precision']}"
    next_s = point_seconds(0.0, first_setup_s)
    peak = None
    for batch in sweep_batches():
        why = sweep_stop(
            batch,
            peak_bytes=peak,
            available_bytes=available_memory_bytes() if on_cpu else None,
            rss_bytes=rss_bytes() if on_cpu else None,
            seconds_left=clock.left(),
            next_s=next_s,
        )
        t0 = time.perf_counter()
        point = measure_point(batch, clock) if why is None else why
        if isinstance(point, str):
            sweep["stopped"] = point
            if point.startswith("time"):
                budget.skip("batch", f"{what} from batch {batch}", point)
            return
        sweep["points"].append(point)
        sweep["largest_fit"] = batch
        sweep["largest_fit_peak_bytes"] = peak = point["peak_bytes"]
        setup_s = setup_seconds(time.perf_counter() - t0, point, batch)
        next_s = next_point_seconds(batch / point["median"], setup_s)
    sweep["stopped"] = LARGEST_REACHED


def crop_offsets(draw: Callable[[int], int]) -> tuple[int, int]:
    """The top-left corner of the loader's random crop: ``draw(n)`` gives a uniform integer in
    [0, n)."""
    span = LOADER_IMAGE_SIDE - LOADER_CROP_SIDE + 1
    return draw(span), draw(span)


def loader_group(workers: int, prefetch: int = LOADER_PREFETCH) -> int:
    """Batches per timed call of a loader whose ``workers`` hold ``prefetch`` batches ready each:
    twice what they hold, plus one, so that a call's time (the one ``measure`` sizes its
    repetitions by, too) is mostly the workers making batches rather than handing over ones
    made while nobody was reading."""
    return 2 * prefetch * workers + 1


def reset_peak_rss() -> bool:
    """Reset this process's peak resident set (VmHWM) to its current size; False if the kernel
    does not allow it (then the peak is since the process started)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def peak_rss_bytes() -> int | None:
    """This process's peak resident set since the last reset, in bytes."""
    kib = _status_kib("VmHWM")
    return None if kib is None else kib * 1024


def rss_bytes() -> int | None:
    """This process's resident set now, in bytes."""
    kib = _status_kib("VmRSS")
    return None if kib is None else kib * 1024


def available_memory_bytes() -> int | None:
    """Memory this container may still use: the smaller of MemAvailable and its cgroup's room."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            with open(limit_path) as fh:
                limit = fh.read().strip()
            with open(usage_path) as fh:
                usage = int(fh.read().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 1 << 60:
            found.append(max(0, int(limit) - usage))
        break
    return min(found) if found else None


def cpu_facts() -> dict[str, Any]:
    """What the container sees of the CPU and memory: model, usable cores, memory."""
    model = None
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count()
    total = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    total = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return {"cpu_model": model, "cores": cores, "memory_bytes": total}


def machine_facts(devices: list[dict[str, Any]]) -> dict[str, Any]:
    """The document's ``machine``: ``cpu_facts``, and the GPUs among the document's ``devices``
    (kind "cuda" or "gpu") by name, memory and compute capability."""
    facts = cpu_facts()
    gpus = [
        {key: d.get(key) for key in ("name", "memory_bytes", "capability")}
        for d in devices
        if d.get("kind") in ("cuda", "gpu")
    ]
    if gpus:
        facts["gpus"] = gpus
    return facts


def bench_parts() -> dict[str, Any]:
    """The bench document's parts before anything ran; the payload fills them."""
    return {
        "versions": {
            "python": platform.python_version(),
            "framework": None,
            "cuda": None,
            "cudnn": None,
            "nccl": None,
        },
        "devices": [],
        "machine": {},
        "models": {
            # deep copies: a caller that edits the document must not change the shared models
            "conv": copy.deepcopy(CONV),
            "transformer": copy.deepcopy(TRANSFORMER),
            "learning_rate": LEARNING_RATE,
        },
        # One figure per (model, precision) at DEFAULT_BATCH, in the framework's default mode.
        "throughput": {"mode": None, "batch": DEFAULT_BATCH, "results": [], "seconds": None},
        # Per model: the default mode against the compiled one, compile time apart.
        "compile": {"eager_mode": None, "compiled_mode": None, "results": [], "seconds": None},
        # Per (model, precision): throughput and peak memory against batch size.
        "batch": {"memory": None, "sweeps": [], "seconds": None},
        # Loader alone per worker count, against the step's consumption.
        "loader": {"kind": None, "batch": None, "step": None, "points": [], "seconds": None},
        # Bandwidth per message size.
        "allreduce": {
            "backend": None,
            "world_size": None,
            "points": [],
            "correct": None,
            "seconds": None,
        },
        "skipped": [],
    }


def run_sections(
    run: Any, budget: Budget, state: Any, measures: tuple[Callable[..., Any], ...]
) -> None:
    """Run the measured sections in the order of SHARES: the function ``run_<name>`` of
    ``measures`` as ``run_<name>(state, doc, clock)``, the clock that section's share of the
    budget, under a hard deadline SECTION_GRACE_S past it; each part's ``seconds`` is its
    section's wall time, whatever happens in it."""
    import smoke_harness as harness  # beside this file in the image, as for the payloads

    by_name = {fn.__name__.removeprefix("run_"): fn for fn in measures}
    missing = [name for name, _ in SHARES if name not in by_name]
    if missing:
        raise ValueError(f"no run_{missing[0]} among the measures")  # a payload's own bug
    for name, _ in SHARES:
        share = budget.share(name)
        harness.log(f"{name}: {share:.1f} s of the budget")
        section = functools.partial(by_name[name], state)
        run.section(name, share + SECTION_GRACE_S, _timed(name, section, budget))


def _timed(
    name: str, fn: Callable[[dict[str, Any], Clock], Any], budget: Budget
) -> Callable[[dict[str, Any]], None]:
    def body(doc: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        try:
            fn(doc, Clock(budget.share(name)))
        finally:
            doc[name]["seconds"] = time.perf_counter() - t0

    return body


def main(payload: str, benchmark: Callable[[Any, Budget], Any]) -> None:
    """Run a bench payload: ``benchmark(run, budget)`` under the smoke harness, the document the
    bench parts, the budget ENVBUILD_BENCH_BUDGET_S (the hard deadline MARGIN_S past it); what
    the budget had no time for is the document's ``skipped``, whatever happens."""
    import smoke_harness as harness  # beside this file in the image, as for the payloads

    errors: list[str] = []
    budget = Budget.from_env(errors)

    def body(run: Any) -> None:
        run.errors.extend(errors)
        try:
            benchmark(run, budget)
        finally:
            run.doc["skipped"] = list(budget.skipped)

    harness.main(
        payload,
        body,
        parts=bench_parts(),
        checks=(),
        extra={"bench_version": BENCH_VERSION, "budget_s": budget.total_s},
        total_s=budget.total_s + MARGIN_S,
    )
