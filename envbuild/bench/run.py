"""One image's bench: the bench payload (envbuild/payload/<framework>_bench.py on
bench_harness.py) run inside it by the payload runner, under the image's declared run options
and a time budget; and which images may be benched (those vetted here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envbuild.core import labels as label_keys
from envbuild.core.store import ResultStore
from envbuild.engine.interface import Engine
from envbuild.payload import bench_harness
from envbuild.smoke.runner import (
    docker_run_flags,
    image_framework,
    local_image,
    run_payload,
    wants_gpus,
)

DEFAULT_BUDGET_S = bench_harness.DEFAULT_BUDGET_S
MIN_BUDGET_S = bench_harness.MIN_BUDGET_S
MAX_BUDGET_S = 3600.0
# The container's own GNU timeout: the budget, the payload's margin, and start-up.
_START_S = 60.0


@dataclass(frozen=True, kw_only=True)
class BenchRun:
    """One image's bench: what the payload measured, and how the run went."""

    image: str
    image_id: str
    framework: str
    framework_version: str | None
    cuda: str | None
    python: str | None
    gpus: bool
    seconds: float
    exit_code: int
    errors: tuple[str, ...]
    skipped: tuple[str, ...]
    bench: dict[str, Any] = field(repr=False)
    stderr_tail: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        """Every section ran without an error."""
        return not self.errors

    def as_dict(self) -> dict[str, Any]:
        """The image's entry in the bench document."""
        return {
            "image": self.image,
            "image_id": self.image_id,
            "framework": self.framework,
            "framework_version": self.framework_version,
            "cuda": self.cuda,
            "python": self.python,
            "gpus": self.gpus,
            "seconds": round(self.seconds, 2),
            "ok": self.ok,
            "exit_code": self.exit_code,
            "errors": list(self.errors),
            "skipped": list(self.skipped),
            "bench": self.bench,
        }


def bench_image(
    engine: Engine, ref: str, *, gpus: str = "auto", budget_s: float = DEFAULT_BUDGET_S
) -> BenchRun:
    """Run the bench payload in a fresh container of `ref` (its declared run options, GPUs as
    asked) within `budget_s`; the payload's document, or the reason there is none."""
    use_gpus = wants_gpus(engine, gpus)
    image = local_image(engine, ref)
    framework = image_framework(image, ref, kind="bench")
    run = run_payload(
        engine,
        image,
        ref,
        f"{framework}_bench.py",
        gpus=use_gpus,
        timeout_s=budget_s + bench_harness.MARGIN_S + _START_S,
        environment={"ENVBUILD_BENCH_BUDGET_S": f"{budget_s:g}"},
    )
    report = run.report
    errors: list[str] = []
    if report is None:
        errors.append(run.missing("the bench payload"))
        report = {}
    elif report.get("bench_version") != bench_harness.BENCH_VERSION:
        errors.append(
            f"the bench payload reported version {report.get('bench_version')!r}, this envbuild "
            f"reads {bench_harness.BENCH_VERSION}; reinstall envbuild"
        )
        report = {}
    else:
        errors.extend(str(e) for e in report.get("errors") or [])
    skipped = tuple(str(s) for s in report.get("skipped") or [])
    report["run_with"] = docker_run_flags(image.labels, gpus=use_gpus)
    return BenchRun(
        image=ref,
        image_id=image.id,
        framework=framework,
        framework_version=image.labels.get(label_keys.FRAMEWORK_VERSION),
        cuda=image.labels.get(label_keys.CUDA),
        python=image.labels.get(label_keys.PYTHON),
        gpus=use_gpus,
        seconds=run.seconds,
        exit_code=-1 if run.result.exit_code is None else run.result.exit_code,
        errors=tuple(errors),
        skipped=skipped,
        bench=report,
        stderr_tail=run.result.stderr.strip()[-2000:],
    )


def vetted_images(
    engine: Engine, store: ResultStore, refs: list[str]
) -> tuple[list[str], list[str]]:
    """Of these local images, those whose last smoke test passed for their exact image id; and
    a line for each one left out, saying why and what to do."""
    vetted, notes = [], []
    for ref in refs:
        image = engine.image(ref)
        record = None if image is None else store.latest_smoke(image.id)
        if image is None:
            notes.append(f"skipping {ref}: not built here")
        elif record is None or not record.passed:
            why = "never smoke-tested" if record is None else "its last smoke test failed"
            notes.append(f"skipping {ref}: not vetted ({why}; `envbuild smoke {ref}` first)")
        else:
            vetted.append(ref)
    return vetted, notes
