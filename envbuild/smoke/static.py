"""A CUDA image proven without a GPU: the static payload's report (libraries that resolve, the
versions they report, the architectures compiled into them) checked against the labels and the
knowledge base, and whether those architectures run on a fleet's GPUs."""

from __future__ import annotations

from typing import Any

from envbuild.core import labels as label_keys
from envbuild.core.models import CPU, Combination, Gpu, Knowledge
from envbuild.core.platforms import AMD64
from envbuild.core.results import SmokeCheck
from envbuild.payload.cuda_static import Targets
from envbuild.plan.gpus import arch_build


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
                + (
                    f"; optional extensions whose needs the image does not hold (loaded only when used): {optional}"
                    if elsewhere
                    else ""
                )
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
        # aarch64 builds have their own lists; an image from before the label is amd64.
        platform=labels.get(label_keys.PLATFORM) or AMD64,
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
