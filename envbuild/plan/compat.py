"""The compatibility rules: pure functions over the knowledge base and one combination.

Every rule returns a Fact: what was checked, whether it held, and the source it rests on, so
`plan --explain` can show the chain behind each decision.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import urlsplit

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from envbuild.core.models import (
    CPU,
    Combination,
    Entry,
    Fact,
    Fleet,
    Install,
    Knowledge,
    PlatformBuild,
    Release,
)
from envbuild.core.names import expand_repository
from envbuild.core.platforms import AMD64, tag_suffix
from envbuild.core.versions import cuda_tag, version_sort_key

# Re-exported (`as`): the GPU rules live in gpu_compat; callers of compat still find them here.
from envbuild.plan.gpus import SASS_RULE_SOURCE as SASS_RULE_SOURCE
from envbuild.plan.gpus import arch_build as arch_build
from envbuild.plan.gpus import compute_capability as compute_capability
from envbuild.plan.gpus import find_gpu as find_gpu
from envbuild.plan.gpus import gpu_runs

Rule = Callable[[Knowledge, Combination], Fact]


def _release(knowledge: Knowledge, combo: Combination) -> Release | None:
    framework = knowledge.frameworks.get(combo.framework)
    return framework.release(combo.framework_version) if framework else None


def _source(knowledge: Knowledge, source_id: str) -> str:
    return knowledge.sources.get(source_id, source_id)


def _shipped(release: Release) -> str:
    return ", ".join(cuda_tag(v.cuda) for v in release.variants)


def _span(versions: tuple[str, ...]) -> str:
    ordered = sorted(versions, key=version_sort_key)
    return f"{ordered[0]}-{ordered[-1]}" if ordered else "none"


def _what(cuda: str) -> str:
    return "CPU-only" if cuda == CPU else cuda_tag(cuda)


def framework_is_known(knowledge: Knowledge, combo: Combination) -> Fact:
    """The framework must be one the knowledge base describes."""
    known = ", ".join(sorted(knowledge.frameworks))
    if combo.framework in knowledge.frameworks:
        return Fact(
            holds=True,
            text=f"{combo.framework} is described by the knowledge base",
            source="matrices/knowledge",
        )
    return Fact(
        holds=False,
        text=f"unknown framework {combo.framework!r}; known: {known}",
        source="matrices/knowledge",
    )


def release_is_known(knowledge: Knowledge, combo: Combination) -> Fact:
    """The framework version must be a release the knowledge base lists."""
    framework = knowledge.frameworks[combo.framework]
    release = framework.release(combo.framework_version)
    if release is not None:
        when = f" (released {release.released})" if release.released else ""
        return Fact(
            holds=True,
            text=f"{combo.framework} {release.version} is a release{when}",
            source=_source(knowledge, release.source),
        )
    known = [r.version for r in framework.releases]
    return Fact(
        holds=False,
        text=(
            f"{combo.framework} {combo.framework_version} is not a known release "
            f"(known: {known[0]} ... {known[-1]}; `envbuild plan --framework {combo.framework}` lists them)"
        ),
        source="matrices/knowledge",
    )


def variant_is_published(knowledge: Knowledge, combo: Combination) -> Fact:
    """The release must have published wheels for the requested CUDA (or CPU)."""
    release = _release(knowledge, combo)
    assert release is not None  # release_is_known ran first
    variant = release.variant(combo.cuda)
    if variant is None:
        return _missing_variant(knowledge, combo, release)
    where = "PyPI's plain wheel" if variant.cuda == release.pypi_variant else "a published variant"
    bundled = ", ".join(
        f"{name} {value}"
        for name, value in (
            ("cuDNN", variant.cudnn),
            ("NCCL", variant.nccl),
            ("cuDNN >=", variant.cudnn_min),
            ("NCCL >=", variant.nccl_min),
        )
        if value
    )
    return Fact(
        holds=True,
        text=f"{combo.framework} {release.version} {_what(combo.cuda)} is {where}"
        + (f", bundling {bundled}" if bundled else ""),
        source=_source(knowledge, variant.source),
    )


def _missing_variant(knowledge: Knowledge, combo: Combination, release: Release) -> Fact:
    """Why there is no variant: absent from a verified list, or simply not known."""
    name = f"{combo.framework} {combo.framework_version}"
    if release.variants_verified is not None and combo.cuda not in release.unverified_variants:
        return Fact(
            holds=False,
            text=f"{name} publishes no {_what(combo.cuda)} wheels; it ships {_shipped(release)}",
            source=_source(knowledge, release.variants_verified),
        )
    # Only what is known may be said: the variant may exist where nobody has looked.
    framework = knowledge.frameworks[combo.framework]
    index = framework.indexes.get(combo.cuda)
    where = f"{urlsplit(index).hostname} " if index else ""
    return Fact(
        holds=False,
        text=(
            f"{name} has no known {_what(combo.cuda)} wheels: its {where}variants are not "
            f"verified (known: {_shipped(release)})"
        ),
        source=_source(knowledge, release.source),
    )


def python_is_supported(knowledge: Knowledge, combo: Combination) -> Fact:
    """The release, and the variant's own dependencies, must have wheels for the Python."""
    release = _release(knowledge, combo)
    assert release is not None
    source = _source(knowledge, release.source)
    variant = release.variant(combo.cuda)
    if combo.python in release.python and variant is not None and variant.python is not None:
        what = f"{combo.framework} {release.version} {_what(combo.cuda)}"
        variant_source = _source(knowledge, variant.python_source or release.source)
        if combo.python not in variant.python:
            where = (
                f"only on Python {_span(variant.python)}, not {combo.python}"
                if variant.python
                else "on no Python"
            )
            return Fact(
                holds=False,
                text=f"{what} installs {where}: {variant.python_note}",
                source=variant_source,
            )
        return Fact(
            holds=True,
            text=f"{what} installs on Python {_span(variant.python)}: {variant.python_note}",
            source=variant_source,
        )
    if combo.python in release.python:
        return Fact(
            holds=True,
            text=f"{combo.framework} {release.version} publishes wheels for Python {_span(release.python)}",
            source=source,
        )
    return Fact(
        holds=False,
        text=(
            f"{combo.framework} {combo.framework_version} publishes no wheels for Python "
            f"{combo.python}; it supports Python {_span(release.python)}"
        ),
        source=source,
    )


