"""Matrix files: load, validate with locations, expand under the compatibility rules, select."""

from __future__ import annotations

import difflib
import itertools
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from envbuild import compat
from envbuild.errors import MatrixError, SelectionError
from envbuild.knowledge import version_sort_key
from envbuild.models import CPU, Combination, Entry, Exclusion, Fleet, Knowledge, Plan, Selection
from envbuild.resources import matrices_dir

AXES = ("framework", "framework_version", "cuda", "python", "os")
TOP_KEYS = ("description", "defaults", "axes", "include", "exclude")
DEFAULT_KEYS = ("python", "os", "repository", "framework_version", "cuda")
LATEST = "latest"
DEFAULT_REPOSITORY = "envbuild/{framework}"

_VERSION = re.compile(r"^\d+(\.\d+){0,2}$")
_CUDA = re.compile(r"^\d+(\.\d+)?$")  # "12.1", or "12" for builds that take the newest 12.x
_PYTHON = re.compile(r"^3\.\d+$")


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


class _Validator:
    """Walks a matrix document and collects every problem with its location."""

    def __init__(self, path: str, knowledge: Knowledge) -> None:
        self.path = path
        self.knowledge = knowledge
        self.problems: list[str] = []

    def fail(self, where: str, what: str) -> None:
        self.problems.append(f"{self.path}: {where}: {what}")

    def keys(self, where: str, mapping: dict[Any, Any], allowed: tuple[str, ...]) -> None:
        for key in mapping:
            if str(key) not in allowed:
                label = f"{where}.{key}" if where else str(key)
                self.fail(
                    label,
                    f"unknown key{_suggest(str(key), list(allowed))} (allowed: {', '.join(allowed)})",
                )

    def value(self, where: str, axis: str, raw: Any) -> str | None:
        """Check one axis value; return it as a string, or None after reporting a problem."""
        if isinstance(raw, bool) or not isinstance(raw, str | int | float):
            self.fail(where, f"expected a string, got {type(raw).__name__}")
            return None
        if isinstance(raw, float | int) and axis != "framework":
            self.fail(where, f"{raw!r} was read as a YAML number; quote versions: '{raw}'")
            return None
        text = str(raw)
        known = self.knowledge
        if axis == "framework":
            if text not in known.frameworks:
                self.fail(
                    where,
                    f"{text!r} is not a known framework{_suggest(text, list(known.frameworks))}",
                )
                return None
        elif axis == "framework_version":
            if text != LATEST and not _VERSION.match(text):
                self.fail(
                    where, f"{text!r} is not a version (use '2.4.1', a prefix '2.4', or 'latest')"
                )
                return None
            if text != LATEST and not any(
                _version_prefix(text, r.version)
                for f in known.frameworks.values()
                for r in f.releases
            ):
                self.fail(where, f"no known release matches {text!r}")
                return None
        elif axis == "cuda":
            if text != CPU and not _CUDA.match(text):
                choices = [CPU, *sorted(known.cuda_toolkit_driver)]
                self.fail(
                    where,
                    f"{text!r} is not a version (use 'cpu' or e.g. '12.1'){_suggest(text, choices)}",
                )
                return None
        elif axis == "python":
            if not _PYTHON.match(text):
                self.fail(where, f"{text!r} is not a Python version (e.g. '3.11')")
                return None
        elif axis == "os" and text not in known.os_bases:
            self.fail(where, f"{text!r} is not a known OS{_suggest(text, list(known.os_bases))}")
            return None
        return text

    def point_list(self, name: str, raw: Any) -> tuple[dict[str, str], ...]:
        if raw is None:
            return ()
        if not isinstance(raw, list):
            self.fail(name, "expected a list of mappings")
            return ()
        points = []
        for i, item in enumerate(raw):
            where = f"{name}[{i}]"
            if not isinstance(item, dict) or not item:
                self.fail(where, "expected a non-empty mapping of axis: value")
                continue
            self.keys(where, item, AXES)
            point = {}
            for key, value in item.items():
                if str(key) in AXES:
                    checked = self.value(f"{where}.{key}", str(key), value)
                    if checked is not None:
                        point[str(key)] = checked
            points.append(point)
        return tuple(points)


