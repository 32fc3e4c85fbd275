"""Loads the compatibility knowledge base (facts with sources) from matrices/knowledge/.

Files are read by envbuild.yamlfile; every key is checked here, unknown ones included.
"""

from __future__ import annotations

import difflib
import re
from functools import cache
from pathlib import Path
from typing import Any

from packaging.version import InvalidVersion, Version

from envbuild.errors import MatrixError
from envbuild.models import (
    CPU,
    ArchBuild,
    FrameworkKnowledge,
    Gpu,
    Knowledge,
    OsBase,
    Release,
    Variant,
)
from envbuild.references import shown
from envbuild.resources import matrices_dir
from envbuild.yamlfile import (
    MAX_VERSION_CHARS,
    path_label,
    read_yaml,
    yaml_kind,
)

FRAMEWORK_FILES = ("torch", "tensorflow", "jax")


def _suggest(word: str, choices: list[str] | tuple[str, ...]) -> str:
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f"; did you mean {match[0]!r}?" if match else ""


def _shorten(names: list[str], limit: int = 8) -> str:
    shown_names = ", ".join(names[:limit])
    return shown_names + (f", ... ({len(names)} in all)" if len(names) > limit else "")


_DRIVER = re.compile(r"[0-9]{1,4}(?:\.[0-9]{1,4}){0,2}")
_CUDA_KEY = re.compile(r"[0-9]{1,3}(?:\.[0-9]{1,3})?")
_CUDA_MINOR = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}")
_CUDA_MAJOR = re.compile(r"[0-9]{1,3}")
_CC = re.compile(r"[0-9]{1,2}\.[0-9]")
_PYTHON = re.compile(r"3\.[0-9]{1,3}")
_SERIES = re.compile(r"\*|[0-9]{1,4}\.[0-9]{1,4}")
_VARIANT_NAME = re.compile(rf"{CPU}|{_CUDA_KEY.pattern}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._+-]{0,63}")


