"""Run the smoke payload inside an image and check what it reports against the image's labels."""

from __future__ import annotations

import json
import time
from typing import Any

from envbuild.core import labels as label_keys
from envbuild.core.errors import BadInput, SmokeFailed
from envbuild.core.models import CPU, Combination, Gpu, Knowledge
from envbuild.core.resources import payload_harness_path, payload_path
from envbuild.core.results import SmokeCheck, SmokeResult
from envbuild.engine.interface import Engine, RunResult
from envbuild.payload import smoke_harness as harness
from envbuild.payload.cuda_static import Targets
from envbuild.plan.gpus import arch_build

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


def static_files() -> tuple[str, dict[str, bytes]]:
    """The static CUDA payload (cuda_static.py) and the harness it reports through."""
    script = payload_harness_path().parent / "cuda_static.py"
    harness = payload_harness_path()
    if not script.is_file() or not harness.is_file():
        msg = f"envbuild's static CUDA payload {script} is missing; reinstall envbuild"
        raise SmokeFailed(msg)
    target = f"{PAYLOAD_DIR}/{script.name}"
    return target, {
        target: script.read_bytes(),
        f"{PAYLOAD_DIR}/{harness.name}": harness.read_bytes(),
    }


def _library_names(part: dict[str, Any], key: str) -> list[str]:
    found = (part.get("libraries") or {}).get(key) or []
    return sorted({str(item.get("version")) for item in found if isinstance(item, dict)})


def _matches(read: str, label: str) -> bool:
    """A version read from a library against a label, to the precision of the shorter."""
    parts = min(len(read.split(".")), len(label.split(".")))
    return read.split(".")[:parts] == label.split(".")[:parts]


def check_static(
    static: dict[str, Any], labels: dict[str, str], knowledge: Knowledge
) -> list[SmokeCheck]:
    """Host-side checks of the static CUDA report: every needed library in the image, the
    versions the libraries report against the labels, the compiled architectures against the
    knowledge base's list for this build."""
    checks: list[SmokeCheck] = []
    errors = static.get("errors") or []
    closure = static.get("closure") or {}
    missing = closure.get("missing") or []
    elsewhere = closure.get("missing_elsewhere") or []
    optional = "; ".join(f"{m.get('library')} needs {m.get('needs')}" for m in elsewhere[:3])
    if errors:
        checks.append(
            SmokeCheck(
                name="cuda_static",
                passed=False,
                detail="the static CUDA payload failed: " + "; ".join(map(str, errors))[:500],
            )
        )
    shown_missing = "; ".join(
        f"{m.get('library')} needs {m.get('needs')}, not in the image" for m in missing[:5]
    )
    checks.append(
        SmokeCheck(
            name="cuda_libraries",
            passed=bool(closure.get("ok")) and not missing,
            detail=(
                f"{closure.get('libraries')} shared objects: every library the framework's and "
                "NVIDIA's need is in the image (the driver's own aside)"
                + (f"; not locked, for optional extensions: {optional}" if elsewhere else "")
                if not missing
                else shown_missing + (f"; and {len(missing) - 5} more" if len(missing) > 5 else "")
            ),
        )
    )
    versions = static.get("versions") or {}
    for name, key, label in (
        ("cudnn_library", "cudnn", label_keys.CUDNN),
        ("nccl_library", "nccl", label_keys.NCCL),
        ("cuda_runtime_library", "cuda_runtime", label_keys.CUDA),
    ):
        expected = labels.get(label) or ""
        read = _library_names(versions, key)
        if not expected and not read:
            continue
        what = {"cudnn": "cuDNN", "nccl": "NCCL", "cuda_runtime": "the CUDA runtime"}[key]
        if not read:
            detail, passed = f"no {what} library in the image (labels say {expected})", False
        elif not expected:
            detail, passed = f"{what} {', '.join(read)} read from the library (no label)", True
        else:
            passed = all(_matches(version, expected) for version in read)
            detail = f"{what} {', '.join(read)} read from the library (labels say {expected})"
        checks.append(SmokeCheck(name=name, passed=passed, detail=detail))
    checks.append(_check_archs(static.get("archs") or {}, labels, knowledge))
    return checks


