"""Matrices expanded under the compatibility rules: selection, plans, and why nothing matched."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping
from typing import TypeVar

from envbuild.core.errors import BadInput, MatrixError, SelectionError
from envbuild.core.models import (
    CPU,
    Combination,
    Entry,
    Exclusion,
    Fleet,
    Knowledge,
    Plan,
    Selection,
)
from envbuild.core.names import shown
from envbuild.core.versions import cuda_tag, version_sort_key
from envbuild.plan import compat
from envbuild.plan.matrix_file import (
    AXES,
    EXAMPLES,
    LATEST,
    MAX_VALUE_CHARS,
    Matrix,
    default_matrix_path,
    has_version_prefix,
    load_matrix,
    release_versions,
    shorten,
    version_selects,
)
from envbuild.plan.packages import with_numpy

K = TypeVar("K", bound=Hashable)


def knowledge_matrix(knowledge: Knowledge, selection: Selection, defaults: Matrix) -> Matrix:
    """Every release of every framework x every CUDA that framework ever shipped, at the selected
    Python and OS (so a release that lacks a sibling's variant is listed with the reason)."""
    check_selection(selection)
    python = selection.python or defaults.python
    os_name = selection.os or defaults.os
    platforms = (selection.platform or defaults.platform).split(",")
    points: list[dict[str, str]] = []
    for name in sorted(knowledge.frameworks):
        releases = knowledge.frameworks[name].releases
        cudas = {v.cuda for r in releases for v in r.variants} - {CPU}
        for release, platform in itertools.product(releases, platforms):
            for cuda in (CPU, *sorted(cudas, key=version_sort_key)):
                points.append(
                    {
                        "framework": name,
                        "framework_version": release.version,
                        "cuda": cuda,
                        "python": python,
                        "os": os_name,
                        "platform": platform,
                    }
                )
    return Matrix(
        source="the knowledge base",
        axes={axis: () for axis in AXES},
        include=tuple(points),
        exclude=(),
        python=python,
        os=os_name,
        platform=platforms[0],
        repository=defaults.repository,
    )


def _resolve_version(knowledge: Knowledge, framework: str, wanted: str) -> str | None:
    """'latest' or a prefix → the newest matching release; an exact unknown version stays as is."""
    info = knowledge.frameworks.get(framework)
    if info is None:
        return wanted
    if wanted == LATEST:
        return info.releases[-1].version if info.releases else None
    if info.release(wanted):
        return wanted
    matching = [r.version for r in info.releases if has_version_prefix(wanted, r.version)]
    return matching[-1] if matching else None


def _point_matches(
    point: dict[str, str], combo: Combination, releases: Mapping[str, Collection[str]]
) -> bool:
    fields = combo.as_dict()
    for key, value in point.items():
        if key == "framework_version":
            if not version_selects(value, fields[key], releases.get(combo.framework, ())):
                return False
        elif key == "cuda":
            if not cuda_matches(value, fields[key]):
                return False
        elif key == "platform":  # --platform may name several
            if fields[key] not in value.split(","):
                return False
        elif fields[key] != value:
            return False
    return True


def cuda_matches(selector: str, cuda: str) -> bool:
    """'cpu' matches CPU, '12' every 12.x, '12.1' exactly 12.1."""
    if selector == CPU or cuda == CPU:
        return selector == cuda
    return cuda.split(".")[: len(selector.split("."))] == selector.split(".")


def _selectors(selection: Selection) -> list[tuple[str, str]]:
    """The given selectors as (axis, value) pairs."""
    return [
        (axis, value)
        for axis, value in (
            ("framework", selection.framework),
            ("framework_version", selection.framework_version),
            ("cuda", selection.cuda),
            ("python", selection.python),
            ("os", selection.os),
            ("platform", selection.platform),
        )
        if value is not None
    ]


def selection_matches(
    selection: Selection,
    combo: Combination,
    releases: Mapping[str, Collection[str]] | None = None,
) -> bool:
    """True when every given selector matches the combination.

    `releases` (framework -> its release versions) lets a version equal to a release select
    that release alone; without it a version selector is a prefix only.
    """
    return _point_matches(dict(_selectors(selection)), combo, releases or {})


def check_selection(selection: Selection) -> None:
    """Raise BadInput for a selector no matrix could hold: too long, or with control characters."""
    for axis, value in _selectors(selection):
        if len(value) > MAX_VALUE_CHARS or not value.isprintable():
            problem = (
                f"is {len(value)} characters long (at most {MAX_VALUE_CHARS})"
                if len(value) > MAX_VALUE_CHARS
                else "holds control characters"
            )
            flag = "--" + axis.replace("_", "-")
            msg = f"{flag} {shown(value, 20)} {problem}; give e.g. {EXAMPLES[axis]}"
            raise BadInput(msg)


def combinations(matrix: Matrix, knowledge: Knowledge) -> list[tuple[Combination, str | None]]:
    """Every combination of the axes plus the includes, each with an exclude reason or None."""
    releases = release_versions(knowledge)
    seen: dict[Combination, str | None] = {}
    for framework, version, cuda, python, os_name, platform in itertools.product(
        *(matrix.axes[a] for a in AXES)
    ):
        resolved = _resolve_version(knowledge, framework, version)
        if resolved is None:
            continue
        combo = Combination(
            framework=framework, framework_version=resolved, cuda=cuda, python=python, os=os_name,
            platform=platform,
        )  # fmt: skip
        reason = None
        for i, point in enumerate(matrix.exclude):
            if _point_matches(point, combo, releases):
                reason = f"excluded by {matrix.source}: exclude[{i}]"
                break
        seen.setdefault(combo, reason)
    for point in matrix.include:
        included = _include_combination(matrix, knowledge, point)
        if included is not None:
            seen[included] = None  # an include wins over an exclude
    return list(seen.items())


def _include_combination(
    matrix: Matrix, knowledge: Knowledge, point: dict[str, str]
) -> Combination | None:
    framework = point.get("framework") or matrix.axes["framework"][0]
    resolved = _resolve_version(knowledge, framework, point.get("framework_version", LATEST))
    if resolved is None:
        return None
    return Combination(
        framework=framework,
        framework_version=resolved,
        cuda=point.get("cuda", CPU),
        python=point.get("python", matrix.python),
        os=point.get("os", matrix.os),
        platform=point.get("platform", matrix.platform),
    )


def entry_packages(
    matrix: Matrix, knowledge: Knowledge, extra: tuple[str, ...] = ()
) -> dict[Combination | None, tuple[str, ...]]:
    """Each include's combination -> its packages (None -> every other entry's): the matrix
    defaults, the include's own, `extra` (the command line's), and numpy unless told not to."""
    common = (*matrix.packages, *extra)
    found: dict[Combination | None, tuple[str, ...]] = {
        None: with_numpy(common, numpy=matrix.numpy)
    }
    for point, own in zip(matrix.include, matrix.include_packages, strict=False):
        combo = _include_combination(matrix, knowledge, point)
        if combo is not None:
            earlier = found.get(combo, ())
            found[combo] = with_numpy((*earlier, *common, *own), numpy=matrix.numpy)
    return found


def entry_users(matrix: Matrix, knowledge: Knowledge) -> dict[Combination | None, str]:
    """Each include's combination -> who its image runs as (None -> every other entry's): the
    include's own `user`, else the matrix's. Two includes of one entry that disagree are refused."""
    found: dict[Combination | None, str] = {None: matrix.user}
    said: dict[Combination, int] = {}
    for i, (point, user) in enumerate(zip(matrix.include, matrix.include_users, strict=False)):
        combo = _include_combination(matrix, knowledge, point)
        if combo is None or user is None:
            continue
        if combo in said and found[combo] != user:
            msg = (
                f"{matrix.source}: include[{i}].user: {user!r}, but include[{said[combo]}] of the "
                f"same entry says {found[combo]!r}; give that entry one user"
            )
            raise MatrixError([msg])
        found[combo], said[combo] = user, i
    return found


def make_plan(
    knowledge: Knowledge,
    matrix: Matrix,
    selection: Selection,
    *,
    fleet: Fleet | None = None,
    newest_only: bool = False,
    packages: tuple[str, ...] = (),
    user: str | None = None,
) -> Plan:
    """Expand the matrix, apply the selectors and the rules; keep every exclusion with its reason.

    Every entry carries the matrix's packages, its include's, `packages` (normalized: the
    command line's) and numpy unless the matrix says `numpy: false`; and runs as `user` (the
    command line's) or else as its include or the matrix says; byte-compiled unless the matrix
    says `bytecode: false`.
    """
    check_selection(selection)
    releases = release_versions(knowledge)
    wanted = entry_packages(matrix, knowledge, packages)
    users = entry_users(matrix, knowledge)
    entries: list[Entry] = []
    excluded: list[Exclusion] = []
    for combo, excluded_by in combinations(matrix, knowledge):
        if not selection_matches(selection, combo, releases):
            continue
        if excluded_by:
            excluded.append(Exclusion(combination=combo, reason=excluded_by))
            continue
        facts = compat.judge(knowledge, combo, fleet)
        if facts[-1].holds:
            entry = compat.resolve_entry(
                knowledge, combo, repository=matrix.repository, facts=facts
            )
            own = wanted.get(combo, wanted[None])
            runs_as = user or users.get(combo, users[None])
            entries.append(
                dataclasses.replace(entry, packages=own, user=runs_as, bytecode=matrix.bytecode)
            )
        else:
            excluded.append(Exclusion(combination=combo, reason=facts[-1].text, facts=facts))
    if newest_only and entries:
        newest = newest_entries(entries, _framework)
        entries = [
            e for e in entries if e.framework_version == newest[e.framework].framework_version
        ]
    return Plan(entries=tuple(entries), excluded=tuple(excluded))


def _framework(entry: Entry) -> str:
    return entry.framework


def newest_entries(entries: Iterable[Entry], group: Callable[[Entry], K]) -> dict[K, Entry]:
    """Per group (e.g. per framework), the first entry of the newest release among `entries`."""
    newest: dict[K, Entry] = {}
    for entry in entries:
        key = group(entry)
        best = newest.get(key)
        if best is None or version_sort_key(entry.framework_version) > version_sort_key(
            best.framework_version
        ):
            newest[key] = entry
    return newest


def newest_per_framework(entries: Iterable[Entry]) -> dict[str, Entry]:
    """Per framework, the first entry of its newest release among `entries`."""
    return newest_entries(entries, _framework)


def fleet_alternatives(knowledge: Knowledge, selection: Selection, fleet: Fleet) -> str:
    """What a fleet can run when a selection leaves it nothing: newest release per variant."""
    relaxed = dataclasses.replace(selection, cuda=None, framework_version=None)
    defaults = load_matrix(default_matrix_path(), knowledge)
    plan = make_plan(
        knowledge, knowledge_matrix(knowledge, relaxed, defaults), relaxed, fleet=fleet
    )
    newest = newest_entries(plan.entries, lambda e: (e.framework, e.cuda))
    if not newest:
        return "that fleet can run nothing in the knowledge base"
    # Newest releases first; among them the highest CUDA first, CPU last.
    ordered = sorted(
        newest.items(),
        key=lambda item: (
            version_sort_key(item[1].framework_version),
            item[0][1] != "cpu",
            version_sort_key(item[0][1]) if item[0][1] != "cpu" else version_sort_key("0"),
        ),
        reverse=True,
    )
    examples = [f"{fw} {e.framework_version} {cuda_tag(cuda)}" for (fw, cuda), e in ordered[:5]]
    return "that fleet can run e.g. " + ", ".join(examples)


def describe(selection: Selection) -> str:
    """The selectors as the user typed them."""
    parts = [
        f"--{axis.replace('_', '-')} "
        + (value if value.isprintable() and len(value) <= MAX_VALUE_CHARS else shown(value, 20))
        for axis, value in _selectors(selection)
    ]
    return " ".join(parts) or "no selectors"


def _points(matrix: Matrix) -> list[dict[str, str]]:
    """The matrix's axes combined (unresolved) and its includes, every axis filled in."""
    first = matrix.axes["framework"][0] if matrix.axes["framework"] else None
    defaults = {
        "framework_version": LATEST, "cuda": CPU, "python": matrix.python, "os": matrix.os,
        "platform": matrix.platform,
    }  # fmt: skip
    points = [
        dict(zip(AXES, values, strict=True))
        for values in itertools.product(*(matrix.axes[a] for a in AXES))
    ]
    for point in matrix.include:
        framework = point.get("framework", first)
        if framework is not None:
            points.append({**defaults, "framework": framework, **point})
    return points


def _sorted(axis: str, values: set[str]) -> list[str]:
    if axis in ("framework", "os", "platform"):
        return sorted(values)
    return sorted(values, key=lambda v: (v != CPU, version_sort_key(v)))


def _offers(matrix: Matrix, selection: Selection) -> str:
    """What the matrix offers on the axes that explain an empty selection.

    With --framework naming one of the matrix's frameworks, the other axes show what that
    framework is offered with.
    """
    points = _points(matrix)
    frameworks = {p["framework"] for p in points}
    framework = selection.framework if selection.framework in frameworks else None
    chosen = [p for p in points if framework is None or p["framework"] == framework]
    offered = {axis: _sorted(axis, {p[axis] for p in chosen}) for axis in AXES}
    offered["framework"] = sorted(frameworks)

    def matches(axis: str, selector: str, value: str) -> bool:
        if axis == "framework_version":
            return value == LATEST or version_selects(selector, value, offered[axis])
        if axis == "cuda":
            return cuda_matches(selector, value)
        return selector == value

    given = _selectors(selection)
    culprits = [
        axis
        for axis, selector in given
        if not any(matches(axis, selector, v) for v in offered[axis])
    ]
    parts = []
    for axis in culprits or [axis for axis, _ in given] or ["framework", "cuda", "python", "os"]:
        name = axis if axis == "framework" or framework is None else f"{axis} of {framework}"
        if axis == "framework_version" and framework is None and len(frameworks) > 1:
            ranges = []
            for each in sorted(frameworks):
                v = _sorted(axis, {p[axis] for p in points if p["framework"] == each})
                ranges.append(f"{each} {v[0]}" if len(v) == 1 else f"{each} {v[0]} to {v[-1]}")
            parts.append(f"{name}: {', '.join(ranges)}")
        else:
            parts.append(f"{name}: {shorten(offered[axis]) or 'none'}")
    return "; ".join(parts)


def require_entries(plan: Plan, matrix: Matrix, selection: Selection) -> None:
    """Raise SelectionError, with the reasons and what would work, when the plan is empty."""
    if plan.entries:
        return
    head = f"no entry to build for {describe(selection)} in {matrix.source}"
    if not plan.excluded:
        msg = f"{head}: no combination matches; it offers {_offers(matrix, selection)}"
        raise SelectionError(msg)
    counts = Counter(e.reason for e in plan.excluded)
    reasons = [f"{reason}" + (f" (x{n})" if n > 1 else "") for reason, n in counts.most_common(5)]
    more = len(counts) - len(reasons)
    tail = f"; and {more} more reasons (see `envbuild plan`)" if more > 0 else ""
    raise SelectionError(f"{head}: " + "; ".join(reasons) + tail)