class _Checker:
    """Collects every problem in one knowledge file, with its location."""

    def __init__(self, path: Path, data: dict[Any, Any], allowed: tuple[str, ...]) -> None:
        self.path = path
        self.label = path_label(path)
        self.problems: list[str] = []
        self.keys("", data, allowed)
        self.sources: dict[str, str] = {}
        for key, text in self.table("", data, "sources").items():
            if isinstance(text, str):
                self.sources[key] = text
            else:
                self.fail(f"sources.{key}", f"expected a string, got {yaml_kind(text)}")
        if data.get("sources") == {}:
            self.fail("sources", "empty; name the sources the facts come from")

    def fail(self, where: str, what: str) -> None:
        self.problems.append(f"{self.label}: {where or 'top level'}: {what}")

    def keys(self, where: str, item: dict[Any, Any], allowed: tuple[str, ...]) -> None:
        """Report every key that is not one of `allowed`, with a suggestion."""
        for key in item:
            place = f"{where}.{key}" if where else str(key)
            if not isinstance(key, str):
                self.fail(where, f"key {shown(str(key))} is {yaml_kind(key)}; expected a name")
            elif key not in allowed:
                self.fail(
                    shown(place) if not place.isprintable() or len(place) > 80 else place,
                    f"unknown key{_suggest(key, allowed)} (allowed: {', '.join(allowed)})",
                )

    def table(
        self,
        where: str,
        item: dict[Any, Any],
        key: str,
        *,
        names: re.Pattern[str] | None = None,
        hint: str = "",
        required: bool = True,
    ) -> dict[str, Any]:
        """`item[key]`, a mapping of names to values; names must be strings matching `names`."""
        place = f"{where}.{key}" if where else key
        value = item.get(key)
        if value is None:
            if required:
                self.fail(place, "missing; see the other knowledge files for its shape")
            return {}
        if not isinstance(value, dict):
            self.fail(place, f"expected a mapping, got {yaml_kind(value)}")
            return {}
        result = {}
        for name, entry in value.items():
            if not isinstance(name, str):
                self.fail(place, f"key {shown(str(name))} is {yaml_kind(name)}; quote it")
            elif names is not None and not names.fullmatch(name):
                self.fail(place, f"key {shown(name)} is not {hint}")
            else:
                result[name] = entry
        return result

    def mapping(self, where: str, value: Any, allowed: tuple[str, ...]) -> dict[str, Any]:
        """`value` as a mapping with only the `allowed` keys; {} after reporting otherwise."""
        if not isinstance(value, dict):
            self.fail(where, f"expected a mapping, got {yaml_kind(value)}")
            return {}
        self.keys(where, value, allowed)
        return {k: v for k, v in value.items() if isinstance(k, str)}

    def text(
        self,
        where: str,
        item: dict[str, Any],
        key: str,
        *,
        required: bool = False,
        pattern: re.Pattern[str] | None = None,
        hint: str = "",
    ) -> str | None:
        """`item[key]` as a string, None when absent; a wrong type or form is reported."""
        place = f"{where}.{key}" if where else key
        value = item.get(key)
        if value is None:
            if required:
                self.fail(place, "missing" if key not in item else "expected a string, got null")
            return None
        if not isinstance(value, str):
            self.fail(place, f"expected a string, got {yaml_kind(value)}")
            return None
        if pattern is not None and not pattern.fullmatch(value):
            self.fail(place, f"{shown(value)} is not {hint}")
            return None
        return value

    def texts(
        self,
        where: str,
        item: dict[str, Any],
        key: str,
        *,
        required: bool = False,
        pattern: re.Pattern[str] | None = None,
        hint: str = "",
    ) -> tuple[str, ...]:
        """`item[key]` as a list of strings; problems reported, bad items left out."""
        place = f"{where}.{key}" if where else key
        value = item.get(key)
        if value is None:
            if required:
                self.fail(place, "missing; give a list")
            return ()
        if not isinstance(value, list):
            self.fail(place, f"expected a list, got {yaml_kind(value)}")
            return ()
        result = []
        for i, entry in enumerate(value):
            if not isinstance(entry, str):
                self.fail(f"{place}[{i}]", f"expected a string, got {yaml_kind(entry)}")
            elif pattern is not None and not pattern.fullmatch(entry):
                self.fail(f"{place}[{i}]", f"{shown(entry)} is not {hint}")
            else:
                result.append(entry)
        return tuple(result)

    def template(self, where: str, item: dict[str, Any], key: str, placeholder: str) -> str | None:
        """A string that may use `placeholder` and no other braces."""
        value = self.text(where, item, key)
        if value is not None and (
            "{" in value.replace(placeholder, "") or "}" in value.replace(placeholder, "")
        ):
            self.fail(
                f"{where}.{key}", f"may use only the placeholder {placeholder}; remove other braces"
            )
            return None
        return value

    def source(self, where: str, item: dict[str, Any], field: str = "source") -> str:
        """Check the item's source key; return its id, qualified by the file ("torch:pypi")."""
        key = item.get(field)
        known = sorted(self.sources)
        if key is None:
            self.fail(where, f"{field}: missing; name one of sources: {_shorten(known)}")
        elif not isinstance(key, str):
            self.fail(f"{where}.{field}", f"expected a string, got {yaml_kind(key)}")
        elif key not in self.sources:
            self.fail(
                where,
                f"{field} {shown(key)} is not one of sources: {_shorten(known)}"
                + _suggest(key, known),
            )
        return f"{self.path.stem}:{key}"

    def qualified_sources(self) -> dict[str, str]:
        return {f"{self.path.stem}:{k}": v for k, v in self.sources.items()}


def _version_key(text: str) -> Version:
    try:
        return Version(text)
    except (InvalidVersion, ValueError):  # ValueError: a number past Python's int digit limit
        return Version("0")


def _is_version(text: str) -> bool:
    if len(text) > MAX_VERSION_CHARS:
        return False
    try:
        Version(text)
    except (InvalidVersion, ValueError):
        return False
    return True


