"""Matrix files: load, validate with locations, expand under the compatibility rules, select."""

from __future__ import annotations

import difflib
import itertools
import math
import re
from collections import Counter
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild import compat
from envbuild.errors import BadInput, MatrixError, SelectionError
from envbuild.knowledge import version_sort_key
from envbuild.models import CPU, Combination, Entry, Exclusion, Fleet, Knowledge, Plan, Selection
from envbuild.references import repository_problem, shown
from envbuild.resources import matrices_dir
from envbuild.yamlfile import path_label, read_yaml, yaml_kind

AXES = ("framework", "framework_version", "cuda", "python", "os")
TOP_KEYS = ("description", "defaults", "axes", "include", "exclude")
DEFAULT_KEYS = ("python", "os", "repository", "framework_version", "cuda")
LATEST = "latest"
DEFAULT_REPOSITORY = "envbuild/{framework}"
EXAMPLES = {
    "framework": "[torch]",
    "framework_version": "['2.4.1'] (a release), ['2.4'] (a prefix) or [latest]",
    "cuda": "[cpu, '12.1']",
    "python": "['3.11']",
    "os": "[bookworm]",
}

# Bounds that keep a matrix file from asking for hours of work: the axes multiply.
MAX_COMBINATIONS = 10_000
MAX_POINTS = 1_000  # per include / exclude list
MAX_VALUE_CHARS = 64

_VERSION = re.compile(r"[0-9]{1,8}(\.[0-9]{1,8}){0,2}")
# "12.1", or "12" for builds that take the newest 12.x
_CUDA = re.compile(r"[0-9]{1,3}(\.[0-9]{1,3})?")
_PYTHON = re.compile(r"3\.[0-9]{1,3}")


@dataclass(frozen=True, kw_only=True)
class Matrix:
    """A validated matrix: axes, include and exclude lists, defaults."""

    source: str  # file path, or "the knowledge base"
    axes: dict[str, tuple[str, ...]]
    include: tuple[dict[str, str], ...]
    exclude: tuple[dict[str, str], ...]
    python: str
    os: str
    repository: str


def default_matrix_path() -> Path:
    """The shipped default matrix."""
    return matrices_dir() / "default.yaml"


def _suggest(word: str, choices: list[str]) -> str:
    match = difflib.get_close_matches(word, choices, n=1, cutoff=0.5)
    return f"; did you mean {match[0]!r}?" if match else ""


def _label(where: str, key: Any) -> str:
    text = str(key)
    if not isinstance(key, str) or not text.isprintable() or len(text) > 40:
        text = shown(text, 40)
    return f"{where}.{text}" if where else text


def release_versions(knowledge: Knowledge) -> dict[str, frozenset[str]]:
    """Each framework's release versions, as version selectors need them."""
    return {
        name: frozenset(r.version for r in framework.releases)
        for name, framework in knowledge.frameworks.items()
    }


def _shorten(values: list[str], limit: int = 12) -> str:
    if len(values) <= limit:
        return ", ".join(values)
    return f"{', '.join(values[:3])}, ..., {', '.join(values[-6:])} ({len(values)} in all)"


