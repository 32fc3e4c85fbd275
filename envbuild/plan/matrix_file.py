"""Matrix files: read, validate with locations (every problem collected), and the Matrix they hold."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.core.errors import BadInput, MatrixError
from envbuild.core.models import CPU, IMAGE_UID, IMAGE_USER, USER_CHOICES, Knowledge
from envbuild.core.names import repository_problem, shown
from envbuild.core.platforms import PLATFORMS, host_platform, platform_of
from envbuild.core.resources import matrices_dir
from envbuild.core.versions import version_sort_key
from envbuild.core.yamlfile import path_label, read_yaml, yaml_kind
from envbuild.plan.packages import (
    MAX_PACKAGES,
    check_packages,
    framework_packages,
    read_requirements,
)

AXES = ("framework", "framework_version", "cuda", "python", "os", "platform")
TOP_KEYS = ("description", "defaults", "axes", "include", "exclude")
PACKAGE_KEYS = ("packages", "requirements")
DEFAULT_KEYS = (
    "python", "os", "platform", "repository", "framework_version", "cuda", *PACKAGE_KEYS, "numpy",
    "user", "bytecode",
)  # fmt: skip
INCLUDE_KEYS = (*AXES, *PACKAGE_KEYS, "user")
LATEST = "latest"
DEFAULT_REPOSITORY = "envbuild/{framework}"
EXAMPLES = {
    "framework": "[torch]",
    "framework_version": "['2.4.1'] (a release), ['2.4'] (a prefix) or [latest]",
    "cuda": "[cpu, '12.1']",
    "python": "['3.11']",
    "os": "[bookworm]",
    "platform": "[linux/amd64, linux/arm64]",
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
    platform: str = "linux/amd64"  # defaults.platform, else the host's
    # The team's packages (normalized; numpy not yet added): for every entry, and per include.
    packages: tuple[str, ...] = ()
    include_packages: tuple[tuple[str, ...], ...] = ()
    numpy: bool = True  # defaults.numpy: false leaves numpy out of entries that do not name it
    # Who the images run as (defaults.user), and each include's own choice (None: the default's).
    user: str = IMAGE_USER
    include_users: tuple[str | None, ...] = ()
    bytecode: bool = True  # defaults.bytecode: false installs no .pyc (Entry.bytecode)

    @property
    def frameworks(self) -> tuple[str, ...]:
        """Every framework the matrix builds: its axis's, then the includes' own."""
        first = self.axes["framework"][:1]
        named = [p.get("framework", first[0] if first else "") for p in self.include]
        return tuple(dict.fromkeys([*self.axes["framework"], *filter(None, named)]))


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


def shorten(values: list[str], limit: int = 12) -> str:
    """A long list of values as its first and last few, and how many there are."""
    if len(values) <= limit:
        return ", ".join(values)
    return f"{', '.join(values[:3])}, ..., {', '.join(values[-6:])} ({len(values)} in all)"


class _Validator:
    """Walks a matrix document and collects every problem with its location."""

    def __init__(self, path: str, knowledge: Knowledge, directory: Path | None = None) -> None:
        self.path = path
        self.directory = directory  # requirements files are relative to the matrix's folder
        self.include_packages: list[tuple[str, ...]] = []
        self.include_users: list[str | None] = []
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
        elif axis == "platform":
            named = platform_of(text)
            if named is None:
                self.fail(
                    where,
                    f"{text!r} is not a platform envbuild builds for (use {' or '.join(PLATFORMS)})",
                )
            return named
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
            self.keys(where, item, INCLUDE_KEYS if own_framework_needed else AXES)
            point = {}
            for key, value in item.items():
                if isinstance(key, str) and key in AXES:
                    checked = self.value(f"{where}.{key}", key, value)
                    if checked is not None:
                        point[key] = checked
            if "framework" in item:
                own: tuple[str, ...] = (point["framework"],) if "framework" in point else ()
            elif own_framework_needed and not frameworks:
                self.fail(
                    f"{where}.framework",
                    "missing; with no axes.framework each include names its framework, "
                    "e.g. {framework: torch, cuda: cpu}",
                )
                own = ()
            elif own_framework_needed:  # an include without one builds axes.framework's first
                own = frameworks[:1]
            else:
                own = frameworks
            if "framework_version" in point:
                self.version_of(f"{where}.framework_version", point["framework_version"], own)
            if own_framework_needed:
                self.include_packages.append(self.packages(where, item, own))
                has_user = "user" in item
                self.include_users.append(
                    self.user(f"{where}.user", item["user"]) if has_user else None
                )
            points.append(point)
        return tuple(points)

    def packages(
        self, where: str, item: dict[str, Any], frameworks: tuple[str, ...]
    ) -> tuple[str, ...]:
        """An item's `packages` list and `requirements` file, normalized; problems collected."""
        names = framework_packages(self.knowledge, frameworks)
        found: list[str] = []
        raw = item.get("packages")
        if raw is not None and not isinstance(raw, list):
            self.fail(
                f"{where}.packages",
                f"expected a list of requirements, got {yaml_kind(raw)}; "
                "e.g. [numpy, 'transformers>=4.40']",
            )
        elif isinstance(raw, list) and len(raw) > MAX_PACKAGES:
            self.fail(
                f"{where}.packages",
                f"holds {len(raw)} items, more than {MAX_PACKAGES}; use a requirements file",
            )
        elif isinstance(raw, list):
            for i, value in enumerate(raw):
                if not isinstance(value, str):
                    self.fail(
                        f"{where}.packages[{i}]",
                        f"expected a string, got {yaml_kind(value)}; "
                        "quote requirements: 'pkg==1.0'",
                    )
                    continue
                try:
                    found += check_packages([value], f"{where}.packages[{i}]", names)
                except BadInput as exc:
                    self.problems.append(f"{self.path}: {exc.message}")
        file = item.get("requirements")
        if file is not None and (
            not isinstance(file, str) or not file.isprintable() or not 0 < len(file) <= 4096
        ):
            self.fail(
                f"{where}.requirements",
                f"expected a file path, got {shown(str(file), 40)}; "
                "e.g. requirements/train.txt (relative to the matrix)",
            )
        elif isinstance(file, str):
            path = (self.directory or Path()) / file
            try:
                found += read_requirements(path, f"{self.path}: {where}.requirements", names)
            except BadInput as exc:
                self.problems.append(exc.message)
        return tuple(sorted(set(found)))

    def user(self, where: str, raw: Any) -> str | None:
        """Who an image runs as: one of USER_CHOICES; None, reported, for anything else."""
        choices = " or ".join(USER_CHOICES)
        why = f"{IMAGE_USER}, the default, runs as uid {IMAGE_UID}, not root"
        if not isinstance(raw, str):
            self.fail(where, f"expected {choices}, got {yaml_kind(raw)}; {why}")
            return None
        if raw not in USER_CHOICES:
            near = difflib.get_close_matches(raw.strip().lower(), USER_CHOICES, n=1, cutoff=0.5)
            hint = f" (did you mean {near[0]!r}?)" if near and raw.isprintable() else ""
            self.fail(where, f"expected {choices}, got {shown(raw, 40)}{hint}; {why}")
            return None
        return raw

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


