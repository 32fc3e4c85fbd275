"""Loads the compatibility knowledge base (facts with sources) from matrices/knowledge/.

Files are read by envbuild.core.yamlfile; every key is checked (knowledge_schema.Checker), unknown
ones included; the framework files by knowledge_frameworks.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from functools import cache
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from envbuild.core.errors import MatrixError
from envbuild.core.models import ArchBuild, Gpu, Knowledge, OsBase, PlatformBuild
from envbuild.core.names import shown
from envbuild.core.platforms import AMD64, PLATFORMS
from envbuild.core.resources import matrices_dir
from envbuild.core.yamlfile import yaml_kind
from envbuild.knowledge.frameworks import load_framework
from envbuild.knowledge.schema import (
    CC,
    CUDA_KEY,
    CUDA_MAJOR,
    CUDA_MINOR,
    DRIVER,
    NAME,
    PYTHON,
    SERIES,
    VARIANT_NAME,
    Checker,
    read_knowledge_file,
)

FRAMEWORK_FILES = ("torch", "tensorflow", "jax")


def _load_cuda(path: Path) -> tuple[dict[str, str], dict[str, str], dict[str, str], Checker]:
    data = read_knowledge_file(path)
    check = Checker(path, data, ("sources", "families", "toolkits"))
    families = {}
    family_sources = {}
    for major, raw in check.table(
        "", data, "families", names=CUDA_MAJOR, hint="a CUDA major version such as '12'"
    ).items():
        where = f"families.{major}"
        item = check.mapping(where, raw, ("min_driver", "source"))
        driver = check.text(
            where, item, "min_driver", required=True, pattern=DRIVER, hint="a driver version"
        )
        family_sources[major] = check.source(where, item)
        if driver is not None:
            families[major] = driver
    toolkits = {}
    for minor, raw in check.table(
        "", data, "toolkits", names=CUDA_MINOR, hint="a CUDA version such as '12.1'"
    ).items():
        where = f"toolkits.{minor}"
        item = check.mapping(where, raw, ("driver", "source"))
        driver = check.text(
            where, item, "driver", required=True, pattern=DRIVER, hint="a driver version"
        )
        check.source(where, item)
        if driver is not None:
            toolkits[minor] = driver
    return families, family_sources, toolkits, check


def _load_cudnn(path: Path) -> tuple[dict[str, tuple[tuple[str, str], ...]], Checker]:
    data = read_knowledge_file(path)
    check = Checker(path, data, ("sources", "releases"))
    result = {}
    for release, raw in check.table(
        "", data, "releases", names=CUDA_MINOR, hint="a cuDNN version such as '9.1'"
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
                    place, bounds, key, required=True, pattern=CUDA_MINOR, hint="a CUDA version"
                )
                for key in ("min", "max")
            )
            if low is not None and high is not None:
                ranges.append((low, high))
        result[release] = tuple(ranges)
    return result, check


OS_KEYS = (
    "distro", "version", "codename", "python", "image", "python_image", "source", "glibc",
    "glibc_source",
)  # fmt: skip
GLIBC = re.compile(r"2\.[0-9]{1,3}")


def _load_os(path: Path) -> tuple[dict[str, OsBase], Checker]:
    data = read_knowledge_file(path)
    check = Checker(path, data, ("sources", "bases"))
    bases = {}
    for name, raw in check.table(
        "", data, "bases", names=NAME, hint="an OS name such as 'bookworm'"
    ).items():
        where = f"bases.{name}"
        item = check.mapping(where, raw, OS_KEYS)
        fields = {
            key: check.text(where, item, key, required=True)
            for key in ("distro", "version", "codename", "image")
        }
        python = check.text(
            where, item, "python", required=True, pattern=PYTHON, hint="a Python version"
        )
        python_image = check.template(where, item, "python_image", "{python}")
        source = check.source(where, item)
        glibc = check.text(where, item, "glibc", pattern=GLIBC, hint="a glibc version (2.36)")
        if glibc is not None:
            check.source(where, item, "glibc_source")
        if python is None or any(value is None for value in fields.values()):
            continue
        bases[name] = OsBase(
            name=name,
            version=str(fields["version"]),
            codename=str(fields["codename"]),
            python=python,
            image=str(fields["image"]),
            python_image=python_image,
            source=source,
            glibc=glibc,
        )
    return bases, check


GPU_KEYS = ("cc", "arch", "memory_gb", "source")
BUILD_KEYS = ("versions", "cuda", "sm", "ptx", "min_cc", "source", "platform")


def _load_gpus(
    path: Path,
) -> tuple[dict[str, Gpu], dict[str, tuple[str, str | None, str]], tuple[ArchBuild, ...], Checker]:
    data = read_knowledge_file(path)
    check = Checker(path, data, ("sources", "gpus", "cuda_targets", "builds"))
    gpus = {}
    for name, raw in check.table("", data, "gpus", names=NAME, hint="a GPU name").items():
        where = f"gpus.{name}"
        item = check.mapping(where, raw, GPU_KEYS)
        cc = check.text(where, item, "cc", required=True, pattern=CC, hint="a compute capability")
        check.text(where, item, "arch")
        memory = item.get("memory_gb")
        if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int | float)):
            check.fail(f"{where}.memory_gb", f"expected a number, got {yaml_kind(memory)}")
        source = check.source(where, item)
        if cc is not None:
            gpus[name] = Gpu(name=name, cc=cc, source=source)
    targets = {}
    for cc, raw in check.table(
        "", data, "cuda_targets", names=CC, hint="a compute capability such as '9.0'"
    ).items():
        where = f"cuda_targets.{cc}"
        item = check.mapping(where, raw, ("first", "last", "source"))
        first = check.text(
            where, item, "first", required=True, pattern=CUDA_KEY, hint="a CUDA version"
        )
        last = check.text(where, item, "last", pattern=CUDA_KEY, hint="a CUDA version")
        source = check.source(where, item)
        if first is not None:
            targets[cc] = (first, last, source)
    builds = []
    for framework, rows in check.table("", data, "builds", names=NAME, hint="a framework").items():
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
                        pattern=SERIES,
                        hint="a series or '*'",
                    ),
                    cuda=check.texts(
                        where,
                        item,
                        "cuda",
                        required=True,
                        pattern=re.compile(rf"\*|{CUDA_KEY.pattern}"),
                        hint=cuda_hint,
                    ),
                    sm=check.texts(where, item, "sm", pattern=CC, hint="a compute capability"),
                    ptx=ptx,
                    min_cc=check.text(
                        where, item, "min_cc", pattern=CC, hint="a compute capability"
                    ),
                    source=check.source(where, item),
                    platform=_platform(check, where, item),
                )
            )
    return gpus, targets, tuple(builds), check


def _platform(check: Checker, where: str, item: dict[str, Any]) -> str:
    """A row's `platform`: one of PLATFORMS as envbuild writes them; linux/amd64 when absent."""
    value = check.text(where, item, "platform")
    if value is not None and value not in PLATFORMS:
        check.fail(f"{where}.platform", f"{shown(value)} is not one of {', '.join(PLATFORMS)}")
    return value if value in PLATFORMS else AMD64