class _Validator:
    """Walks a matrix document and collects every problem with its location."""

    def __init__(self, path: str, knowledge: Knowledge) -> None:
        self.path = path
        self.knowledge = knowledge
        self.releases = release_versions(knowledge)
        self.problems: list[str] = []

    def fail(self, where: str, what: str) -> None:
        self.problems.append(f"{self.path}: {where or 'top level'}: {what}")

    def keys(self, where: str, mapping: dict[Any, Any], allowed: tuple[str, ...]) -> None:
        for key in mapping:
            if not isinstance(key, str) or key not in allowed:
                self.fail(
                    _label(where, key),
                    f"unknown key{_suggest(str(key), list(allowed))} (allowed: {', '.join(allowed)})",
                )

    def mapping(
        self, where: str, raw: Any, allowed: tuple[str, ...], example: str
    ) -> dict[str, Any]:
        """`raw` as a mapping (null is empty) with only `allowed` keys."""
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            self.fail(where, f"expected a mapping, got {yaml_kind(raw)}; e.g. {example}")
            return {}
        self.keys(where, raw, allowed)
        return {k: v for k, v in raw.items() if isinstance(k, str) and k in allowed}

    def value(self, where: str, axis: str, raw: Any) -> str | None:
        """Check one axis value; return it as a string, or None after reporting a problem."""
        if isinstance(raw, int | float) and not isinstance(raw, bool):
            self.fail(where, f"{raw!r} was read as a YAML number; quote versions: '{raw}'")
            return None
        if not isinstance(raw, str):
            self.fail(where, f"expected a string, got {yaml_kind(raw)}")
            return None
        text = raw
        known = self.knowledge
        if text.strip() and text != text.strip() and len(text) <= MAX_VALUE_CHARS:
            self.fail(
                where, f"{shown(text)} has a space or line break at an end; write {text.strip()!r}"
            )
            return None
        if len(text) > MAX_VALUE_CHARS or not text.isprintable():
            problem = "is too long" if len(text) > MAX_VALUE_CHARS else "holds control characters"
            self.fail(where, f"{shown(text, 40)} {problem}; give e.g. {EXAMPLES[axis]}")
            return None
        if axis == "framework":
            if text not in known.frameworks:
                self.fail(
                    where,
                    f"{text!r} is not a known framework{_suggest(text, list(known.frameworks))}",
                )
                return None
        elif axis == "framework_version":
            if text != LATEST and not _VERSION.fullmatch(text) and not self.is_release(text):
                self.fail(
                    where, f"{text!r} is not a version (use '2.4.1', a prefix '2.4', or 'latest')"
                )
                return None
            if not any(
                version_selects(text, v, versions)
                for versions in self.releases.values()
                for v in versions
            ):
                self.fail(where, f"no known release matches {text!r}")
                return None
        elif axis == "cuda":
            if text != CPU and not _CUDA.fullmatch(text):
                choices = [CPU, *sorted(known.cuda_toolkit_driver)]
                self.fail(
                    where,
                    f"{text!r} is not a version (use 'cpu' or e.g. '12.1'){_suggest(text, choices)}",
                )
                return None
        elif axis == "python":
            if not _PYTHON.fullmatch(text):
                self.fail(where, f"{text!r} is not a Python version (e.g. '3.11')")
                return None
        elif axis == "os" and text not in known.os_bases:
            self.fail(where, f"{text!r} is not a known OS{_suggest(text, list(known.os_bases))}")
            return None
        return text

    def is_release(self, text: str) -> bool:
        return any(text in versions for versions in self.releases.values())

    def version_of(self, where: str, version: str, frameworks: tuple[str, ...]) -> None:
        """Report a framework_version that selects no release of any of `frameworks`."""
        if not frameworks or any(
            version_selects(version, v, self.releases[f])
            for f in frameworks
            for v in self.releases[f]
        ):
            return
        names = " or ".join(frameworks)
        ordered = sorted((v for f in frameworks for v in self.releases[f]), key=version_sort_key)
        elsewhere = [
            f
            for f, versions in sorted(self.releases.items())
            if f not in frameworks and any(version_selects(version, v, versions) for v in versions)
        ]
        span = f"{names} has {ordered[0]} to {ordered[-1]}" if ordered else f"{names} has none"
        close = difflib.get_close_matches(version, ordered, n=1, cutoff=0.5)
        if elsewhere:
            hint = f"it is a release of {' and '.join(elsewhere)}; {span}"
        elif close:
            hint = f"did you mean {close[0]!r}? ({span})"
        else:
            hint = span
        self.fail(where, f"no release of {names} matches {version!r}; {hint}")

    def point_list(
        self, name: str, raw: Any, frameworks: tuple[str, ...], *, own_framework_needed: bool
    ) -> tuple[dict[str, str], ...]:
        if raw is None:
            return ()
        if not isinstance(raw, list):
            self.fail(name, f"expected a list of mappings, got {yaml_kind(raw)}")
            return ()
        if len(raw) > MAX_POINTS:
            self.fail(name, f"holds {len(raw)} points, more than {MAX_POINTS}; split the matrix")
            return ()
        points = []
        for i, item in enumerate(raw):
            where = f"{name}[{i}]"
            if not isinstance(item, dict) or not item:
                self.fail(
                    where,
                    "expected a non-empty mapping of axis: value, e.g. {framework: torch, cuda: cpu}",
                )
                continue
            self.keys(where, item, AXES)
            point = {}
            for key, value in item.items():
                if isinstance(key, str) and key in AXES:
                    checked = self.value(f"{where}.{key}", key, value)
                    if checked is not None:
                        point[key] = checked
            if "framework" in item:
                own: tuple[str, ...] = (point["framework"],) if "framework" in point else ()
            elif own_framework_needed:  # an include without one builds axes.framework's first
                own = frameworks[:1]
            else:
                own = frameworks
            if "framework_version" in point:
                self.version_of(f"{where}.framework_version", point["framework_version"], own)
            points.append(point)
        return tuple(points)

    def repository(self, raw: Any, frameworks: tuple[str, ...]) -> str:
        if not isinstance(raw, str):
            self.fail("defaults.repository", f"expected a string, got {yaml_kind(raw)}")
            return DEFAULT_REPOSITORY
        problem = repository_problem(raw, frameworks)
        if problem is not None:
            self.fail(
                "defaults.repository",
                f"{shown(raw, 60)}: {problem}; e.g. registry.example.com/team/{{framework}}",
            )
        return raw


