"""What the smoke payloads' sections measure alike, and how each is judged; runs INSIDE the container.

Every framework's smoke payload trains and reduces the same way, so that one verdict holds for
all of them:
  * train -- ENVBUILD_SMOKE_STEPS optimizer steps; the loss must fall by MIN_RELATIVE_DROP;
  * allreduce -- SUM of (rank+1) over the ranks, sized by GPU_ALLREDUCE or CPU_ALLREDUCE, its
    bandwidth as nccl-tests defines it (algbw, busbw);
  * the training sections -- a compiled step, an input pipeline, a checkpoint that resumes
    where it stopped, numpy interop, the lock's packages: their parts before anything ran and
    their verdicts (their checks are smoke_harness.TRAINING_CHECKS);
  * the user -- who the payload ran as and what it may write (image_user.py), judged on the host.

Standard library and the sibling payload modules only, Python 3.8 and later.
"""

from __future__ import annotations

import math
import os
from typing import Any

import image_user
import package_imports
import payload_versions
import smoke_harness as harness

# The last loss must be at least this fraction below the first one, so that
# a no-op optimizer (constant loss, maybe with tiny numerical jitter) fails.
MIN_RELATIVE_DROP = 0.01

# All-reduce sizes: (bytes per rank, warm-up iterations, timed iterations).
GPU_ALLREDUCE = (16 * 1024 * 1024, 5, 20)
CPU_ALLREDUCE = (4 * 1024 * 1024, 2, 10)
# On a GPU-less host the all-reduce runs between this many CPU ranks/devices.
CPU_WORLD_SIZE = 2


def steps_from_env(errors: list[str]) -> int:
    """Optimizer steps from ENVBUILD_SMOKE_STEPS (default 20, at least 2); a bad value is an error."""
    raw = os.environ.get("ENVBUILD_SMOKE_STEPS", "").strip()
    if not raw:
        return harness.DEFAULT_STEPS
    try:
        steps = int(raw)
        if steps < 2:
            raise ValueError("must be >= 2")
        return steps
    except ValueError as exc:
        errors.append(
            f"train: ValueError: bad ENVBUILD_SMOKE_STEPS={raw!r} ({exc}); using {harness.DEFAULT_STEPS}"
        )
        return harness.DEFAULT_STEPS


def judge_losses(train: dict[str, Any], losses: list[float]) -> None:
    """Record the first and last loss in ``train``; raise unless the loss fell far enough."""
    train["losses"] = losses
    if len(losses) < 2:
        raise RuntimeError(f"expected {train.get('steps')} per-step losses, got {len(losses)}")
    first, last = losses[0], losses[-1]
    train["loss_first"] = first
    train["loss_last"] = last
    fell = (
        math.isfinite(first)
        and math.isfinite(last)
        and last < first
        and (first - last) > MIN_RELATIVE_DROP * abs(first)
    )
    train["loss_fell"] = bool(fell)
    if not fell:
        raise RuntimeError(
            f"loss did not fall over {len(losses)} steps: first={first!r} last={last!r}"
        )


def plan_allreduce(ar: dict[str, Any], backend: str, *, gpu: bool) -> tuple[int, int, int]:
    """Record the backend and sizes in ``ar``; return (float32 elements per rank, warm-up, iterations)."""
    nbytes, warmup, iters = GPU_ALLREDUCE if gpu else CPU_ALLREDUCE
    elements = nbytes // 4
    ar.update(backend=backend, elements=elements, bytes=elements * 4, iterations=iters)
    return elements, warmup, iters


def allreduce_world(ar: dict[str, Any], world: int) -> float:
    """Record the number of ranks; return the expected SUM of (rank+1) over them."""
    expected = world * (world + 1) / 2.0
    ar.update(world_size=world, expected=expected)
    return expected