def load_matrix(path: Path, knowledge: Knowledge) -> Matrix:
    """Read and validate a matrix file; raise MatrixError listing every problem."""
    label = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise MatrixError([f"{label}: no such matrix file; pass an existing file to -m"]) from exc
    except OSError as exc:
        raise MatrixError([f"{label}: cannot read: {exc.strerror}"]) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise MatrixError([f"{label}: {where}not valid YAML: {problem}"]) from exc
    if not isinstance(data, dict):
        raise MatrixError([f"{label}: expected a mapping with 'axes' at the top level"])
    check = _Validator(label, knowledge)
    check.keys("", data, TOP_KEYS)

    defaults_raw = data.get("defaults") or {}
    if not isinstance(defaults_raw, dict):
        check.fail("defaults", "expected a mapping")
        defaults_raw = {}
    check.keys("defaults", defaults_raw, DEFAULT_KEYS)
    defaults: dict[str, str] = {}
    for key in ("python", "os", "framework_version", "cuda"):
        if key in defaults_raw:
            value = check.value(f"defaults.{key}", key, defaults_raw[key])
            if value is not None:
                defaults[key] = value
    repository = str(defaults_raw.get("repository", DEFAULT_REPOSITORY))

    axes_raw = data.get("axes")
    axes: dict[str, tuple[str, ...]] = {}
    if not isinstance(axes_raw, dict):
        check.fail("axes", "missing; give at least axes.framework (e.g. [torch]) and axes.cuda")
        axes_raw = {}
    check.keys("axes", axes_raw, AXES)
    for axis in AXES:
        raw = axes_raw.get(axis)
        if raw is None:
            continue
        values = raw if isinstance(raw, list) else [raw]
        checked = [
            check.value(f"axes.{axis}[{i}]", axis, v)
            if isinstance(raw, list)
            else check.value(f"axes.{axis}", axis, v)
            for i, v in enumerate(values)
        ]
        axes[axis] = tuple(v for v in checked if v is not None)
    if axes_raw and "framework" not in axes_raw:
        check.fail("axes.framework", "missing; list the frameworks to build, e.g. [torch]")
    include = check.point_list("include", data.get("include"))
    exclude = check.point_list("exclude", data.get("exclude"))
    if check.problems:
        raise MatrixError(check.problems)

    python = defaults.get("python", "3.11")
    os_name = defaults.get("os", "bookworm")
    axes.setdefault("framework_version", (defaults.get("framework_version", LATEST),))
    axes.setdefault("cuda", (defaults.get("cuda", CPU),))
    axes.setdefault("python", (python,))
    axes.setdefault("os", (os_name,))
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


def _point_matches(point: dict[str, str], combo: Combination) -> bool:
    fields = combo.as_dict()
    for key, value in point.items():
        if key == "framework_version":
            if value != LATEST and not _version_prefix(value, fields[key]):
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


def selection_matches(selection: Selection, combo: Combination) -> bool:
    """True when every given selector matches the combination."""
    point = {
        key: value
        for key, value in (
            ("framework", selection.framework),
            ("framework_version", selection.framework_version),
            ("cuda", selection.cuda),
            ("python", selection.python),
            ("os", selection.os),
        )
        if value is not None
    }
    return _point_matches(point, combo)


def combinations(matrix: Matrix, knowledge: Knowledge) -> list[tuple[Combination, str | None]]:
    """Every combination of the axes plus the includes, each with an exclude reason or None."""
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
            if _point_matches(point, combo):
                reason = f"excluded by {matrix.source}: exclude[{i}]"
                break
        seen.setdefault(combo, reason)
    for point in matrix.include:
        framework = point["framework"] if "framework" in point else matrix.axes["framework"][0]
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
    entries: list[Entry] = []
    excluded: list[Exclusion] = []
    for combo, excluded_by in combinations(matrix, knowledge):
        if not selection_matches(selection, combo):
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
        f"--{flag} {value}"
        for flag, value in (
            ("framework", selection.framework),
            ("framework-version", selection.framework_version),
            ("cuda", selection.cuda),
            ("python", selection.python),
            ("os", selection.os),
        )
        if value is not None
    ]
    return " ".join(parts) or "no selectors"


def require_entries(plan: Plan, matrix: Matrix, selection: Selection) -> None:
    """Raise SelectionError, with the reasons and what would work, when the plan is empty."""
    if plan.entries:
        return
    head = f"no entry to build for {describe(selection)} in {matrix.source}"
    if not plan.excluded:
        offered = "; ".join(
            f"{axis}: {', '.join(matrix.axes[axis])}"
            for axis in ("framework", "cuda", "python", "os")
        )
        msg = f"{head}: no combination matches; it offers {offered}"
        raise SelectionError(msg)
    counts = Counter(e.reason for e in plan.excluded)
    reasons = [f"{reason}" + (f" (x{n})" if n > 1 else "") for reason, n in counts.most_common(5)]
    more = len(counts) - len(reasons)
    tail = f"; and {more} more reasons (see `envbuild plan`)" if more > 0 else ""
    raise SelectionError(f"{head}: " + "; ".join(reasons) + tail)