def os_provides_python(knowledge: Knowledge, combo: Combination) -> Fact:
    """The OS must be known, and without a Python image its own python3 must match."""
    base = knowledge.os_bases.get(combo.os)
    if base is None:
        known = ", ".join(sorted(knowledge.os_bases))
        return Fact(
            holds=False,
            text=f"unknown OS {combo.os!r}; known: {known}",
            source="matrices/knowledge/os.yaml",
        )
    source = _source(knowledge, base.source)
    if base.python_image is None and base.python != combo.python:
        return Fact(
            holds=False,
            text=(
                f"{combo.os} provides Python {base.python}, not {combo.python}, and has no "
                f"Python image; use --python {base.python} or a Debian base"
            ),
            source=source,
        )
    how = (
        f"the image {_python_image(base.python_image, combo.python)}"
        if base.python_image
        else f"{combo.os}'s own python3 ({base.python})"
    )
    return Fact(
        holds=True, text=f"Python {combo.python} on {combo.os} comes from {how}", source=source
    )


RULES: tuple[Rule, ...] = (
    framework_is_known,
    release_is_known,
    variant_is_published,
    python_is_supported,
    os_provides_python,
)


def platform_builds(knowledge: Knowledge, combo: Combination) -> list[PlatformBuild]:
    """The rows of platforms.yaml for the combination's platform, framework and release."""
    version = Version(combo.framework_version)
    return [
        row
        for row in knowledge.platform_builds
        if row.platform == combo.platform
        and row.framework == combo.framework
        and SpecifierSet(row.versions).contains(version, prereleases=True)
    ]


def _platform_variant(rows: list[PlatformBuild], cuda: str) -> tuple[PlatformBuild, str] | None:
    for row in rows:
        if cuda in row.variants:
            return row, row.variants[cuda]
    return None


def platform_publishes(knowledge: Knowledge, combo: Combination) -> Fact:
    """Off linux/amd64, the release must publish this variant's wheels for the platform: what
    exists on aarch64 differs (torch up to 2.10 is a CPU build on PyPI; no CUDA TensorFlow)."""
    name = f"{combo.framework} {combo.framework_version}"
    rows = platform_builds(knowledge, combo)
    if not rows:
        return Fact(
            holds=False,
            text=(
                f"{name} is not known to publish wheels for {combo.platform} "
                "(matrices/knowledge/platforms.yaml lists none for that release)"
            ),
            source="matrices/knowledge/platforms.yaml",
        )
    found = _platform_variant(rows, combo.cuda)
    if found is not None:
        row, origin = found
        where = "on PyPI (a plain install)" if origin == "plain" else "where linux/amd64's is"
        return Fact(
            holds=True,
            text=f"{name} publishes a {_what(combo.cuda)} build for {combo.platform} {where}",
            source=_source(knowledge, row.source),
        )
    offered = sorted(
        {v for row in rows for v in row.variants}, key=lambda v: (v != CPU, version_sort_key(v))
    )
    has = ", ".join(_what(v) for v in offered) or "nothing"
    notes = "; ".join(row.note for row in rows if row.note)
    return Fact(
        holds=False,
        text=f"{name} has no {_what(combo.cuda)} build for {combo.platform} (it has {has})"
        + (f": {notes}" if notes else ""),
        source=_source(knowledge, rows[0].source),
    )


def driver_supports(knowledge: Knowledge, cuda: str, driver: str) -> Fact:
    """Whether a host driver runs builds for `cuda` (minor-version compatibility)."""
    if cuda == CPU:
        return Fact(
            holds=True,
            text="a CPU build needs no NVIDIA driver",
            source="matrices/knowledge/cuda.yaml",
        )
    major = cuda.split(".")[0]
    floor = knowledge.cuda_family_driver.get(major)
    if floor is None:
        return Fact(
            holds=False,
            text=f"no driver floor is known for CUDA {major}.x",
            source="matrices/knowledge/cuda.yaml",
        )
    source = _source(knowledge, knowledge.cuda_family_source[major])
    if version_sort_key(driver) >= version_sort_key(floor):
        return Fact(
            holds=True,
            text=f"CUDA {cuda} needs driver >= {floor}; driver {driver} has it",
            source=source,
        )
    return Fact(
        holds=False,
        text=f"CUDA {cuda} needs driver >= {floor} (CUDA {major}.x minor-version compatibility); driver {driver} is older",
        source=source,
    )