def _read(path: Path) -> dict[Any, Any]:
    data = read_yaml(
        path,
        what="knowledge file",
        missing="restore it from envbuild's matrices/knowledge/",
    )
    if not isinstance(data, dict):
        msg = f"{path_label(path)}: expected a mapping at the top level, got {yaml_kind(data)}"
        raise MatrixError([msg])
    return data


FRAMEWORK_KEYS = ("framework", "package", "sources", "indexes", "variants_verified", "releases")
RELEASE_KEYS = (
    "released",
    "requires_python",
    "python",
    "pypi_variant",
    "source",
    "variants_verified",
    "unverified_variants",
    "variants",
    "tested",
)
VARIANT_KEYS = (
    "requirement",
    "index",
    "cudnn",
    "nccl",
    "cudnn_min",
    "nccl_min",
    "cuda_runtime",
    "cuda_runtime_min",
    "python",
    "python_note",
    "python_source",
    "source",
)
# Variant keys that are not plain strings: checked on their own.
_VARIANT_SPECIAL = ("source", "requirement", "python", "python_note", "python_source")
TESTED_KEYS = ("cuda", "cudnn", "python", "source")
_CUDA_VARIANT_HINT = "'cpu' or a CUDA version such as '12.1' or '12'"


def _load_framework(path: Path) -> tuple[FrameworkKnowledge, list[str]]:
    data = _read(path)
    check = _Checker(path, data, FRAMEWORK_KEYS)
    name = check.text("", data, "framework") or path.stem
    if name != path.stem:
        check.fail("framework", f"{shown(name)} differs from the file name; use {path.stem!r}")
        name = path.stem
    indexes = {}
    for key, url in check.table(
        "", data, "indexes", names=_VARIANT_NAME, hint=_CUDA_VARIANT_HINT, required=False
    ).items():
        if isinstance(url, str):
            indexes[key] = url
        else:
            check.fail(f"indexes.{key}", f"expected a URL string, got {yaml_kind(url)}")
    verified_default = _variants_verified(check, "", data)
    releases: list[Release] = []
    raw_releases = check.table("", data, "releases")
    for version, raw in raw_releases.items():
        where = f"releases.{version}"
        if not _is_version(version):
            check.fail("releases", f"key {shown(version)} is not a release version (e.g. '2.4.1')")
            continue
        item = check.mapping(where, raw, RELEASE_KEYS)
        if not item:
            continue
        python = check.texts(
            where,
            item,
            "python",
            required=True,
            pattern=_PYTHON,
            hint="a Python version such as '3.11'",
        )
        variants = _load_variants(check, where, item, indexes, python)
        verified = (
            _variants_verified(check, where, item)
            if "variants_verified" in item
            else verified_default
        )
        unverified = _unverified_variants(check, where, item, variants, verified)
        if "tested" in item:
            tested = check.mapping(f"{where}.tested", item["tested"], TESTED_KEYS)
            for key in ("cuda", "cudnn", "python"):
                check.text(f"{where}.tested", tested, key)
            if tested:
                check.source(f"{where}.tested", tested)
        pypi_variant = check.text(where, item, "pypi_variant")
        if pypi_variant is not None and pypi_variant not in {v.cuda for v in variants}:
            check.fail(where, f"pypi_variant {shown(pypi_variant)} is not one of its variants")
        releases.append(
            Release(
                framework=name,
                version=version,
                released=check.text(where, item, "released"),
                requires_python=check.text(where, item, "requires_python"),
                python=python,
                pypi_variant=pypi_variant,
                variants=variants,
                source=check.source(where, item),
                variants_verified=verified,
                unverified_variants=unverified,
            )
        )
    if "releases" in data and not raw_releases and not check.problems:
        check.fail("releases", "empty; list at least one release")
    releases.sort(key=lambda r: _version_key(r.version))
    for release in releases:
        for variant in release.variants:
            where = f"releases.{release.version}.variants.{variant.cuda}"
            if (
                variant.requirement is None
                and variant.cuda != release.pypi_variant
                and variant.cuda not in indexes
            ):
                check.fail(where, "no wheel index for this variant under indexes:")
    framework = FrameworkKnowledge(
        name=name,
        package=check.text("", data, "package") or name,
        releases=tuple(releases),
        indexes=indexes,
        sources=check.qualified_sources(),
    )
    return framework, check.problems


