"""Loads the compatibility knowledge base (facts with sources) from matrices/knowledge/."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

from envbuild.errors import MatrixError
from envbuild.models import CPU, FrameworkKnowledge, Knowledge, OsBase, Release, Variant
from envbuild.resources import matrices_dir

FRAMEWORK_FILES = ("torch",)


def _read(path: Path) -> dict[str, Any]:
    try:
        loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
    except (OSError, yaml.YAMLError) as exc:
        raise MatrixError([f"{path}: cannot read knowledge file: {exc}"]) from exc
    if not isinstance(data, dict):
        raise MatrixError([f"{path}: expected a mapping at the top level"])
    return data


class _Checker:
    """Collects every problem in one knowledge file, with its location."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.problems: list[str] = []
        self.sources: dict[str, str] = {
            str(k): str(v) for k, v in (data.get("sources") or {}).items()
        }

    def fail(self, where: str, what: str) -> None:
        self.problems.append(f"{self.path}: {where}: {what}")

    def source(self, where: str, item: dict[str, Any]) -> str:
        key = str(item.get("source", ""))
        if key not in self.sources:
            self.fail(where, f"source {key!r} is not one of sources: {sorted(self.sources)}")
        return key

    def mapping(self, where: str, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where, "expected a mapping")
            return {}
        return value


def _version_key(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        return Version("0")


def _load_framework(path: Path) -> tuple[FrameworkKnowledge, list[str]]:
    data = _read(path)
    check = _Checker(path, data)
    name = str(data.get("framework", path.stem))
    releases: list[Release] = []
    for version, raw in check.mapping("releases", data.get("releases")).items():
        where = f"releases.{version}"
        item = check.mapping(where, raw)
        variants = []
        for cuda, vraw in check.mapping(f"{where}.variants", item.get("variants")).items():
            vitem = check.mapping(f"{where}.variants.{cuda}", vraw)
            variants.append(
                Variant(
                    cuda=str(cuda),
                    cudnn=_opt_str(vitem.get("cudnn")),
                    nccl=_opt_str(vitem.get("nccl")),
                    source=check.source(f"{where}.variants.{cuda}", vitem),
                )
            )
        pypi_variant = _opt_str(item.get("pypi_variant"))
        if pypi_variant is not None and pypi_variant not in {v.cuda for v in variants}:
            check.fail(where, f"pypi_variant {pypi_variant!r} is not one of its variants")
        releases.append(
            Release(
                framework=name,
                version=str(version),
                released=_opt_str(item.get("released")),
                requires_python=_opt_str(item.get("requires_python")),
                python=tuple(str(p) for p in item.get("python") or ()),
                pypi_variant=pypi_variant,
                variants=tuple(variants),
                source=check.source(where, item),
            )
        )
    releases.sort(key=lambda r: _version_key(r.version))
    indexes = {str(k): str(v) for k, v in (data.get("indexes") or {}).items()}
    for release in releases:
        for variant in release.variants:
            if variant.cuda != release.pypi_variant and variant.cuda not in indexes:
                check.fail(
                    f"releases.{release.version}.variants.{variant.cuda}",
                    "no wheel index for this variant under indexes:",
                )
    framework = FrameworkKnowledge(
        name=name,
        package=str(data.get("package", name)),
        releases=tuple(releases),
        indexes=indexes,
        sources=check.sources,
    )
    return framework, check.problems


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _load_cuda(path: Path) -> tuple[dict[str, str], dict[str, str], list[str]]:
    data = _read(path)
    check = _Checker(path, data)
    families = {}
    for major, raw in check.mapping("families", data.get("families")).items():
        item = check.mapping(f"families.{major}", raw)
        check.source(f"families.{major}", item)
        families[str(major)] = str(item.get("min_driver"))
    toolkits = {}
    for minor, raw in check.mapping("toolkits", data.get("toolkits")).items():
        item = check.mapping(f"toolkits.{minor}", raw)
        check.source(f"toolkits.{minor}", item)
        toolkits[str(minor)] = str(item.get("driver"))
    return families, toolkits, check.problems


def _load_cudnn(path: Path) -> tuple[dict[str, tuple[tuple[str, str], ...]], list[str]]:
    data = _read(path)
    check = _Checker(path, data)
    result = {}
    for release, raw in check.mapping("releases", data.get("releases")).items():
        where = f"releases.{release}"
        item = check.mapping(where, raw)
        check.source(where, item)
        ranges = tuple((str(r["min"]), str(r["max"])) for r in item.get("cuda") or ())
        result[str(release)] = ranges
    return result, check.problems


def _load_os(path: Path) -> tuple[dict[str, OsBase], list[str]]:
    data = _read(path)
    check = _Checker(path, data)
    bases = {}
    for name, raw in check.mapping("bases", data.get("bases")).items():
        where = f"bases.{name}"
        item = check.mapping(where, raw)
        bases[str(name)] = OsBase(
            name=str(name),
            distro=str(item.get("distro")),
            version=str(item.get("version")),
            codename=str(item.get("codename")),
            python=str(item.get("python")),
            image=str(item.get("image")),
            python_image=_opt_str(item.get("python_image")),
            source=check.source(where, item),
        )
    return bases, check.problems


def load_knowledge(directory: Path | None = None) -> Knowledge:
    """Read and check every knowledge file; raise MatrixError listing all problems."""
    return _load_cached(directory or matrices_dir() / "knowledge")


@cache
def _load_cached(directory: Path) -> Knowledge:
    problems: list[str] = []
    frameworks = {}
    for name in FRAMEWORK_FILES:
        framework, found = _load_framework(directory / f"{name}.yaml")
        frameworks[framework.name] = framework
        problems += found
    families, toolkits, found = _load_cuda(directory / "cuda.yaml")
    problems += found
    cudnn, found = _load_cudnn(directory / "cudnn.yaml")
    problems += found
    os_bases, found = _load_os(directory / "os.yaml")
    problems += found
    if problems:
        raise MatrixError(problems)
    return Knowledge(
        frameworks=frameworks,
        cuda_family_driver=families,
        cuda_toolkit_driver=toolkits,
        cudnn_cuda=cudnn,
        os_bases=os_bases,
    )


def cuda_tag(cuda: str) -> str:
    """'cpu' for CPU entries, 'cu121' for CUDA 12.1."""
    return CPU if cuda == CPU else "cu" + cuda.replace(".", "")


def version_sort_key(text: str) -> Version:
    """Sort key that orders release strings as versions."""
    return _version_key(text)