PLATFORM_KEYS = ("versions", "variants", "note", "source")
# plain: `<package>==<version>` from PyPI, what a plain install gets on that platform;
# variant: the variant's own requirement and index, as on linux/amd64.
WHERE_FROM = ("plain", "variant")


def _load_platforms(
    path: Path, frameworks: Collection[str]
) -> tuple[tuple[PlatformBuild, ...], Checker]:
    """platforms.yaml: for each platform beside linux/amd64, what each framework publishes."""
    data = read_knowledge_file(path)
    check = Checker(path, data, ("sources", "platforms"))
    rows = []
    others = tuple(p for p in PLATFORMS if p != AMD64)
    tables = check.table("", data, "platforms")
    check.keys("platforms", tables, others)  # amd64's facts are in the framework files
    for platform, table in tables.items():
        if platform not in others:
            continue
        table = check.mapping(f"platforms.{platform}", table, tuple(frameworks))
        for framework, listed in table.items():
            if not isinstance(listed, list):
                check.fail(
                    f"platforms.{platform}.{framework}", f"expected a list, got {yaml_kind(listed)}"
                )
                continue
            for i, raw in enumerate(listed):
                where = f"platforms.{platform}.{framework}[{i}]"
                row = _platform_row(check, where, raw, platform, framework)
                if row is not None:
                    rows.append(row)
    return tuple(rows), check


def _platform_row(
    check: Checker, where: str, raw: Any, platform: str, framework: str
) -> PlatformBuild | None:
    """One row of platforms.yaml, its problems reported; None without usable versions."""
    item = check.mapping(where, raw, PLATFORM_KEYS)
    versions = check.text(where, item, "versions", required=True)
    if versions is not None:
        try:
            SpecifierSet(versions)
        except InvalidSpecifier:
            check.fail(
                f"{where}.versions", f"{shown(versions)} is not a version specifier (e.g. '>=2.11')"
            )
            versions = None
    listed = item.get("variants")
    if listed is not None and not isinstance(listed, dict):
        check.fail(
            f"{where}.variants",
            f"expected a mapping of variant: plain or variant, got {yaml_kind(listed)}",
        )
    variants = {}
    for name, origin in listed.items() if isinstance(listed, dict) else ():
        if not isinstance(name, str) or not VARIANT_NAME.fullmatch(name):
            check.fail(
                f"{where}.variants", f"{shown(str(name))} is not a variant (cpu or a CUDA version)"
            )
        elif origin not in WHERE_FROM:
            check.fail(
                f"{where}.variants.{name}",
                f"expected {' or '.join(WHERE_FROM)}, got {shown(str(origin))}",
            )
        else:
            variants[name] = origin
    note = check.text(where, item, "note")
    source = check.source(where, item)
    if versions is None:
        return None
    return PlatformBuild(
        platform=platform, framework=framework, versions=versions, variants=variants,
        note=note, source=source,
    )  # fmt: skip


def load_knowledge(directory: Path | None = None) -> Knowledge:
    """Read and check every knowledge file; raise MatrixError listing all problems."""
    return _load_cached(directory or matrices_dir() / "knowledge")


@cache
def _load_cached(directory: Path) -> Knowledge:
    problems: list[str] = []
    sources: dict[str, str] = {}
    frameworks = {}
    for name in FRAMEWORK_FILES:
        framework, found = load_framework(directory / f"{name}.yaml")
        frameworks[framework.name] = framework
        problems += found
        sources.update(framework.sources)
    families, family_sources, toolkits, cuda_check = _load_cuda(directory / "cuda.yaml")
    cudnn, cudnn_check = _load_cudnn(directory / "cudnn.yaml")
    os_bases, os_check = _load_os(directory / "os.yaml")
    gpus, targets, builds, gpu_check = _load_gpus(directory / "gpus.yaml")
    platform_builds, platform_check = _load_platforms(directory / "platforms.yaml", frameworks)
    for check in (cuda_check, cudnn_check, os_check, gpu_check, platform_check):
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
        platform_builds=platform_builds,
    )
