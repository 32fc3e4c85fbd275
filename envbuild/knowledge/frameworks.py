"""The framework files of the knowledge base (torch.yaml, ...): releases, variants, indexes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from envbuild.core.models import FrameworkKnowledge, Release, Variant
from envbuild.core.names import shown
from envbuild.core.versions import is_version, version_sort_key
from envbuild.core.yamlfile import yaml_kind
from envbuild.knowledge.schema import PYTHON, VARIANT_NAME, Checker, read_knowledge_file, suggest

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


def load_framework(path: Path) -> tuple[FrameworkKnowledge, list[str]]:
    """One framework file, checked; with the notes of what it could not vouch for."""
    data = read_knowledge_file(path)
    check = Checker(path, data, FRAMEWORK_KEYS)
    name = _framework_name(check, path, data)
    indexes = _indexes(check, data)
    verified_default = _variants_verified(check, "", data)
    releases: list[Release] = []
    raw_releases = check.table("", data, "releases")
    for version, raw in raw_releases.items():
        release = _load_release(check, name, version, raw, indexes, verified_default)
        if release is not None:
            releases.append(release)
    if "releases" in data and not raw_releases and not check.problems:
        check.fail("releases", "empty; list at least one release")
    releases.sort(key=lambda r: version_sort_key(r.version))
    _check_wheel_indexes(check, releases, indexes)
    framework = FrameworkKnowledge(
        name=name,
        package=check.text("", data, "package") or name,
        releases=tuple(releases),
        indexes=indexes,
        sources=check.qualified_sources(),
    )
    return framework, check.problems


def _framework_name(check: Checker, path: Path, data: dict[Any, Any]) -> str:
    """`framework`: the file's stem, which the key may only repeat."""
    name = check.text("", data, "framework") or path.stem
    if name != path.stem:
        check.fail("framework", f"{shown(name)} differs from the file name; use {path.stem!r}")
        name = path.stem
    return name


def _indexes(check: Checker, data: dict[Any, Any]) -> dict[str, str]:
    """`indexes`: the wheel index URL of each variant installed from an index."""
    indexes = {}
    for key, url in check.table(
        "", data, "indexes", names=VARIANT_NAME, hint=_CUDA_VARIANT_HINT, required=False
    ).items():
        if isinstance(url, str):
            indexes[key] = url
        else:
            check.fail(f"indexes.{key}", f"expected a URL string, got {yaml_kind(url)}")
    return indexes


def _load_release(
    check: Checker,
    name: str,
    version: str,
    raw: Any,
    indexes: dict[str, str],
    verified_default: str | None,
) -> Release | None:
    """One entry of `releases`; None when its key or value is no release at all."""
    where = f"releases.{version}"
    if not is_version(version):
        check.fail("releases", f"key {shown(version)} is not a release version (e.g. '2.4.1')")
        return None
    item = check.mapping(where, raw, RELEASE_KEYS)
    if not item:
        return None
    python = check.texts(
        where,
        item,
        "python",
        required=True,
        pattern=PYTHON,
        hint="a Python version such as '3.11'",
    )
    variants = _load_variants(check, where, item, indexes, python)
    verified = (
        _variants_verified(check, where, item) if "variants_verified" in item else verified_default
    )
    unverified = _unverified_variants(check, where, item, variants, verified)
    if "tested" in item:
        _check_tested(check, where, item["tested"])
    pypi_variant = check.text(where, item, "pypi_variant")
    if pypi_variant is not None and pypi_variant not in {v.cuda for v in variants}:
        check.fail(where, f"pypi_variant {shown(pypi_variant)} is not one of its variants")
    return Release(
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


def _check_tested(check: Checker, where: str, raw: Any) -> None:
    """A release's `tested`: the CUDA, cuDNN and Python it was tested with, and the source."""
    tested = check.mapping(f"{where}.tested", raw, TESTED_KEYS)
    for key in ("cuda", "cudnn", "python"):
        check.text(f"{where}.tested", tested, key)
    if tested:
        check.source(f"{where}.tested", tested)


def _check_wheel_indexes(check: Checker, releases: list[Release], indexes: dict[str, str]) -> None:
    """Report each variant that names no way to its wheels: no requirement, PyPI or index."""
    for release in releases:
        for variant in release.variants:
            where = f"releases.{release.version}.variants.{variant.cuda}"
            if (
                variant.requirement is None
                and variant.cuda != release.pypi_variant
                and variant.cuda not in indexes
            ):
                check.fail(where, "no wheel index for this variant under indexes:")


def _variants_verified(check: Checker, where: str, item: dict[str, Any]) -> str | None:
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
    check: Checker,
    where: str,
    item: dict[str, Any],
    variants: tuple[Variant, ...],
    verified: str | None,
) -> tuple[str, ...]:
    """`unverified_variants`: CUDA versions whose publication a verified list leaves open."""
    listed = check.texts(
        where, item, "unverified_variants", pattern=VARIANT_NAME, hint=_CUDA_VARIANT_HINT
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
    check: Checker, place: str, vitem: dict[str, Any], release_python: tuple[str, ...]
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
        pattern=PYTHON,
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
    check: Checker,
    where: str,
    item: dict[str, Any],
    indexes: dict[str, str],
    release_python: tuple[str, ...] = (),
) -> tuple[Variant, ...]:
    variants = []
    for cuda, raw in check.table(
        where, item, "variants", names=VARIANT_NAME, hint=_CUDA_VARIANT_HINT
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
                + suggest(index, sorted(indexes)),
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