def load_matrix(path: Path, knowledge: Knowledge) -> Matrix:
    """Read and validate a matrix file; raise MatrixError listing every problem."""
    label = path_label(path)
    data = read_yaml(path, what="matrix file", missing="pass an existing file to -m")
    if not isinstance(data, dict):
        msg = f"{label}: expected a mapping with 'axes' at the top level, got {yaml_kind(data)}"
        raise MatrixError([msg])
    check = _Validator(label, knowledge)
    check.keys("", data, TOP_KEYS)
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        check.fail(
            "description", f"expected a string, got {yaml_kind(description)}; write it as text"
        )

    defaults_raw = check.mapping(
        "defaults", data.get("defaults"), DEFAULT_KEYS, "{python: '3.11', os: bookworm}"
    )
    defaults: dict[str, str] = {}
    for key in ("python", "os", "framework_version", "cuda"):
        if key in defaults_raw:
            value = check.value(f"defaults.{key}", key, defaults_raw[key])
            if value is not None:
                defaults[key] = value

    axes: dict[str, tuple[str, ...]] = {}
    axes_raw = data.get("axes")
    if axes_raw is None:
        check.fail("axes", "missing; give at least axes.framework (e.g. [torch]) and axes.cuda")
    axes_raw = check.mapping("axes", axes_raw, AXES, "{framework: [torch], cuda: [cpu]}")
    versions: list[tuple[str, str]] = []  # (place, value) of framework_version values
    for axis in AXES:
        if axis not in axes_raw:
            continue
        raw = axes_raw[axis]
        if raw is None or raw == []:
            empty = "null" if raw is None else "an empty list"
            check.fail(
                f"axes.{axis}",
                f"is {empty}, so nothing would be built; list values, e.g. {EXAMPLES[axis]}, "
                "or remove the key",
            )
            continue
        items = list(enumerate(raw)) if isinstance(raw, list) else [(None, raw)]
        checked = []
        for i, item in items:
            where = f"axes.{axis}" if i is None else f"axes.{axis}[{i}]"
            value = check.value(where, axis, item)
            if value is not None:
                checked.append(value)
                if axis == "framework_version":
                    versions.append((where, value))
        axes[axis] = tuple(dict.fromkeys(checked))
    if isinstance(data.get("axes"), dict) and "framework" not in axes_raw:
        check.fail("axes.framework", "missing; list the frameworks to build, e.g. [torch]")
    frameworks = axes.get("framework", ())
    if "framework_version" in defaults:
        versions.append(("defaults.framework_version", defaults["framework_version"]))
    for where, version in versions:
        check.version_of(where, version, frameworks)
    include = check.point_list(
        "include", data.get("include"), frameworks, own_framework_needed=True
    )
    exclude = check.point_list(
        "exclude", data.get("exclude"), frameworks, own_framework_needed=False
    )
    named = tuple(
        dict.fromkeys([*frameworks, *(p["framework"] for p in include if "framework" in p)])
    )
    repository = check.repository(defaults_raw.get("repository", DEFAULT_REPOSITORY), named)
    if check.problems:
        raise MatrixError(check.problems)

    python = defaults.get("python", "3.11")
    os_name = defaults.get("os", "bookworm")
    axes.setdefault("framework_version", (defaults.get("framework_version", LATEST),))
    axes.setdefault("cuda", (defaults.get("cuda", CPU),))
    axes.setdefault("python", (python,))
    axes.setdefault("os", (os_name,))
    count = math.prod(len(axes[a]) for a in AXES) + len(include)
    if count > MAX_COMBINATIONS:
        msg = (
            f"{label}: axes: the axes multiply to {count} combinations, more than "
            f"{MAX_COMBINATIONS}; split the matrix into several files"
        )
        raise MatrixError([msg])
    return Matrix(
        source=label,
        axes=axes,
        include=include,
        exclude=exclude,
        python=python,
        os=os_name,
        repository=repository,
    )


