"""The smoke test of an image: its framework's smoke payload in a fresh container, and on a CUDA
image the static payload without a GPU, each report checked on the host."""

from __future__ import annotations

import time
from typing import Any

from envbuild.core import labels as label_keys
from envbuild.core.models import CPU, Knowledge
from envbuild.core.results import SmokeCheck, SmokeResult
from envbuild.engine.interface import Engine, ImageInfo
from envbuild.smoke.checks import check_report
from envbuild.smoke.runner import (
    docker_run_flags,
    image_framework,
    local_image,
    run_payload,
    wants_gpus,
)
from envbuild.smoke.static import check_static

# How much slower an emulated platform runs the payloads (measured here under qemu: `import
# torch` 12 s against 1.5 s natively, apt and venv 8-10 times): every deadline stretches by it.
EMULATION_SLOWDOWN = 10.0
SLOWDOWN_VARIABLE = "ENVBUILD_SLOWDOWN"  # the payload harness reads it (smoke_harness.slowdown)


def slowdown(engine: Engine, image: ImageInfo) -> float:
    """EMULATION_SLOWDOWN for an image of another platform than the engine's machine, else 1."""
    own = engine.describe().platform
    return EMULATION_SLOWDOWN if own and image.platform and image.platform != own else 1.0


def smoke_image(
    engine: Engine, ref: str, *, knowledge: Knowledge, gpus: str = "auto", timeout: float = 600
) -> SmokeResult:
    """Run the smoke payload in a fresh container of `ref` under a timeout and check its report;
    a CUDA image is also proven without a GPU, against the knowledge base's facts."""
    use_gpus = wants_gpus(engine, gpus)
    image = local_image(engine, ref)
    framework = image_framework(image, ref, kind="smoke")
    start = time.monotonic()
    factor = slowdown(engine, image)
    timeout *= factor
    environment = {SLOWDOWN_VARIABLE: f"{factor:g}"} if factor != 1 else None
    run = run_payload(
        engine, image, ref, f"{framework}_smoke.py", gpus=use_gpus, timeout_s=timeout,
        environment=environment,
    )  # fmt: skip
    if run.report is None:
        checks = [SmokeCheck(name="payload", passed=False, detail=run.missing("the payload"))]
        payload: dict[str, Any] = {}
    else:
        payload = run.report
        checks = check_report(payload, image.labels, gpus=use_gpus)
    payload["run_with"] = docker_run_flags(image.labels, gpus=use_gpus)
    payload["platform"] = image.platform
    payload["emulated"] = factor != 1
    payload["payload_digest"] = run.payload_digest
    cuda = image.labels.get(label_keys.CUDA)
    if cuda and cuda != CPU:
        static, static_checks = _static_smoke(
            engine, image, ref, framework, knowledge, timeout, environment
        )
        payload["cuda_static"] = static
        checks = [*checks, *static_checks]
    return SmokeResult(
        image=ref,
        image_id=image.id,
        payload=payload,
        checks=tuple(checks),
        exit_code=run.result.exit_code,
        seconds=time.monotonic() - start,
        stderr_tail=run.result.stderr.strip()[-2000:],
    )


def _static_smoke(
    engine: Engine,
    image: ImageInfo,
    ref: str,
    framework: str,
    knowledge: Knowledge,
    timeout: float,
    environment: dict[str, str] | None,
) -> tuple[dict[str, Any], list[SmokeCheck]]:
    """Run cuda_static.py in a container of `ref` without a GPU; its report and checks."""
    run = run_payload(
        engine, image, ref, "cuda_static.py", args=(framework,), gpus=False, timeout_s=timeout,
        environment=environment,
    )  # fmt: skip
    if run.report is None:
        detail = run.missing("the static CUDA payload")
        return {}, [SmokeCheck(name="cuda_static", passed=False, detail=detail)]
    return run.report, check_static(run.report, image.labels, knowledge)