def judge(knowledge: Knowledge, combo: Combination, fleet: Fleet | None = None) -> tuple[Fact, ...]:
    """The facts checked for a combination; it is buildable when the last one holds."""
    facts: list[Fact] = []
    for rule in RULES:
        fact = rule(knowledge, combo)
        facts.append(fact)
        if not fact.holds:
            return tuple(facts)
    if combo.platform != AMD64:  # what the releases above publish is for linux/amd64
        facts.append(platform_publishes(knowledge, combo))
        if not facts[-1].holds:
            return tuple(facts)
    if fleet is not None:
        if fleet.driver is not None:
            facts.append(driver_supports(knowledge, combo.cuda, fleet.driver))
            if not facts[-1].holds:
                return tuple(facts)
        for gpu in fleet.gpus:
            facts.append(gpu_runs(knowledge, combo, gpu))
            if not facts[-1].holds:
                return tuple(facts)
    return tuple(facts)


def image_tag(combo: Combination) -> str:
    """The tag an entry's image gets: 2.13.0-cpu-py3.11-bookworm (-arm64 for linux/arm64)."""
    tag = f"{combo.framework_version}-{cuda_tag(combo.cuda)}-py{combo.python}-{combo.os}"
    return tag + tag_suffix(combo.platform)


def entry_id(combo: Combination) -> str:
    """The id of the entry a combination becomes: torch2.13.0-cpu-py3.11-bookworm."""
    return f"{combo.framework}{image_tag(combo)}"


def resolve_entry(
    knowledge: Knowledge, combo: Combination, *, repository: str, facts: tuple[Fact, ...] = ()
) -> Entry:
    """Turn an accepted combination into an Entry: versions, base image, install source, tag."""
    framework = knowledge.frameworks[combo.framework]
    release = framework.release(combo.framework_version)
    assert release is not None  # judged before
    variant = release.variant(combo.cuda)
    assert variant is not None
    base = knowledge.os_bases[combo.os]
    tag = image_tag(combo)
    there = None
    if combo.platform != AMD64:  # amd64's install is the framework file's
        there = _platform_variant(platform_builds(knowledge, combo), combo.cuda)
    if there is not None and there[1] == "plain":
        # What a plain install gets there (torch 2.10 on aarch64: the CPU build, no +cpu).
        install = Install(requirement=f"{framework.package}=={release.version}", index_url=None)
    elif variant.requirement is not None:
        install = Install(
            requirement=variant.requirement.replace("{version}", release.version),
            index_url=framework.indexes[variant.index] if variant.index else None,
        )
    elif variant.cuda == release.pypi_variant:
        install = Install(requirement=f"{framework.package}=={release.version}", index_url=None)
    else:
        # The framework's own index labels non-default builds with a local version (+cpu, +cu118).
        install = Install(
            requirement=f"{framework.package}=={release.version}+{cuda_tag(combo.cuda)}",
            index_url=framework.indexes[variant.cuda],
        )
    base_image = _python_image(base.python_image, combo.python) if base.python_image else base.image
    return Entry(
        id=entry_id(combo),
        framework=combo.framework,
        framework_version=combo.framework_version,
        cuda=combo.cuda,
        # The pins read from linux/amd64 wheels: another platform's may differ, so none is claimed.
        cudnn=variant.cudnn if combo.platform == AMD64 else None,
        nccl=variant.nccl if combo.platform == AMD64 else None,
        python=combo.python,
        os=combo.os,
        base_image=base_image,
        image=f"{expand_repository(repository, combo.framework)}:{tag}",
        install=install,
        facts=facts,
        platform=combo.platform,
    )


def _python_image(template: str, python: str) -> str:
    # Plain replacement: str.format would also evaluate {python.__class__} or {0:>99999999}.
    return template.replace("{python}", python)


_CUDA_TAG = re.compile(r"[Cc][Uu]([1-9][0-9]?)([0-9])?")
_CUDA_VERSION = re.compile(r"([1-9][0-9]?)(?:\.([0-9]))?")


def cuda_selector(text: str) -> str | None:
    """What a --cuda value selects: 'cpu', a major ('12') or 'X.Y'; None when it is none of these.

    Wheel tags are read as cuda_tag writes them: cu121 is 12.1, cu118 11.8, cu130 13.0, and a
    two-digit cu12 the major 12.
    """
    if text.lower() == CPU:
        return CPU
    match = _CUDA_TAG.fullmatch(text) or _CUDA_VERSION.fullmatch(text)
    if match is None:
        return None
    major, minor = match.groups()
    return f"{major}.{minor}" if minor is not None else major