def knowledge_matrix(knowledge: Knowledge, selection: Selection, defaults: Matrix) -> Matrix:
    """Every release of every framework x every CUDA that framework ever shipped, at the selected
    Python and OS (so a release that lacks a sibling's variant is listed with the reason)."""
    check_selection(selection)
    python = selection.python or defaults.python
    os_name = selection.os or defaults.os
    points: list[dict[str, str]] = []
    for name in sorted(knowledge.frameworks):
        releases = knowledge.frameworks[name].releases
        cudas = {v.cuda for r in releases for v in r.variants} - {CPU}
        for release in releases:
            for cuda in (CPU, *sorted(cudas, key=version_sort_key)):
                points.append(
                    {
                        "framework": name,
                        "framework_version": release.version,
                        "cuda": cuda,
                        "python": python,
                        "os": os_name,
                    }
                )
    return Matrix(
        source="the knowledge base",
        axes={axis: () for axis in AXES},
        include=tuple(points),
        exclude=(),
        python=python,
        os=os_name,
        repository=defaults.repository,
    )


def _version_prefix(prefix: str, version: str) -> bool:
    want = prefix.split(".")
    return version.split(".")[: len(want)] == want


def version_selects(selector: str, version: str, releases: Collection[str]) -> bool:
    """Whether a framework_version selector picks `version` of a framework with `releases`.

    'latest' picks every release; a selector equal to a release picks that release alone
    (0.9.0 is not 0.9.0.1); any other selector is a prefix ('2.4' picks 2.4.x).
    """
    if selector == LATEST:
        return True
    if selector in releases:
        return version == selector
    return _version_prefix(selector, version)


def _resolve_version(knowledge: Knowledge, framework: str, wanted: str) -> str | None:
    """'latest' or a prefix → the newest matching release; an exact unknown version stays as is."""
    info = knowledge.frameworks.get(framework)
    if info is None:
        return wanted
    if wanted == LATEST:
        return info.releases[-1].version if info.releases else None
    if info.release(wanted):
        return wanted
    matching = [r.version for r in info.releases if _version_prefix(wanted, r.version)]
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
    for framework, version, cuda, python, os_name in itertools.product(
        *(matrix.axes[a] for a in AXES)
    ):
        resolved = _resolve_version(knowledge, framework, version)
        if resolved is None:
            continue
        combo = Combination(
            framework=framework, framework_version=resolved, cuda=cuda, python=python, os=os_name
        )
        reason = None
        for i, point in enumerate(matrix.exclude):
            if _point_matches(point, combo, releases):
                reason = f"excluded by {matrix.source}: exclude[{i}]"
                break
        seen.setdefault(combo, reason)
    for point in matrix.include:
        framework = point.get("framework") or matrix.axes["framework"][0]
        resolved = _resolve_version(knowledge, framework, point.get("framework_version", LATEST))
        if resolved is None:
            continue
        combo = Combination(
            framework=framework,
            framework_version=resolved,
            cuda=point.get("cuda", CPU),
            python=point.get("python", matrix.python),
            os=point.get("os", matrix.os),
        )
        seen[combo] = None  # an include wins over an exclude
    return list(seen.items())


def make_plan(
    knowledge: Knowledge,
    matrix: Matrix,
    selection: Selection,
    *,
    fleet: Fleet | None = None,
    newest_only: bool = False,
) -> Plan:
    """Expand the matrix, apply the selectors and the rules; keep every exclusion with its reason."""
    check_selection(selection)
    releases = release_versions(knowledge)
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
            entries.append(
                compat.resolve_entry(knowledge, combo, repository=matrix.repository, facts=facts)
            )
        else:
            excluded.append(Exclusion(combination=combo, reason=facts[-1].text, facts=facts))
    if newest_only and entries:
        entries = _newest(entries)
    return Plan(entries=tuple(entries), excluded=tuple(excluded))


def _newest(entries: list[Entry]) -> list[Entry]:
    newest: dict[str, str] = {}
    for entry in entries:
        best = newest.get(entry.framework)
        if best is None or version_sort_key(entry.framework_version) > version_sort_key(best):
            newest[entry.framework] = entry.framework_version
    return [e for e in entries if e.framework_version == newest[e.framework]]


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
    defaults = {"framework_version": LATEST, "cuda": CPU, "python": matrix.python, "os": matrix.os}
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
    if axis in ("framework", "os"):
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
            parts.append(f"{name}: {_shorten(offered[axis]) or 'none'}")
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