def _variants_verified(check: _Checker, where: str, item: dict[str, Any]) -> str | None:
    """`variants_verified`: a source id vouching the variant list is complete, or false."""
    value = item.get("variants_verified")
    if value is None or value is False:
        return None
    if value is True:
        place = f"{where}.variants_verified" if where else "variants_verified"
        check.fail(place, "name the source that lists every published variant, or write false")
        return None
    return check.source(where, item, "variants_verified")


def _unverified_variants(
    check: _Checker,
    where: str,
    item: dict[str, Any],
    variants: tuple[Variant, ...],
    verified: str | None,
) -> tuple[str, ...]:
    """`unverified_variants`: CUDA versions whose publication a verified list leaves open."""
    listed = check.texts(
        where, item, "unverified_variants", pattern=_VARIANT_NAME, hint=_CUDA_VARIANT_HINT
    )
    place = f"{where}.unverified_variants"
    if listed and verified is None:
        check.fail(
            place, "only with variants_verified (an unverified list leaves every variant open)"
        )
    known = {v.cuda for v in variants}
    for cuda in listed:
        if cuda in known:
            check.fail(place, f"{shown(cuda)} is also listed under variants; keep one")
    return listed


def _variant_python(
    check: _Checker, place: str, vitem: dict[str, Any], release_python: tuple[str, ...]
) -> tuple[tuple[str, ...] | None, str | None, str | None]:
    """A variant's own Python list, with the note and source that say why it is shorter."""
    if "python" not in vitem:
        for key in ("python_note", "python_source"):
            if key in vitem:
                check.fail(place, f"{key} is used only with python; add python, or drop {key}")
        return None, None, None
    python = check.texts(
        place,
        vitem,
        "python",
        required=True,
        pattern=_PYTHON,
        hint="a Python version such as '3.10'",
    )
    for version in python:
        if release_python and version not in release_python:
            check.fail(
                f"{place}.python",
                f"{version} is not one of the release's Pythons ({', '.join(release_python)})",
            )
    note = check.text(place, vitem, "python_note", required=True)
    return python, note, check.source(place, vitem, "python_source")


def _load_variants(
    check: _Checker,
    where: str,
    item: dict[str, Any],
    indexes: dict[str, str],
    release_python: tuple[str, ...] = (),
) -> tuple[Variant, ...]:
    variants = []
    for cuda, raw in check.table(
        where, item, "variants", names=_VARIANT_NAME, hint=_CUDA_VARIANT_HINT
    ).items():
        place = f"{where}.variants.{cuda}"
        vitem = check.mapping(place, raw, VARIANT_KEYS)
        fields = {
            key: check.text(place, vitem, key)
            for key in VARIANT_KEYS
            if key not in _VARIANT_SPECIAL
        }
        python, python_note, python_source = _variant_python(check, place, vitem, release_python)
        requirement = check.template(place, vitem, "requirement", "{version}")
        index = fields["index"]
        if index is not None and index not in indexes:
            check.fail(
                place,
                f"index {shown(index)} is not one of indexes: {sorted(indexes)}"
                + _suggest(index, sorted(indexes)),
            )
        if index is not None and requirement is None:
            check.fail(place, "index is used only with requirement; add one, or drop index")
        variants.append(
            Variant(
                cuda=cuda,
                cudnn=fields["cudnn"],
                nccl=fields["nccl"],
                source=check.source(place, vitem),
                requirement=requirement,
                index=index,
                cudnn_min=fields["cudnn_min"],
                nccl_min=fields["nccl_min"],
                python=python,
                python_note=python_note,
                python_source=python_source,
            )
        )
    return tuple(variants)