@dataclass(frozen=True, kw_only=True)
class _Sections:
    """A matrix document's sections as validated, before the defaults fill in missing axes."""

    axes: dict[str, tuple[str, ...]]
    defaults: dict[str, str]  # the axis values among defaults: python, os, framework_version, cuda
    include: tuple[dict[str, str], ...]
    exclude: tuple[dict[str, str], ...]
    repository: str
    packages: tuple[str, ...]
    include_packages: tuple[tuple[str, ...], ...]
    numpy: bool
    user: str
    include_users: tuple[str | None, ...]
    bytecode: bool


def load_matrix(path: Path, knowledge: Knowledge) -> Matrix:
    """Read and validate a matrix file; raise MatrixError listing every problem."""
    label = path_label(path)
    data = _read_document(path, label)
    check = _Validator(label, knowledge, path.parent)
    sections = _validate(check, data)
    if check.problems:
        raise MatrixError(check.problems)
    return _assemble(label, sections)


def _read_document(path: Path, label: str) -> dict[Any, Any]:
    """The matrix file's top-level mapping; MatrixError when the file holds anything else."""
    data = read_yaml(path, what="matrix file", missing="pass an existing file to -m")
    if not isinstance(data, dict):
        msg = f"{label}: expected a mapping with 'axes' at the top level, got {yaml_kind(data)}"
        raise MatrixError([msg])
    return data


def _validate(check: _Validator, data: dict[Any, Any]) -> _Sections:
    """Every section of a matrix document, checked; the problems collect in `check`."""
    check.keys("", data, TOP_KEYS)
    description = data.get("description")
    if description is not None and not isinstance(description, str):
        check.fail(
            "description", f"expected a string, got {yaml_kind(description)}; write it as text"
        )
    defaults_raw = check.mapping(
        "defaults", data.get("defaults"), DEFAULT_KEYS, "{python: '3.11', os: bookworm}"
    )
    defaults = _axis_defaults(check, defaults_raw)
    axes, versions = _axes(check, data)
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
    packages = check.packages("defaults", defaults_raw, named)
    numpy = defaults_raw.get("numpy", True)
    if not isinstance(numpy, bool):
        check.fail("defaults.numpy", f"expected true or false, got {yaml_kind(numpy)}")
    user = check.user("defaults.user", defaults_raw["user"]) if "user" in defaults_raw else None
    bytecode = defaults_raw.get("bytecode", True)
    if not isinstance(bytecode, bool):
        check.fail("defaults.bytecode", f"expected true or false, got {yaml_kind(bytecode)}")
    return _Sections(
        axes=axes,
        defaults=defaults,
        include=include,
        exclude=exclude,
        repository=repository,
        packages=packages,
        include_packages=tuple(check.include_packages),
        numpy=numpy is not False,
        user=user or IMAGE_USER,
        include_users=tuple(check.include_users),
        bytecode=bytecode is not False,
    )


