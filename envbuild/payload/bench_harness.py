"""Shared measurement code of envbuild's bench payloads; runs INSIDE the container, stdlib only.

``envbuild bench`` copies this file into the container beside ``smoke_harness.py``
and one ``<framework>_bench.py``.  The payload reports through the smoke harness
(one JSON document on stdout, sections under deadlines); this file holds what
every framework measures alike, so that the figures compare fairly:

  * the two models, by their sizes (``CONV``, ``TRANSFORMER``): each framework
    builds exactly these, so "jax is 1.3x torch on the transformer block" compares
    the same arithmetic;
  * ``measure`` -- warm-up, then timed repetitions, each a median-able sample;
    ``stats`` -- median, min, max and the spread reported with every figure;
  * ``Budget`` -- the run's time (ENVBUILD_BENCH_BUDGET_S), shared out among
    the sections; what a section had no time for is recorded in ``skipped``,
    never silently left out;
  * memory: the peak resident memory of a step on the CPU (``/proc/self``);
  * the all-reduce message sizes and nccl-tests' bandwidth definitions.

Nothing here may import more than the standard library, and it must run on every
Python an image can bring (3.8 and later).
"""

from __future__ import annotations

import copy
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
# On the CPU, stop before a step's peak would pass this fraction of the memory available.
CPU_MEMORY_FRACTION = 0.5

# Loader: worker counts tried, and batches timed per count.
LOADER_WORKERS = (0, 1, 2, 4)
LOADER_BATCHES = 24

# All-reduce message sizes, 8 B to 256 MiB by factors of 4 (then the last), as nccl-tests' -b 8 -e 256M -f 4.
ALLREDUCE_SIZES = tuple(
    sorted({8 * 4**i for i in range(14) if 8 * 4**i <= 256 * 1024 * 1024} | {256 * 1024 * 1024})
)


# --------------------------------------------------------------------------
# figures


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


# --------------------------------------------------------------------------
# memory on the CPU


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


# --------------------------------------------------------------------------
# the document


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
