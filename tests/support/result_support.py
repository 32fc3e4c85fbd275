"""Run results for tests of what reports and progress make of them: four entries of the default
matrix, the images they were built as, their smoke results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envbuild.core.models import BuiltImage, Entry, Knowledge, Selection
from envbuild.core.results import SmokeCheck, SmokeResult
from envbuild.plan.matrix import default_matrix_path, load_matrix, make_plan


def four_entries(knowledge: Knowledge) -> tuple[Entry, ...]:
    """The default matrix's first four entries."""
    plan = make_plan(knowledge, load_matrix(default_matrix_path(), knowledge), Selection())
    assert len(plan.entries) >= 4
    return plan.entries[:4]


def image(entry: Entry, seed: str, *, built: bool) -> BuiltImage:
    """The image `entry` was built as (`built`) or found as; its id made of `seed`."""
    return BuiltImage(
        entry=entry, id="sha256:" + seed * 64, tags=(entry.image,), built=built,
        log_path=Path(f"/logs/{entry.id}.log") if built else None, seconds=12.0,
    )  # fmt: skip


def smoke(
    entry: Entry, image_id: str, *, passed: bool, payload: dict[str, Any] | None = None
) -> SmokeResult:
    """A smoke result whose all-reduce check passed or not."""
    checks = (
        SmokeCheck(name="payload", passed=True, detail="the payload reported no error"),
        SmokeCheck(name="allreduce", passed=passed, detail="gloo all-reduce over 2 ranks: got 2.0"),
    )
    return SmokeResult(
        image=entry.image, image_id=image_id, payload=payload or {}, checks=checks, exit_code=0,
        seconds=3.0, stderr_tail="",
    )  # fmt: skip