def _check_archs(archs: dict[str, Any], labels: dict[str, str], knowledge: Knowledge) -> SmokeCheck:
    library = str(archs.get("library") or "")
    if not library:
        return SmokeCheck(
            name="gpu_archs", passed=False, detail="no library of the framework holds GPU code"
        )
    name = library.rsplit("/", 1)[-1]
    sass = {int(a) for a in archs.get("sass") or []}
    ptx = {int(a) for a in archs.get("ptx") or []}
    has = f"{name} has {archs.get('describe')}"
    combo = Combination(
        framework=labels.get(label_keys.FRAMEWORK, ""),
        framework_version=labels.get(label_keys.FRAMEWORK_VERSION, ""),
        cuda=labels.get(label_keys.CUDA, ""),
        python=labels.get(label_keys.PYTHON, ""),
        os=labels.get(label_keys.OS, ""),
    )
    row = arch_build(knowledge, combo)
    if row is None or (not row.sm and row.min_cc is None):
        return SmokeCheck(name="gpu_archs", passed=bool(sass or ptx), detail=f"{has}; the knowledge base has no list for this build")  # fmt: skip
    if not row.sm:  # only a floor is known: the oldest GPU it names must have a kernel
        floor = int(str(row.min_cc).replace(".", ""))
        runs = Targets(frozenset(sass), frozenset(ptx)).runs_on(floor)
        older = [a for a in sass | ptx if a < floor]
        return SmokeCheck(
            name="gpu_archs",
            passed=runs and not older,
            detail=f"{has}; the knowledge base says compute capability >= {row.min_cc}",
        )
    listed = {int(cc.replace(".", "")) for cc in row.sm}
    lacking = sorted(listed - sass)
    ptx_differs = bool(ptx) != row.ptx
    said = ", ".join(f"sm_{a}" for a in sorted(listed)) + (" + PTX" if row.ptx else ", no PTX")
    extra = sorted(sass - listed)
    detail = f"{has}; the knowledge base says {said}"
    if lacking:
        detail += f"; missing {', '.join(f'sm_{a}' for a in lacking)}"
    if ptx_differs:
        detail += "; PTX " + ("missing" if row.ptx else "present, the knowledge base says none")
    if extra and not lacking and not ptx_differs:
        detail += f" (some kernels also for {', '.join(f'sm_{a}' for a in extra)})"
    return SmokeCheck(name="gpu_archs", passed=not lacking and not ptx_differs, detail=detail)


def docker_run_flags(labels: dict[str, str], *, gpus: bool) -> str:
    """The `docker run` options under which the smoke test passed, for users to run it alike."""
    flags = ["--gpus all"] if gpus else []
    shm_size = labels.get(label_keys.RUN_SHM_SIZE)
    if shm_size:
        flags.append(f"--shm-size={shm_size}")
    return " ".join(flags)


# The payload's own verdicts on what training really does (beyond the train and all-reduce
# verdicts the host judges itself), and the report part each reads.
SECTION_CHECKS = {
    name: part
    for name, part, _ in harness.TRAINING_CHECKS
    if (name, part, _) not in harness.STANDARD_CHECKS
}


def _number(value: Any, form: str = ".3g") -> str:
    return format(value, form) if isinstance(value, int | float) else "?"


def _section_detail(name: str, part: dict[str, Any]) -> str:
    """One line of what a training section did, from its part of the report."""
    if part.get("skipped"):
        return f"skipped: {part['skipped']}"
    loss = f"loss {_number(part.get('loss_first'))} -> {_number(part.get('loss_last'))}"
    if name == "compile":
        backend = part.get("compiler") or part.get("backend") or "compiled"
        return (
            f"{backend} step, compiled in {_number(part.get('compile_seconds'), '.1f')} s: {loss}"
        )
    if name == "loader":
        workers = f" from {part['workers']} workers" if part.get("workers") else ""
        return f"{part.get('batches')} batches{workers} at {_number(part.get('batches_per_s'), '.0f')}/s: {loss}"
    if name == "checkpoint":
        return (
            f"resumed at loss {_number(part.get('loss_after_resume'), '.5g')} "
            f"(uninterrupted {_number(part.get('loss_uninterrupted'), '.5g')})"
        )
    if name == "numpy":
        return f"numpy {part.get('version')} round trip"
    if name == "packages":
        return (
            f"{part.get('imported')} modules of {part.get('distributions')} locked "
            "distributions import"
        )
    return "passed"