def _load_cuda(path: Path) -> tuple[dict[str, str], dict[str, str], dict[str, str], _Checker]:
    data = _read(path)
    check = _Checker(path, data, ("sources", "families", "toolkits"))
    families = {}
    family_sources = {}
    for major, raw in check.table(
        "", data, "families", names=_CUDA_MAJOR, hint="a CUDA major version such as '12'"
    ).items():
        where = f"families.{major}"
        item = check.mapping(where, raw, ("min_driver", "source"))
        driver = check.text(
            where, item, "min_driver", required=True, pattern=_DRIVER, hint="a driver version"
        )
        family_sources[major] = check.source(where, item)
        if driver is not None:
            families[major] = driver
    toolkits = {}
    for minor, raw in check.table(
        "", data, "toolkits", names=_CUDA_MINOR, hint="a CUDA version such as '12.1'"
    ).items():
        where = f"toolkits.{minor}"
        item = check.mapping(where, raw, ("driver", "source"))
        driver = check.text(
            where, item, "driver", required=True, pattern=_DRIVER, hint="a driver version"
        )
        check.source(where, item)
        if driver is not None:
            toolkits[minor] = driver
    return families, family_sources, toolkits, check


def _load_cudnn(path: Path) -> tuple[dict[str, tuple[tuple[str, str], ...]], _Checker]:
    data = _read(path)
    check = _Checker(path, data, ("sources", "releases"))
    result = {}
    for release, raw in check.table(
        "", data, "releases", names=_CUDA_MINOR, hint="a cuDNN version such as '9.1'"
    ).items():
        where = f"releases.{release}"
        item = check.mapping(where, raw, ("cuda", "source"))
        check.source(where, item)
        rows = item.get("cuda")
        if not isinstance(rows, list) or not rows:
            check.fail(f"{where}.cuda", "expected a list of {min: '12.0', max: '12.4'}")
            continue
        ranges = []
        for i, row in enumerate(rows):
            place = f"{where}.cuda[{i}]"
            bounds = check.mapping(place, row, ("min", "max"))
            low, high = (
                check.text(
                    place, bounds, key, required=True, pattern=_CUDA_MINOR, hint="a CUDA version"
                )
                for key in ("min", "max")
            )
            if low is not None and high is not None:
                ranges.append((low, high))
        result[release] = tuple(ranges)
    return result, check


OS_KEYS = ("distro", "version", "codename", "python", "image", "python_image", "source")


def _load_os(path: Path) -> tuple[dict[str, OsBase], _Checker]:
    data = _read(path)
    check = _Checker(path, data, ("sources", "bases"))
    bases = {}
    for name, raw in check.table(
        "", data, "bases", names=_NAME, hint="an OS name such as 'bookworm'"
    ).items():
        where = f"bases.{name}"
        item = check.mapping(where, raw, OS_KEYS)
        fields = {
            key: check.text(where, item, key, required=True)
            for key in ("distro", "version", "codename", "image")
        }
        python = check.text(
            where, item, "python", required=True, pattern=_PYTHON, hint="a Python version"
        )
        python_image = check.template(where, item, "python_image", "{python}")
        source = check.source(where, item)
        if python is None or any(value is None for value in fields.values()):
            continue
        bases[name] = OsBase(
            name=name,
            distro=str(fields["distro"]),
            version=str(fields["version"]),
            codename=str(fields["codename"]),
            python=python,
            image=str(fields["image"]),
            python_image=python_image,
            source=source,
        )
    return bases, check


GPU_KEYS = ("cc", "arch", "memory_gb", "source")
BUILD_KEYS = ("versions", "cuda", "sm", "ptx", "min_cc", "source")


