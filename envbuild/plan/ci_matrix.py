"""A plan as a GitHub Actions `strategy.matrix`: one job per entry, each rebuilt by its selectors."""

from __future__ import annotations

import shlex
from typing import Any

from envbuild.core.errors import BadInput
from envbuild.core.models import CPU, Entry, Plan, Selection
from envbuild.core.platforms import ARM64
from envbuild.plan.matrix import selection_matches

# A CUDA image proves it runs on a GPU only on a runner that has one.
GPU_RUNNER = ("self-hosted", "gpu")
CPU_RUNNER = "ubuntu-24.04"
# An arm64 image builds natively on an arm64 runner: GitHub's hosted one, or a self-hosted GPU
# runner with the architecture label GitHub gives it (GH200, GB200 nodes).
ARM_CPU_RUNNER = "ubuntu-24.04-arm"
ARM_LABEL = "ARM64"


def runner(entry: Entry) -> str | list[str]:
    """The runs-on of `entry`'s job: a GPU runner for a CUDA image, of the entry's platform."""
    arm = entry.platform == ARM64
    if entry.cuda != CPU:
        return [*GPU_RUNNER, ARM_LABEL] if arm else list(GPU_RUNNER)
    return ARM_CPU_RUNNER if arm else CPU_RUNNER


def entry_selection(entry: Entry) -> Selection:
    """The selectors that name `entry` on the command line."""
    return Selection(**entry.combination().as_dict())


def selector_arguments(entry: Entry, *, matrix_file: str | None) -> list[str]:
    """The CLI arguments (`--framework torch ... [-m FILE]`) that rebuild just `entry`."""
    arguments = [
        *("--framework", entry.framework),
        *("--framework-version", entry.framework_version),
        *("--cuda", entry.cuda),
        *("--python", entry.python),
        *("--os", entry.os),
        *("--platform", entry.platform),
    ]
    if matrix_file is not None:
        arguments += ["-m", matrix_file]
    return arguments


def _check_unambiguous(plan: Plan) -> None:
    """Raise BadInput when an entry's selectors would also pick another entry of the plan.

    A version equal to a release selects that release alone, but other selectors match by
    prefix (CUDA '12' every 12.x), and `build` keeps only the newest release it selects, so such
    a job would build the wrong image. Selectors only narrow, so any entry the CLI could select
    beside it at build time is already in this plan, and every version an entry names is a
    release (the plan's combinations hold only resolved releases).
    """
    releases: dict[str, set[str]] = {}
    combos = [e.combination() for e in plan.entries] + [x.combination for x in plan.excluded]
    for combo in combos:
        releases.setdefault(combo.framework, set()).add(combo.framework_version)
    problems = []
    for entry in plan.entries:
        selection = entry_selection(entry)
        others = [
            other.id
            for other in plan.entries
            if other.id != entry.id and selection_matches(selection, other.combination(), releases)
        ]
        if others:
            problems.append(
                f"the selectors of {entry.id} also select {', '.join(others)}; "
                "the CLI cannot build it alone; plan from a matrix file (-m) that holds only one of them"
            )
    if problems:
        msg = "ci-matrix: " + "\n".join(problems)
        raise BadInput(msg)


def github_matrix(plan: Plan, *, matrix_file: str | None) -> dict[str, Any]:
    """The plan's entries as `{"include": [...]}` for a GitHub Actions `strategy.matrix`."""
    _check_unambiguous(plan)
    include = []
    for entry in plan.entries:
        gpu = entry.cuda != CPU
        arguments = selector_arguments(entry, matrix_file=matrix_file)
        include.append(
            {
                "id": entry.id,
                "framework": entry.framework,
                "framework_version": entry.framework_version,
                "cuda": entry.cuda,
                "python": entry.python,
                "os": entry.os,
                "platform": entry.platform,
                "image": entry.image,
                "gpu": gpu,
                "runs_on": runner(entry),
                "selectors": " ".join(shlex.quote(argument) for argument in arguments),
            }
        )
    return {"include": include}