def _axis_defaults(check: _Validator, defaults_raw: dict[str, Any]) -> dict[str, str]:
    """The defaults that stand for an axis left out of `axes`, each checked as an axis value."""
    defaults: dict[str, str] = {}
    for key in ("python", "os", "platform", "framework_version", "cuda"):
        if key in defaults_raw:
            value = check.value(f"defaults.{key}", key, defaults_raw[key])
            if value is not None:
                defaults[key] = value
    return defaults


def _axes(
    check: _Validator, data: dict[Any, Any]
) -> tuple[dict[str, tuple[str, ...]], list[tuple[str, str]]]:
    """`axes`: each axis's valid values, once each; and the place of every framework_version."""
    axes: dict[str, tuple[str, ...]] = {}
    axes_raw = data.get("axes")
    if axes_raw is None:
        includes = data.get("include")
        if isinstance(includes, list) and includes:
            return axes, []  # a matrix of hand-picked includes, as GitHub Actions allows
        check.fail(
            "axes",
            "missing; give axes (at least axes.framework, e.g. [torch], and axes.cuda) or a "
            "list of include entries, e.g. include: [{framework: torch, cuda: cpu}]",
        )
    axes_raw = check.mapping("axes", axes_raw, AXES, "{framework: [torch], cuda: [cpu]}")
    versions: list[tuple[str, str]] = []  # (place, value) of framework_version values
    for axis in AXES:
        if axis not in axes_raw:
            continue
        placed = _axis_values(check, axis, axes_raw[axis])
        if placed is None:
            continue
        axes[axis] = tuple(dict.fromkeys(value for _, value in placed))
        if axis == "framework_version":
            versions += placed
    if isinstance(data.get("axes"), dict) and "framework" not in axes_raw:
        check.fail("axes.framework", "missing; list the frameworks to build, e.g. [torch]")
    return axes, versions


def _axis_values(check: _Validator, axis: str, raw: Any) -> list[tuple[str, str]] | None:
    """One axis's valid values with their places; None, reported, when it lists no value."""
    if raw is None or raw == []:
        empty = "null" if raw is None else "an empty list"
        check.fail(
            f"axes.{axis}",
            f"is {empty}, so nothing would be built; list values, e.g. {EXAMPLES[axis]}, "
            "or remove the key",
        )
        return None
    items = list(enumerate(raw)) if isinstance(raw, list) else [(None, raw)]
    placed = []
    for i, item in items:
        where = f"axes.{axis}" if i is None else f"axes.{axis}[{i}]"
        value = check.value(where, axis, item)
        if value is not None:
            placed.append((where, value))
    return placed


def _assemble(label: str, sections: _Sections) -> Matrix:
    """The Matrix of a valid document: an axis it leaves out takes its default value."""
    defaults = sections.defaults
    python = defaults.get("python", "3.11")
    os_name = defaults.get("os", "bookworm")
    platform = defaults.get("platform", host_platform())
    axes = dict(sections.axes)
    axes.setdefault("framework", ())  # none: a matrix of includes alone
    axes.setdefault("framework_version", (defaults.get("framework_version", LATEST),))
    axes.setdefault("cuda", (defaults.get("cuda", CPU),))
    axes.setdefault("python", (python,))
    axes.setdefault("os", (os_name,))
    axes.setdefault("platform", (platform,))
    count = math.prod(len(axes[a]) for a in AXES) + len(sections.include)
    if count > MAX_COMBINATIONS:
        msg = (
            f"{label}: axes: the axes multiply to {count} combinations, more than "
            f"{MAX_COMBINATIONS}; split the matrix into several files"
        )
        raise MatrixError([msg])
    return Matrix(
        source=label,
        axes=axes,
        include=sections.include,
        exclude=sections.exclude,
        python=python,
        os=os_name,
        platform=platform,
        repository=sections.repository,
        packages=sections.packages,
        include_packages=sections.include_packages,
        numpy=sections.numpy,
        user=sections.user,
        include_users=sections.include_users,
        bytecode=sections.bytecode,
    )


def has_version_prefix(prefix: str, version: str) -> bool:
    """Whether `version`'s leading dot-separated parts are `prefix`'s ('2.4' for 2.4.1)."""
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
    return has_version_prefix(selector, version)
