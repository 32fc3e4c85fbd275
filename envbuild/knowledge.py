"""Loads the compatibility knowledge base (facts with sources) from matrices/knowledge/."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import yaml
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
from envbuild.resources import matrices_dir

FRAMEWORK_FILES = ("torch", "tensorflow", "jax")


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
        """Check the item's source key; return its id, qualified by the file ("torch:pypi")."""
        key = str(item.get("source", ""))
        if key not in self.sources:
            self.fail(where, f"source {key!r} is not one of sources: {sorted(self.sources)}")
        return f"{self.path.stem}:{key}"

    def qualified_sources(self) -> dict[str, str]:
        return {f"{self.path.stem}:{k}": v for k, v in self.sources.items()}

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
                    requirement=_opt_str(vitem.get("requirement")),
                    index=_opt_str(vitem.get("index")),
                    cudnn_min=_opt_str(vitem.get("cudnn_min")),
                    nccl_min=_opt_str(vitem.get("nccl_min")),
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
            where = f"releases.{release.version}.variants.{variant.cuda}"
            if variant.requirement is not None:
                if variant.index is not None and variant.index not in indexes:
                    check.fail(
                        where, f"index {variant.index!r} is not one of indexes: {sorted(indexes)}"
                    )
            elif variant.cuda != release.pypi_variant and variant.cuda not in indexes:
                check.fail(where, "no wheel index for this variant under indexes:")
    framework = FrameworkKnowledge(
        name=name,
        package=str(data.get("package", name)),
        releases=tuple(releases),
        indexes=indexes,
        sources=check.qualified_sources(),
    )
    return framework, check.problems


def _opt_str(value: Any) -> str | None:
    return None if value is None else str(value)


def _load_cuda(path: Path) -> tuple[dict[str, str], dict[str, str], dict[str, str], _Checker]:
    data = _read(path)
    check = _Checker(path, data)
    families = {}
    family_sources = {}
    for major, raw in check.mapping("families", data.get("families")).items():
        item = check.mapping(f"families.{major}", raw)
        family_sources[str(major)] = check.source(f"families.{major}", item)
        families[str(major)] = str(item.get("min_driver"))
    toolkits = {}
    for minor, raw in check.mapping("toolkits", data.get("toolkits")).items():
        item = check.mapping(f"toolkits.{minor}", raw)
        check.source(f"toolkits.{minor}", item)
        toolkits[str(minor)] = str(item.get("driver"))
    return families, family_sources, toolkits, check


def _load_cudnn(path: Path) -> tuple[dict[str, tuple[tuple[str, str], ...]], _Checker]:
    data = _read(path)
    check = _Checker(path, data)
    result = {}
    for release, raw in check.mapping("releases", data.get("releases")).items():
        where = f"releases.{release}"
        item = check.mapping(where, raw)
        check.source(where, item)
        ranges = tuple((str(r["min"]), str(r["max"])) for r in item.get("cuda") or ())
        result[str(release)] = ranges
    return result, check


def _load_os(path: Path) -> tuple[dict[str, OsBase], _Checker]:
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
    return bases, check


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list) else ()


def _load_gpus(
    path: Path,
) -> tuple[dict[str, Gpu], dict[str, tuple[str, str | None, str]], tuple[ArchBuild, ...], _Checker]:
    data = _read(path)
    check = _Checker(path, data)
    gpus = {}
    for name, raw in check.mapping("gpus", data.get("gpus")).items():
        item = check.mapping(f"gpus.{name}", raw)
        memory = item.get("memory_gb")
        gpus[str(name)] = Gpu(
            name=str(name),
            cc=str(item.get("cc")),
            memory_gb=float(memory) if isinstance(memory, int | float) else None,
            source=check.source(f"gpus.{name}", item),
        )
    targets = {}
    for cc, raw in check.mapping("cuda_targets", data.get("cuda_targets")).items():
        item = check.mapping(f"cuda_targets.{cc}", raw)
        last = item.get("last")
        targets[str(cc)] = (
            str(item.get("first")),
            None if last is None else str(last),
            check.source(f"cuda_targets.{cc}", item),
        )
    builds = []
    for framework, rows in check.mapping("builds", data.get("builds")).items():
        for i, raw in enumerate(rows if isinstance(rows, list) else []):
            where = f"builds.{framework}[{i}]"
            item = check.mapping(where, raw)
            min_cc = item.get("min_cc")
            builds.append(
                ArchBuild(
                    framework=str(framework),
                    versions=_strings(item.get("versions")),
                    cuda=_strings(item.get("cuda")),
                    sm=_strings(item.get("sm")),
                    ptx=bool(item.get("ptx", False)),
                    min_cc=None if min_cc is None else str(min_cc),
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
