"""The compatibility rules: pure functions over the knowledge base and one combination."""

from __future__ import annotations

from collections.abc import Callable

from envbuild.knowledge import cuda_tag, version_sort_key
from envbuild.models import CPU, Combination, Entry, Install, Knowledge, Release

Rule = Callable[[Knowledge, Combination], str | None]


def _release(knowledge: Knowledge, combo: Combination) -> Release | None:
    framework = knowledge.frameworks.get(combo.framework)
    return framework.release(combo.framework_version) if framework else None


def _shipped(release: Release) -> str:
    return ", ".join(cuda_tag(v.cuda) for v in release.variants)


def _span(versions: tuple[str, ...]) -> str:
    ordered = sorted(versions, key=version_sort_key)
    return f"{ordered[0]}-{ordered[-1]}" if ordered else "none"


def framework_is_known(knowledge: Knowledge, combo: Combination) -> str | None:
    """The framework must be one the knowledge base describes."""
    if combo.framework in knowledge.frameworks:
        return None
    return (
        f"unknown framework {combo.framework!r}; known: {', '.join(sorted(knowledge.frameworks))}"
    )


def release_is_known(knowledge: Knowledge, combo: Combination) -> str | None:
    """The framework version must be a release the knowledge base lists."""
    framework = knowledge.frameworks.get(combo.framework)
    if framework is None or framework.release(combo.framework_version):
        return None
    known = [r.version for r in framework.releases]
    return (
        f"{combo.framework} {combo.framework_version} is not a known release "
        f"(known: {known[0]} … {known[-1]}; `envbuild plan --framework {combo.framework}` lists them)"
    )


def variant_is_published(knowledge: Knowledge, combo: Combination) -> str | None:
    """The release must have published wheels for the requested CUDA (or CPU)."""
    release = _release(knowledge, combo)
    if release is None or release.variant(combo.cuda):
        return None
    what = "CPU-only" if combo.cuda == CPU else cuda_tag(combo.cuda)
    return (
        f"{combo.framework} {combo.framework_version} publishes no {what} wheels; "
        f"it ships {_shipped(release)}"
    )


def python_is_supported(knowledge: Knowledge, combo: Combination) -> str | None:
    """The release must publish wheels for the requested Python."""
    release = _release(knowledge, combo)
    if release is None or combo.python in release.python:
        return None
    return (
        f"{combo.framework} {combo.framework_version} publishes no wheels for Python "
        f"{combo.python}; it supports Python {_span(release.python)}"
    )


def os_provides_python(knowledge: Knowledge, combo: Combination) -> str | None:
    """The OS must be known, and without a Python image its own python3 must match."""
    base = knowledge.os_bases.get(combo.os)
    if base is None:
        return f"unknown OS {combo.os!r}; known: {', '.join(sorted(knowledge.os_bases))}"
    if base.python_image is None and base.python != combo.python:
        return (
            f"{combo.os} provides Python {base.python}, not {combo.python}, and has no "
            f"Python image; use --python {base.python} or a Debian base"
        )
    return None


RULES: tuple[Rule, ...] = (
    framework_is_known,
    release_is_known,
    variant_is_published,
    python_is_supported,
    os_provides_python,
)


def judge(knowledge: Knowledge, combo: Combination) -> str | None:
    """The reason the first failing rule gives, or None when the combination is buildable."""
    for rule in RULES:
        reason = rule(knowledge, combo)
        if reason:
            return reason
    return None


def driver_supports(knowledge: Knowledge, cuda: str, driver: str) -> str | None:
    """None if a host driver runs builds for `cuda` (minor-version compatibility), else why not."""
    if cuda == CPU:
        return None
    major = cuda.split(".")[0]
    floor = knowledge.cuda_family_driver.get(major)
    if floor is None:
        return f"no driver floor is known for CUDA {major}.x"
    if version_sort_key(driver) >= version_sort_key(floor):
        return None
    return f"CUDA {cuda} needs driver >= {floor} (CUDA {major}.x minor-version compatibility); driver {driver} is older"


def resolve_entry(knowledge: Knowledge, combo: Combination, *, repository: str) -> Entry:
    """Turn an accepted combination into an Entry: versions, base image, install source, tag."""
    framework = knowledge.frameworks[combo.framework]
    release = framework.release(combo.framework_version)
    assert release is not None  # judged before
    variant = release.variant(combo.cuda)
    assert variant is not None
    base = knowledge.os_bases[combo.os]
    tag = f"{combo.framework_version}-{cuda_tag(combo.cuda)}-py{combo.python}-{combo.os}"
    if variant.cuda == release.pypi_variant:
        install = Install(requirement=f"{framework.package}=={release.version}", index_url=None)
    else:
        # The framework's own index labels non-default builds with a local version (+cpu, +cu118).
        install = Install(
            requirement=f"{framework.package}=={release.version}+{cuda_tag(combo.cuda)}",
            index_url=framework.indexes[variant.cuda],
        )
    base_image = base.python_image.format(python=combo.python) if base.python_image else base.image
    return Entry(
        id=f"{combo.framework}{tag}",
        framework=combo.framework,
        framework_version=combo.framework_version,
        cuda=combo.cuda,
        cudnn=variant.cudnn,
        nccl=variant.nccl,
        python=combo.python,
        os=combo.os,
        base_image=base_image,
        image=f"{repository.format(framework=combo.framework)}:{tag}",
        install=install,
    )