def _section_checks(payload: dict[str, Any], errors: list[Any]) -> list[SmokeCheck]:
    found = payload.get("checks")
    verdicts: dict[str, Any] = found if isinstance(found, dict) else {}
    checks = []
    for name, part_name in SECTION_CHECKS.items():
        if name not in verdicts:
            continue  # an older payload's report, or a framework without the section
        passed = bool(verdicts[name])
        value = payload.get(part_name)
        part: dict[str, Any] = value if isinstance(value, dict) else {}
        said = [str(e) for e in errors if str(e).startswith(f"{part_name}: ")]
        detail = (
            said[0][len(part_name) + 2 :]
            if said and not passed
            else _section_detail(part_name, part)
        )
        checks.append(SmokeCheck(name=name, passed=passed, detail=detail[:500]))
    return checks


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
    checks += _section_checks(payload, errors)
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
    # The run options the image declares (its labels), as a user's `docker run` would pass them.
    shm_size = image.labels.get(label_keys.RUN_SHM_SIZE) or None
    result = engine.run(
        ref,
        command,
        timeout=timeout + 30,
        files=files,
        gpus=use_gpus,
        shm_size=shm_size,
    )
    payload = _parse(result.stdout)
    if payload is None:
        checks = [_no_report("payload", "the payload", result)]
        payload = {}
    else:
        checks = check_report(payload, image.labels, gpus=use_gpus)
    payload["run_with"] = docker_run_flags(image.labels, gpus=use_gpus)
    cuda = image.labels.get(label_keys.CUDA)
    if cuda and cuda != CPU:
        # CUDA proven without a GPU: its own container, no GPU asked for.
        static, static_checks = _static_smoke(engine, ref, image.labels, framework, timeout)
        payload["cuda_static"] = static
        checks = [*checks, *static_checks]
    return SmokeResult(
        image=ref,
        image_id=image.id,
        payload=payload,
        checks=tuple(checks),
        exit_code=result.exit_code,
        seconds=time.monotonic() - start,
        stderr_tail=result.stderr.strip()[-2000:],
    )


def _static_smoke(
    engine: Engine, ref: str, labels: dict[str, str], framework: str, timeout: float
) -> tuple[dict[str, Any], list[SmokeCheck]]:
    """Run cuda_static.py in a container of `ref` without a GPU; its report and checks."""
    from envbuild.knowledge.load import load_knowledge

    target, files = static_files()
    command = ["timeout", "-k", "10", str(int(timeout)), "python3", target, framework]
    result = engine.run(ref, command, timeout=timeout + 30, files=files, gpus=False)
    static = _parse(result.stdout)
    if static is None:
        return {}, [_no_report("cuda_static", "the static CUDA payload", result)]
    return static, check_static(static, labels, load_knowledge())


def _no_report(name: str, what: str, result: RunResult) -> SmokeCheck:
    """The failed check of a payload that ended without its JSON report."""
    timed_out = result.timed_out or result.exit_code == 124
    why = "timed out" if timed_out else f"exited {result.exit_code}"
    detail = f"{what} {why} without a JSON report; stderr: {result.stderr.strip()[-400:]}"
    return SmokeCheck(name=name, passed=False, detail=detail)


def fleet_refusal(
    payload: dict[str, Any], labels: dict[str, str], fleet: tuple[Gpu, ...]
) -> str | None:
    """Why an image must not go to a fleet of these GPUs (`--gpu`), from the architectures its
    smoke report read out of the framework's library; None when every GPU has a kernel to run
    (SASS of its generation at or below its compute capability, or PTX at or below it)."""
    cuda = labels.get(label_keys.CUDA)
    if not fleet or not cuda or cuda == CPU:
        return None
    archs = (payload.get("cuda_static") or {}).get("archs") or {}
    library = str(archs.get("library") or "").rsplit("/", 1)[-1]
    if not library:
        return (
            "its smoke report holds no compiled architectures; smoke-test it again (envbuild smoke)"
        )
    sass = {int(a) for a in archs.get("sass") or []}
    ptx = {int(a) for a in archs.get("ptx") or []}
    targets = Targets(frozenset(sass), frozenset(ptx))
    lacking = []
    for gpu in fleet:
        cc = int(gpu.cc.replace(".", ""))
        if not targets.runs_on(cc):
            name = f"sm_{cc}" if gpu.name == f"sm_{cc}" else f"sm_{cc} ({gpu.name})"
            lacking.append(name)
    if not lacking:
        return None
    return f"no kernels for {', '.join(lacking)} in {library} (has {archs.get('describe')})"
