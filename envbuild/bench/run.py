"""`envbuild bench`: run the bench payload in each image on this host, and the bench document.

The payload (envbuild/payload/<framework>_bench.py on bench_harness.py) measures inside the
image; this module runs it under the image's declared run options and a time budget, gathers
the host's facts, and assembles the document `--json` writes, the HTML report draws and the
advice cites (JSON pointers into it). Documents read back (`--compare FILE`) are treated as
hostile: bounded in bytes and checked before anything reads a figure.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from envbuild.core import labels as label_keys
from envbuild.core.errors import BadInput
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

SCHEMA = "envbuild-bench"
SCHEMA_VERSION = 1
DEFAULT_BUDGET_S = bench_harness.DEFAULT_BUDGET_S
MIN_BUDGET_S = bench_harness.MIN_BUDGET_S
MAX_BUDGET_S = 3600.0
# A document read back (--compare FILE) larger than this is refused, not parsed.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
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


# --------------------------------------------------------------------------
# the host


def _read(path: str) -> str:
    try:
        with Path(path).open(encoding="utf-8", errors="replace") as handle:
            return handle.read(1 << 20)
    except OSError:
        return ""


def host_facts(engine: Engine | None = None) -> dict[str, Any]:
    """The machine the figures belong to: CPU model and cores, memory, GPUs and driver, engine."""
    from envbuild.host.doctor import probe_gpus

    model = None
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    memory = None
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            memory = int(line.split()[1]) * 1024
    probe = probe_gpus()
    gpus = [
        {
            "index": gpu.index,
            "name": gpu.name,
            "memory_bytes": gpu.memory_bytes,
            "driver": probe.driver,
            "capability": gpu.cc,
        }
        for gpu in probe.gpus
    ]
    engine_version = None
    if engine is not None:
        try:
            engine_version = f"Docker {engine.describe().version}"
        except Exception:  # the facts are informative; an engine that will not say is no failure
            engine_version = None
    return {
        "cpu_model": model or platform.processor() or None,
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "memory_bytes": memory,
        "gpus": gpus,
        "driver": probe.driver,
        "engine": engine_version,
    }


def host_key(host: dict[str, Any]) -> str:
    """What makes two hosts' figures comparable: CPU model and cores, memory to the GB, GPUs."""
    memory = host.get("memory_bytes")
    parts = [
        str(host.get("cpu_model")),
        str(host.get("cores")),
        str(round(memory / 1e9) if isinstance(memory, int) else None),
        *(f"{g.get('name')}/{g.get('memory_bytes')}" for g in host.get("gpus") or []),
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


# --------------------------------------------------------------------------
# the document


def now() -> str:
    """The document's creation time, UTC, to the second."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def bench_document(
    runs: list[BenchRun], host: dict[str, Any], *, budget_s: float, created: str | None = None
) -> dict[str, Any]:
    """The bench document without its advice and comparison (see advise / compare)."""
    return {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "created": created or now(),
        "host": host,
        "budget_s": budget_s,
        "images": [run.as_dict() for run in runs],
        "advice": [],
        "comparison": None,
    }


def load_document(path: Path) -> dict[str, Any]:
    """A bench document written before (`--compare FILE`), checked; BadInput naming the file."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        msg = f"--compare {path}: cannot read it ({exc.strerror}); give a file `envbuild bench --json` wrote, or `last`"
        raise BadInput(msg) from None
    if size > MAX_DOCUMENT_BYTES:
        msg = f"--compare {path}: {size} bytes is more than a bench document can be ({MAX_DOCUMENT_BYTES}); give a file `envbuild bench --json` wrote"
        raise BadInput(msg)
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        msg = f"--compare {path}: not JSON ({type(exc).__name__}); give a file `envbuild bench --json` wrote"
        raise BadInput(msg) from None
    return checked_document(doc, source=f"--compare {path}")


def checked_document(doc: Any, *, source: str) -> dict[str, Any]:
    """``doc`` when it is a bench document of this version with images; BadInput otherwise."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        msg = f'{source}: not an envbuild bench document (no "schema": "{SCHEMA}"); give a file `envbuild bench --json` wrote'
        raise BadInput(msg)
    if doc.get("version") != SCHEMA_VERSION:
        msg = f"{source}: bench document version {doc.get('version')!r}; this envbuild reads version {SCHEMA_VERSION}: run `envbuild bench` again to compare"
        raise BadInput(msg)
    images = doc.get("images")
    if not isinstance(images, list) or not all(isinstance(i, dict) for i in images):
        msg = f'{source}: its "images" is not a list of results; give a file `envbuild bench --json` wrote'
        raise BadInput(msg)
    return doc
