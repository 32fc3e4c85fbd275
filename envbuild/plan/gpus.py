"""The GPU rules: which compute capabilities a framework build ships kernels for, and GPU names.

Like compat, each rule returns a Fact with its source.
"""

from __future__ import annotations

import re

from envbuild.core.models import CPU, ArchBuild, Combination, Fact, Gpu, Knowledge
from envbuild.core.versions import cuda_tag, version_sort_key

_SM = re.compile(r"[Ss][Mm]_?([0-9]{1,2})([0-9])")
_CC = re.compile(r"([0-9]{1,2})\.([0-9])")
CC_MAJORS = range(1, 21)


def _source(knowledge: Knowledge, source_id: str) -> str:
    return knowledge.sources.get(source_id, source_id)


def _cc(text: str) -> tuple[int, int]:
    major, _, minor = text.partition(".")
    return int(major), int(minor or 0)


def _series(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _cuda_matches(pattern: str, cuda: str) -> bool:
    return pattern == "*" or pattern == cuda or cuda.split(".")[0] == pattern


def arch_build(knowledge: Knowledge, combo: Combination) -> ArchBuild | None:
    """The row of gpus.yaml saying which architectures this framework build targets."""
    for row in knowledge.arch_builds:
        if row.framework != combo.framework or row.platform != combo.platform:
            continue
        if "*" not in row.versions and _series(combo.framework_version) not in row.versions:
            continue
        if any(_cuda_matches(pattern, combo.cuda) for pattern in row.cuda):
            return row
    return None


def _sm(cc: str) -> str:
    return "sm_" + cc.replace(".", "")


# NVIDIA: a cubin (SASS) runs on GPUs of its major with the same or a higher minor only;
# PTX is JIT-compiled by the driver for its own or any newer compute capability.
SASS_RULE_SOURCE = "gpus:cubin-compat"


def _kernels_for(
    knowledge: Knowledge, row: ArchBuild, gpu: Gpu, *, build: str, label: str, source: str
) -> Fact:
    """Whether an arch list has SASS a GPU can run, or PTX it can JIT-compile, and why."""
    cc = _cc(gpu.cc)
    targets = sorted(_cc(s) for s in row.sm)
    shipped = ", ".join(_sm(s) for s in row.sm) + (" + PTX" if row.ptx else "")
    newest = f"{targets[-1][0]}.{targets[-1][1]}"
    sass = [t for t in targets if t[0] == cc[0] and t[1] <= cc[1]]
    rule = _source(knowledge, SASS_RULE_SOURCE)
    if cc in targets:
        return Fact(holds=True, text=f"{build} ship {shipped}: they run on {label}", source=source)
    if sass:
        older = f"{sass[-1][0]}.{sass[-1][1]}"
        return Fact(
            holds=True,
            text=(
                f"{build} ship {shipped}: they run on {label}; there are no {_sm(gpu.cc)} "
                f"kernels, but the {_sm(older)} SASS runs on compute capability {cc[0]}.x "
                f"from {older} up"
            ),
            source=f"{source}; {rule}",
        )
    if row.ptx and cc >= targets[-1]:
        return Fact(
            holds=True,
            text=(
                f"{build} ship {shipped}: they run on {label}; there are no {_sm(gpu.cc)} "
                f"kernels, and the driver JIT-compiles the {_sm(newest)} PTX for it"
            ),
            source=f"{source}; {rule}",
        )
    jit = (
        f"their PTX ({_sm(newest)}) cannot be JIT-compiled for an older GPU"
        if row.ptx
        else "they carry no PTX to JIT-compile"
    )
    return Fact(
        holds=False,
        text=(
            f"{build} have no kernels for {label}; they ship {shipped}: no SASS of compute "
            f"capability {cc[0]}.x at or below {gpu.cc}, and {jit}"
        ),
        source=f"{source}; {rule}",
    )


def gpu_runs(knowledge: Knowledge, combo: Combination, gpu: Gpu) -> Fact:
    """Whether the build has kernels (SASS of the same major, or PTX) for the GPU's architecture."""
    label = gpu.name if gpu.name == _sm(gpu.cc) else f"{gpu.name} ({_sm(gpu.cc)})"
    if combo.cuda == CPU:
        return Fact(
            holds=True,
            text=f"a CPU build does not use {label}",
            source="matrices/knowledge/gpus.yaml",
        )
    build = f"{combo.framework} {combo.framework_version} {cuda_tag(combo.cuda)} wheels"
    cc = _cc(gpu.cc)
    row = arch_build(knowledge, combo)
    if row is not None:
        source = _source(knowledge, row.source)
        if row.sm:
            return _kernels_for(knowledge, row, gpu, build=build, label=label, source=source)
        if row.min_cc is not None:
            holds = cc >= _cc(row.min_cc)
            verb = "run on" if holds else "need"
            text = f"{build} {verb} compute capability >= {row.min_cc}" + (
                f": {label}" if holds else f"; {label} is older"
            )
            return Fact(holds=holds, text=text, source=source)
    target = knowledge.cuda_targets.get(gpu.cc)
    if target is None:
        return Fact(
            holds=True,
            text=f"no architecture data for {label}; assumed to run",
            source="matrices/knowledge/gpus.yaml",
        )
    first, last, source_id = target
    cuda = version_sort_key(combo.cuda)
    holds = version_sort_key(first) <= cuda and (last is None or cuda <= version_sort_key(last))
    span = f"CUDA {first}-{last}" if last else f"CUDA {first} and newer"
    text = (
        f"{label} is a target of {span}, so CUDA {combo.cuda} can build for it"
        if holds
        else f"CUDA {combo.cuda} cannot target {label} (only {span} can)"
    )
    return Fact(holds=holds, text=text, source=_source(knowledge, source_id))


def compute_capability(text: str) -> str | None:
    """'sm_90', 'sm90' or '9.0' as '9.0'; None unless it is major 1-20, minor 0-9 (ASCII digits)."""
    match = _SM.fullmatch(text) or _CC.fullmatch(text)
    if match is None:
        return None
    major, minor = int(match[1]), int(match[2])
    return f"{major}.{minor}" if major in CC_MAJORS else None


def _squash(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def find_gpu(knowledge: Knowledge, text: str) -> Gpu | None:
    """A GPU from a name ("H100", "RTX 4090", "NVIDIA H100 80GB HBM3") or a compute
    capability ("sm_90", "9.0"); None when it is neither."""
    stripped = text.strip()
    cc = compute_capability(stripped)
    if cc is not None:
        name = stripped if stripped.lower().startswith("sm") else _sm(cc)
        return Gpu(name=name, cc=cc, source="the command line")
    if looks_like_cc(stripped):
        return None  # sm_00, sm_999999, 9.x: not a GPU name either
    wanted = _squash(text)
    by_name = {_squash(name): gpu for name, gpu in knowledge.gpus.items()}
    if wanted in by_name:
        return by_name[wanted]
    # Product strings as drivers report them contain the model name: take the longest match.
    contained = [key for key in by_name if key and key in wanted]
    return by_name[max(contained, key=len)] if contained else None


def looks_like_cc(text: str) -> bool:
    """True when `text` is written as a compute capability (sm_..., digits and dots), valid or not."""
    lowered = text.strip().lower()
    if lowered.startswith("sm"):
        rest = lowered[2:]
        return not rest or rest[0] == "_" or rest[0].isdigit()
    return bool(lowered) and all(ch.isdigit() or ch == "." for ch in lowered)
