"""Run the smoke payload inside an image and check what it reports against the image's labels."""

from __future__ import annotations

import json
import time
from typing import Any

from envbuild import labels as label_keys
from envbuild.engine import Engine
from envbuild.errors import BadInput, SmokeFailed
from envbuild.models import CPU
from envbuild.resources import payload_harness_path, payload_path
from envbuild.results import SmokeCheck, SmokeResult

PAYLOAD_DIR = "/tmp/envbuild-smoke"
GPU_CHOICES = ("auto", "all", "none")


def _version_base(text: str | None) -> str | None:
    return None if text is None else text.split("+", 1)[0]


def _major_minor(text: str | None) -> str | None:
    return None if text is None else ".".join(text.split(".")[:2])


def _parse(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    try:
        value = json.loads(stdout)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def payload_files(framework: str, *, image: str) -> tuple[str, dict[str, bytes]]:
    """The script to run and the files to copy in: the framework's payload beside the harness it imports."""
    script = payload_path(framework)
    if not script.is_file():
        msg = f"image {image}: no smoke payload for framework {framework!r}"
        raise BadInput(msg)
    harness = payload_harness_path()
    if not harness.is_file():
        msg = f"envbuild's smoke harness {harness} is missing; reinstall envbuild"
        raise SmokeFailed(msg)
    target = f"{PAYLOAD_DIR}/{script.name}"
    # One folder: the payload's `import smoke_harness` finds it there (sys.path[0]).
    files = {
        target: script.read_bytes(),
        f"{PAYLOAD_DIR}/{harness.name}": harness.read_bytes(),
    }
    return target, files


def check_report(
    payload: dict[str, Any], labels: dict[str, str], *, gpus: bool
) -> list[SmokeCheck]:
    """Host-side checks: the payload's own verdicts, and its versions against the image labels."""
    checks: list[SmokeCheck] = []
    versions = payload.get("versions") or {}
    train = payload.get("train") or {}
    allreduce = payload.get("allreduce") or {}
    errors = payload.get("errors") or []
    checks.append(
        SmokeCheck(
            name="payload",
            passed=bool(payload.get("ok")) and not errors,
            detail="the payload reported no error"
            if not errors
            else "; ".join(map(str, errors))[:500],
        )
    )
    first, last = train.get("loss_first"), train.get("loss_last")
    fell = isinstance(first, int | float) and isinstance(last, int | float) and last < first
    checks.append(
        SmokeCheck(
            name="loss_fell",
            passed=bool(train.get("loss_fell")) and fell,
            detail=f"loss {first} -> {last} over {train.get('steps')} steps on {train.get('device')}",
        )
    )
    world = int(allreduce.get("world_size") or 0)
    min_world = 1 if gpus else 2
    checks.append(
        SmokeCheck(
            name="allreduce",
            passed=bool(allreduce.get("correct")) and world >= min_world,
            detail=(
                f"{allreduce.get('backend')} all-reduce over {world} ranks: expected "
                f"{allreduce.get('expected')}, got {allreduce.get('got')}; "
                f"busbw {allreduce.get('busbw_gbps')} GB/s"
            ),
        )
    )
    framework = labels.get(label_keys.FRAMEWORK, "framework")
    comparisons = (
        ("python_version", label_keys.PYTHON, "python", _major_minor, "Python"),
        ("framework_version", label_keys.FRAMEWORK_VERSION, "framework", _version_base, framework),
    )
    for name, label, key, normalize, what in comparisons:
        expected = labels.get(label)
        if expected:
            got = versions.get(key)
            checks.append(
                SmokeCheck(
                    name=name,
                    passed=normalize(got) == expected,
                    detail=f"{what} {got} (labels say {expected})",
                )
            )
    expect_cuda = labels.get(label_keys.CUDA)
    if expect_cuda:
        got_cuda = versions.get("cuda")
        on_gpu = any(d.get("kind") in ("cuda", "gpu") for d in payload.get("devices") or [])
        detail = f"CUDA runtime {got_cuda or 'none (CPU build)'} (labels say {expect_cuda})"
        if expect_cuda == CPU:
            passed = got_cuda is None
        elif got_cuda is None and payload.get("cuda_needs_gpu") and not on_gpu:
            passed = True
            detail = f"not checked: {framework} reports its CUDA version only on a GPU (labels say {expect_cuda})"
        elif got_cuda is None:
            passed = False
        else:  # a label of "12" (newest 12.x wheels) is met by any 12.x
            parts = len(expect_cuda.split("."))
            passed = ".".join(str(got_cuda).split(".")[:parts]) == expect_cuda
        checks.append(SmokeCheck(name="cuda_version", passed=passed, detail=detail))
    for name, label in (("cudnn", label_keys.CUDNN), ("nccl", label_keys.NCCL)):
        expected = labels.get(label)
        got = versions.get(name)
        if expected and got:  # only reported where a GPU made the library load
            want = ".".join(expected.split(".")[: len(str(got).split("."))])
            checks.append(
                SmokeCheck(
                    name=f"{name}_version",
                    passed=str(got) == want,
                    detail=f"{name} {got} (labels say {expected})",
                )
            )
    return checks


def smoke_image(
    engine: Engine, ref: str, *, gpus: str = "auto", timeout: float = 600
) -> SmokeResult:
    """Run the payload in a fresh container of `ref` under a timeout and check its report."""
    if gpus not in GPU_CHOICES:
        msg = f"--gpus {gpus}: choose one of {', '.join(GPU_CHOICES)}"
        raise BadInput(msg)
    image = engine.image(ref)
    if image is None:
        msg = f"image {ref} is not in the local engine; build it (`envbuild build`) or pull it"
        raise BadInput(msg)
    framework = image.labels.get(label_keys.FRAMEWORK, "torch")
    target, files = payload_files(framework, image=ref)
    use_gpus = gpus == "all" or (gpus == "auto" and engine.has_nvidia_runtime())
    start = time.monotonic()
    # GNU timeout inside the container stops a hung payload even if the host side is interrupted.
    command = ["timeout", "-k", "10", str(int(timeout)), "python3", target]
    result = engine.run(
        ref,
        command,
        timeout=timeout + 30,
        files=files,
        gpus=use_gpus,
    )
    payload = _parse(result.stdout)
    if payload is None:
        why = (
            "timed out"
            if result.timed_out or result.exit_code == 124
            else f"exited {result.exit_code}"
        )
        checks = [
            SmokeCheck(
                name="payload",
                passed=False,
                detail=f"the payload {why} without a JSON report; stderr: {result.stderr.strip()[-400:]}",
            )
        ]
        payload = {}
    else:
        checks = check_report(payload, image.labels, gpus=use_gpus)
    return SmokeResult(
        image=ref,
        image_id=image.id,
        payload=payload,
        checks=tuple(checks),
        exit_code=result.exit_code,
        seconds=time.monotonic() - start,
        stderr_tail=result.stderr.strip()[-2000:],
    )