def record_bandwidth(ar: dict[str, Any], seconds: float) -> None:
    """Seconds per all-reduce, and algbw/busbw in GB/s as nccl-tests defines them."""
    ar["seconds"] = seconds
    if seconds > 0:
        world = int(ar.get("world_size") or 0)
        algbw = ar["bytes"] / seconds / 1e9
        ar["algbw_gbps"] = algbw
        ar["busbw_gbps"] = algbw * 2.0 * (world - 1) / world if world > 1 else 0.0


def record_allreduce(ar: dict[str, Any], errors: list[str], *, correct: bool, got: Any) -> None:
    """Record the all-reduce verdict; a wrong sum is an error naming what came back."""
    ar["correct"] = bool(correct)
    ar["got"] = got
    if not correct:
        errors.append(
            f"allreduce: wrong result: expected {ar.get('expected')!r} everywhere, got {got!r}"
        )


def finish_allreduce(
    ar: dict[str, Any],
    errors: list[str],
    versions: dict[str, Any],
    *,
    backend: str,
    seconds: float,
    first: tuple[bool, Any],
    last: tuple[bool, Any],
) -> None:
    """Close an all-reduce section: bandwidth, NCCL's version from the loaded library when the
    framework did not say, and the verdict of the first and the repeated sums (the first wrong
    one is what is shown)."""
    record_bandwidth(ar, seconds)
    if backend == "nccl" and versions.get("nccl") is None:
        versions["nccl"] = payload_versions.loaded_nccl_version()
    (correct1, got1), (correct2, got2) = first, last
    record_allreduce(ar, errors, correct=correct1 and correct2, got=got2 if correct1 else got1)


def training_parts() -> dict[str, Any]:
    """The standard parts and the training sections' before anything ran; a payload adds the
    fields of its own (``parts["loader"]["workers"] = 2``)."""
    parts = harness.standard_parts()
    losses = {"losses": [], "loss_first": None, "loss_last": None, "loss_fell": False}
    parts["compile"] = {
        "device": None, "backend": None, **losses, "compile_seconds": None, "step_ms": None,
        "seconds": None,
    }  # fmt: skip
    parts["loader"] = {"batches": 0, "batch_bytes": None, "batches_per_s": None, **losses, "seconds": None}  # fmt: skip
    parts["checkpoint"] = {
        "bytes": None, "loss_before_save": None, "loss_after_resume": None,
        "loss_uninterrupted": None, "continued": False, "loss_fell": False, "seconds": None,
    }  # fmt: skip
    parts["numpy"] = {"skipped": None, "version": None, "ok": False, "seconds": None}
    parts["packages"] = package_imports.packages_part()
    parts["user"] = image_user.user_part()
    return parts


def judge_checkpoint(
    part: dict[str, Any],
    before: list[float],
    uninterrupted: list[float],
    resumed: list[float],
    *,
    tolerance: float = 1e-4,
) -> None:
    """Record a checkpoint round trip: ``before`` the save, the ``uninterrupted`` run on from
    it, the run ``resumed`` from the loaded state; raise unless the resumed run gives the
    uninterrupted one's loss (relative ``tolerance``) and the loss keeps falling."""
    part.update(
        loss_before_save=before[-1],
        loss_after_resume=resumed[0],
        loss_uninterrupted=uninterrupted[0],
        losses_before=before,
        losses_resumed=resumed,
    )
    allowed = tolerance * max(1.0, abs(uninterrupted[0]))
    part["continued"] = bool(
        abs(resumed[0] - uninterrupted[0]) <= allowed and resumed[0] <= before[-1] + allowed
    )
    if not part["continued"]:
        raise RuntimeError(
            f"the resumed loss {resumed[0]!r} does not continue from {before[-1]!r} "
            f"(the uninterrupted run gives {uninterrupted[0]!r}): the checkpoint lost state"
        )
    judge_losses(part, resumed)


def judge_round_trip(part: dict[str, Any], checks: dict[str, bool]) -> None:
    """Record the numpy interop checks; raise naming those that failed."""
    part.update(checks)
    part["ok"] = all(checks.values())
    if not part["ok"]:
        bad = ", ".join(name for name, good in checks.items() if not good)
        raise RuntimeError(f"numpy interop is broken: {bad}")
