"""The smoke report checked on the host: the payload's own verdicts, section by section, and
what it read (the versions, the user it ran as) against the image's labels. Pure functions of the
report and the labels."""

from __future__ import annotations

from typing import Any

from envbuild.core import labels as label_keys
from envbuild.core.models import CPU, ROOT_USER, user_spec
from envbuild.core.results import SmokeCheck
from envbuild.payload import smoke_harness as harness

ROOT_SPEC = user_spec(ROOT_USER)


def _version_base(text: str | None) -> str | None:
    return None if text is None else text.split("+", 1)[0]


def _major_minor(text: str | None) -> str | None:
    return None if text is None else ".".join(text.split(".")[:2])


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
    errors = payload.get("errors") or []
    return [
        *_core_checks(payload, errors, gpus=gpus),
        *_section_checks(payload, errors),
        *_version_checks(payload, labels),
        *_user_checks(payload, labels),
    ]


def _user_checks(payload: dict[str, Any], labels: dict[str, str]) -> list[SmokeCheck]:
    """The user the payload ran as against the image's user label (uid:gid); a user that is not
    root must be able to write HOME and the caches, and must not be able to write into the
    environment. An image without the label (built before it) is not checked."""
    expected = labels.get(label_keys.USER)
    if not expected:
        return []
    found = payload.get("user")
    part: dict[str, Any] = found if isinstance(found, dict) else {}
    uid, gid = part.get("uid"), part.get("gid")
    ran_as = f"{uid}:{gid}" if isinstance(uid, int) and isinstance(gid, int) else None
    problems = [] if ran_as == expected else [f"ran as {ran_as or 'an unknown user'}"]
    if expected != ROOT_SPEC:
        problems += _non_root_problems(part)
    name = f" ({part['name']})" if isinstance(part.get("name"), str) else ""
    if problems:
        detail = f"{'; '.join(problems)}; the image's {label_keys.USER} label says {expected}"
    elif expected == ROOT_SPEC:
        detail = f"ran as {ran_as}{name}, as the matrix chose (user: root)"
    else:
        detail = (
            f"ran as {ran_as}{name}, not root: HOME and the caches writable, "
            f"the environment {part.get('environment')} read-only"
        )
    return [SmokeCheck(name="user", passed=not problems, detail=detail[:500])]


def _non_root_problems(part: dict[str, Any]) -> list[str]:
    """What a user that is not root got wrong: HOME or a cache it cannot write, an environment
    it can write into, or a report that does not say."""
    folders, unwritable = part.get("folders"), part.get("unwritable")
    if not isinstance(folders, dict) or not isinstance(unwritable, dict):
        return ["the payload did not say which folders its user can write"]
    problems = [f"cannot write {k} {folders.get(k, '?')} ({why})" for k, why in unwritable.items()]
    writable = part.get("environment_writable")
    if not isinstance(writable, list):
        problems.append("the payload did not say whether its user can write the environment")
    elif writable:
        problems.append(f"can write into the environment ({', '.join(map(str, writable))})")
    return problems


def _core_checks(payload: dict[str, Any], errors: list[Any], *, gpus: bool) -> list[SmokeCheck]:
    """The payload ran without an error, its loss fell, and its all-reduce was right."""
    train = payload.get("train") or {}
    allreduce = payload.get("allreduce") or {}
    first, last = train.get("loss_first"), train.get("loss_last")
    fell = isinstance(first, int | float) and isinstance(last, int | float) and last < first
    world = int(allreduce.get("world_size") or 0)
    min_world = 1 if gpus else 2
    return [
        SmokeCheck(
            name="payload",
            passed=bool(payload.get("ok")) and not errors,
            detail="the payload reported no error"
            if not errors
            else "; ".join(map(str, errors))[:500],
        ),
        SmokeCheck(
            name="loss_fell",
            passed=bool(train.get("loss_fell")) and fell,
            detail=f"loss {first} -> {last} over {train.get('steps')} steps on {train.get('device')}",
        ),
        SmokeCheck(
            name="allreduce",
            passed=bool(allreduce.get("correct")) and world >= min_world,
            detail=(
                f"{allreduce.get('backend')} all-reduce over {world} ranks: expected "
                f"{allreduce.get('expected')}, got {allreduce.get('got')}; "
                f"busbw {allreduce.get('busbw_gbps')} GB/s"
            ),
        ),
    ]


def _version_checks(payload: dict[str, Any], labels: dict[str, str]) -> list[SmokeCheck]:
    """The versions the payload read (Python, the framework, CUDA, cuDNN, NCCL) against the
    labels; a version without a label is not checked."""
    checks: list[SmokeCheck] = []
    versions = payload.get("versions") or {}
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
        checks.append(_cuda_check(payload, versions.get("cuda"), expect_cuda, framework))
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


def _cuda_check(
    payload: dict[str, Any], got_cuda: Any, expect_cuda: str, framework: str
) -> SmokeCheck:
    """The CUDA runtime the framework reports against the label: none for a CPU image, any
    12.x for a label of "12"; not checked where the framework reports it only on a GPU."""
    on_gpu = any(d.get("kind") in ("cuda", "gpu") for d in payload.get("devices") or [])
    detail = f"CUDA runtime {got_cuda or 'none (CPU build)'} (labels say {expect_cuda})"
    if expect_cuda == CPU:
        passed = got_cuda is None
    elif got_cuda is None and payload.get("cuda_needs_gpu") and not on_gpu:
        passed = True
        detail = f"not checked: {framework} reports its CUDA version only on a GPU (labels say {expect_cuda})"
    elif got_cuda is None:
        passed = False
    else:
        parts = len(expect_cuda.split("."))
        passed = ".".join(str(got_cuda).split(".")[:parts]) == expect_cuda
    return SmokeCheck(name="cuda_version", passed=passed, detail=detail)