def _load_gpus(
    path: Path,
) -> tuple[dict[str, Gpu], dict[str, tuple[str, str | None, str]], tuple[ArchBuild, ...], _Checker]:
    data = _read(path)
    check = _Checker(path, data, ("sources", "gpus", "cuda_targets", "builds"))
    gpus = {}
    for name, raw in check.table("", data, "gpus", names=_NAME, hint="a GPU name").items():
        where = f"gpus.{name}"
        item = check.mapping(where, raw, GPU_KEYS)
        cc = check.text(where, item, "cc", required=True, pattern=_CC, hint="a compute capability")
        check.text(where, item, "arch")
        memory = item.get("memory_gb")
        if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int | float)):
            check.fail(f"{where}.memory_gb", f"expected a number, got {yaml_kind(memory)}")
            memory = None
        source = check.source(where, item)
        if cc is not None:
            gpus[name] = Gpu(
                name=name,
                cc=cc,
                memory_gb=None if memory is None else float(memory),
                source=source,
            )
    targets = {}
    for cc, raw in check.table(
        "", data, "cuda_targets", names=_CC, hint="a compute capability such as '9.0'"
    ).items():
        where = f"cuda_targets.{cc}"
        item = check.mapping(where, raw, ("first", "last", "source"))
        first = check.text(
            where, item, "first", required=True, pattern=_CUDA_KEY, hint="a CUDA version"
        )
        last = check.text(where, item, "last", pattern=_CUDA_KEY, hint="a CUDA version")
        source = check.source(where, item)
        if first is not None:
            targets[cc] = (first, last, source)
    builds = []
    for framework, rows in check.table("", data, "builds", names=_NAME, hint="a framework").items():
        if not isinstance(rows, list):
            check.fail(f"builds.{framework}", f"expected a list, got {yaml_kind(rows)}")
            continue
        for i, raw in enumerate(rows):
            where = f"builds.{framework}[{i}]"
            item = check.mapping(where, raw, BUILD_KEYS)
            ptx = item.get("ptx", False)
            if not isinstance(ptx, bool):
                check.fail(f"{where}.ptx", f"expected true or false, got {yaml_kind(ptx)}")
                ptx = False
            cuda_hint = "a CUDA version or '*'"
            builds.append(
                ArchBuild(
                    framework=framework,
                    versions=check.texts(
                        where,
                        item,
                        "versions",
                        required=True,
                        pattern=_SERIES,
                        hint="a series or '*'",
                    ),
                    cuda=check.texts(
                        where,
                        item,
                        "cuda",
                        required=True,
                        pattern=re.compile(rf"\*|{_CUDA_KEY.pattern}"),
                        hint=cuda_hint,
                    ),
                    sm=check.texts(where, item, "sm", pattern=_CC, hint="a compute capability"),
                    ptx=ptx,
                    min_cc=check.text(
                        where, item, "min_cc", pattern=_CC, hint="a compute capability"
                    ),
                    source=check.source(where, item),
                )
            )
    return gpus, targets, tuple(builds), check


def load_knowledge(directory: Path | None = None) -> Knowledge:
    """Read and check every knowledge file; raise MatrixError listing all problems."""
    return _load_cached(directory or matrices_dir() / "knowledge")


@cache
def _load_cached(directory: Path) -> Knowledge:
    problems: list[str] = []
    sources: dict[str, str] = {}
    frameworks = {}
    for name in FRAMEWORK_FILES:
        framework, found = _load_framework(directory / f"{name}.yaml")
        frameworks[framework.name] = framework
        problems += found
        sources.update(framework.sources)
    families, family_sources, toolkits, cuda_check = _load_cuda(directory / "cuda.yaml")
    cudnn, cudnn_check = _load_cudnn(directory / "cudnn.yaml")
    os_bases, os_check = _load_os(directory / "os.yaml")
    gpus, targets, builds, gpu_check = _load_gpus(directory / "gpus.yaml")
    for check in (cuda_check, cudnn_check, os_check, gpu_check):
        problems += check.problems
        sources.update(check.qualified_sources())
    if problems:
        raise MatrixError(problems)
    return Knowledge(
        frameworks=frameworks,
        cuda_family_driver=families,
        cuda_family_source=family_sources,
        cuda_toolkit_driver=toolkits,
        cudnn_cuda=cudnn,
        os_bases=os_bases,
        gpus=gpus,
        cuda_targets=targets,
        arch_builds=builds,
        sources=sources,
    )


def cuda_tag(cuda: str) -> str:
    """'cpu' for CPU entries, 'cu121' for CUDA 12.1."""
    return CPU if cuda == CPU else "cu" + cuda.replace(".", "")


def version_sort_key(text: str) -> Version:
    """Sort key that orders release strings as versions."""
    return _version_key(text)
