"""The team's packages: PEP 508 requirements from a matrix, `-p` and requirements files, checked.

Each problem is one line naming the place (matrix key, option, file:line) and the fix, raised
as BadInput by the caller's collector or here. Requirements are kept in one normal form
(canonical name, sorted extras, specifier, marker) so that a lock's inputs do not change when
a user only respells one.
"""

from __future__ import annotations

import re
import stat
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from envbuild.core.errors import BadInput
from envbuild.core.models import Knowledge
from envbuild.core.names import shown

MAX_PACKAGES = 500  # per list, file or command line: a team's environment, not an index
MAX_REQUIREMENT_CHARS = 200
MAX_REQUIREMENTS_BYTES = 256 * 1024
NUMPY = "numpy"

# Packages that are the framework under another name: the entry fixes which build of it goes in.
_COMPANIONS = {
    "jax": ("jaxlib",),
    "tensorflow": ("tensorflow-cpu", "tensorflow-gpu", "tensorflow-intel", "tf-nightly"),
    "torch": ("pytorch",),
}
_OPTION_LINE = re.compile(r"-")


def framework_packages(knowledge: Knowledge, frameworks: Iterable[str]) -> dict[str, str]:
    """Canonical package name -> framework, for the packages that install `frameworks`."""
    names: dict[str, str] = {}
    for name in frameworks:
        info = knowledge.frameworks.get(name)
        if info is None:
            continue
        names[canonicalize_name(info.package)] = name
        for companion in _COMPANIONS.get(name, ()):
            names[canonicalize_name(companion)] = name
        for release in info.releases:
            for variant in release.variants:
                if variant.requirement:
                    text = variant.requirement.replace("{version}", release.version)
                    names[canonicalize_name(Requirement(text).name)] = name
    return names


def requirement_problem(text: str, framework_names: dict[str, str]) -> str | None:
    """What is wrong with one requirement string (None when nothing is), with the fix."""
    if len(text) > MAX_REQUIREMENT_CHARS:
        return f"is {len(text)} characters long (at most {MAX_REQUIREMENT_CHARS})"
    if not text.isprintable() or not text.strip():
        return "is empty or holds control characters; give e.g. 'transformers>=4.40'"
    if text.lstrip().startswith("-"):
        return "is an option, not a requirement; give e.g. 'transformers>=4.40'"
    try:
        requirement = Requirement(text)
    except InvalidRequirement as exc:
        reason = str(exc).splitlines()[0][:120]
        return f"is not a PEP 508 requirement ({reason}); give e.g. 'transformers>=4.40'"
    if requirement.url is not None:
        return "is a direct URL; give a name and a version range from an index"
    framework = framework_names.get(canonicalize_name(requirement.name))
    if framework is not None:
        return (
            f"names {requirement.name}, a package of {framework}: the entry fixes the framework; "
            "select the release with framework_version / --framework-version instead"
        )
    return None


def normalized(text: str) -> str:
    """One spelling of a valid requirement: 'Foo_Bar[B,a] >=1' -> 'foo-bar[a,b]>=1'."""
    requirement = Requirement(text)
    extras = f"[{','.join(sorted(canonicalize_name(e) for e in requirement.extras))}]"
    specifier = ",".join(sorted(str(s) for s in requirement.specifier))
    marker = f"; {requirement.marker}" if requirement.marker is not None else ""
    name = canonicalize_name(requirement.name)
    return f"{name}{extras if requirement.extras else ''}{specifier}{marker}"


def package_name(text: str) -> str:
    """The canonical name a normalized requirement installs."""
    return canonicalize_name(Requirement(text).name)


def with_numpy(packages: Iterable[str], *, numpy: bool = True) -> tuple[str, ...]:
    """Sorted, deduplicated requirements; numpy added unless one names it or `numpy` is False."""
    found = set(packages)
    if numpy and not any(package_name(p) == NUMPY for p in found):
        found.add(NUMPY)
    return tuple(sorted(found))


def _bad(where: str, problem: str) -> BadInput:
    return BadInput(f"{where}: {problem}")


def read_requirements(path: Path, where: str, framework_names: dict[str, str]) -> list[str]:
    """The requirements of a requirements file, normalized; BadInput naming file:line otherwise.

    Only requirement lines and `#` comments: options (-r, -e, --index-url, ...) would let a file
    change where packages come from behind the lock's back.
    """
    label = f"{where} {shown(str(path))}"
    try:
        resolved = path.resolve(strict=True)
        mode = resolved.stat().st_mode
    except (OSError, RuntimeError, ValueError) as exc:  # RuntimeError: a loop of links
        reason = "a loop of links" if isinstance(exc, RuntimeError) else "no such file"
        if isinstance(exc, OSError) and exc.strerror:
            reason = exc.strerror.lower()
        raise _bad(label, f"{reason}; pass a requirements file") from exc
    if not stat.S_ISREG(mode):
        raise _bad(label, "not a regular file; pass a requirements file")
    try:
        with resolved.open("rb") as handle:
            data = handle.read(MAX_REQUIREMENTS_BYTES + 1)
    except OSError as exc:
        raise _bad(label, f"cannot read it ({exc.strerror}); pass a readable file") from exc
    if len(data) > MAX_REQUIREMENTS_BYTES:
        raise _bad(label, f"larger than {MAX_REQUIREMENTS_BYTES // 1024} KiB; list fewer packages")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(label, "not UTF-8 text; pass a requirements file") from exc
    found: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
        if not line:
            continue
        place = f"{where} {shown(f'{path}:{number}')}"
        if _OPTION_LINE.match(line) or line.endswith("\\"):
            raise _bad(
                place,
                f"{shown(line, 40)} is a pip option; only requirement lines and # comments are "
                "read (index settings are envbuild options)",
            )
        problem = requirement_problem(line, framework_names)
        if problem is not None:
            raise _bad(place, f"{shown(line, 60)} {problem}")
        found.append(normalized(line))
        if len(found) > MAX_PACKAGES:
            raise _bad(label, f"lists more than {MAX_PACKAGES} requirements; list fewer")
    return found


def check_packages(values: Iterable[str], where: str, framework_names: dict[str, str]) -> list[str]:
    """`-p` values (or any list of strings) normalized; BadInput naming the first bad one."""
    found = []
    for value in values:
        problem = requirement_problem(value, framework_names)
        if problem is not None:
            place = f"{where} {shown(value, 60)}"
            raise _bad(place, problem)
        found.append(normalized(value))
        if len(found) > MAX_PACKAGES:
            raise _bad(where, f"given more than {MAX_PACKAGES} times; use a requirements file")
    return found
