"""The SBOM published with an image: the lock's distributions with their hashes and dpkg's
packages, as a CycloneDX document the library writes and `verify` summarises."""

from __future__ import annotations

import json

import pytest

from envbuild.publish.sbom import dpkg_packages, lock_packages, sbom_document, summary

LOCK = """\
# envbuild 0.1 lock of torch2.13.0-cpu-py3.11-bookworm; written by `envbuild lock`, do not edit
# inputs: sha256:abc
numpy==2.4.6 \\
    --hash=sha256:{a} \\
    --hash=sha256:{b}
    # via -r -
torch==2.13.0+cpu \\
    --hash=sha256:{c}
    # via -r -
""".format(a="a" * 64, b="b" * 64, c="c" * 64)
LISTING = "# pip freeze\nnumpy==2.4.6\n# dpkg\nbash 5.2.15-2+b7\nlibc6:amd64 2.36-9+deb12u9\n\n"


def test_the_lock_gives_every_pin_with_its_hashes() -> None:
    found = lock_packages(LOCK)
    assert [(p.name, p.version, len(p.sha256)) for p in found] == [
        ("numpy", "2.4.6", 2), ("torch", "2.13.0+cpu", 1),
    ]  # fmt: skip


def test_dpkg_lines_after_the_marker_are_os_packages() -> None:
    assert [(p.name, p.version) for p in dpkg_packages(LISTING)] == [
        ("bash", "5.2.15-2+b7"), ("libc6", "2.36-9+deb12u9"),
    ]  # fmt: skip
    assert dpkg_packages("# pip freeze\nnumpy==1\n") == []


def test_the_document_is_cyclonedx_with_purls_and_hashes() -> None:
    packages = [*lock_packages(LOCK), *dpkg_packages(LISTING)]
    document = sbom_document("registry.example/ml/torch:1", "sha256:" + "d" * 64, packages)
    data = json.loads(document)
    assert data["bomFormat"] == "CycloneDX"
    assert data["specVersion"] == "1.6"
    purls = {c["purl"]: c for c in data["components"]}
    assert set(purls) == {
        "pkg:pypi/numpy@2.4.6", "pkg:pypi/torch@2.13.0%2Bcpu",
        "pkg:deb/debian/bash@5.2.15-2%2Bb7", "pkg:deb/debian/libc6@2.36-9%2Bdeb12u9",
    }  # fmt: skip
    assert [h["content"] for h in purls["pkg:pypi/numpy@2.4.6"]["hashes"]] == ["a" * 64, "b" * 64]
    assert data["metadata"]["component"]["type"] == "container"
    assert summary(document) == {"format": "CycloneDX 1.6", "pypi": 2, "deb": 2}


@pytest.mark.parametrize("document", [b"", b"[]", b"{", b'{"components": 3}', b"\xff"])
def test_a_hostile_sbom_is_summarised_without_a_traceback(document: bytes) -> None:
    shown = summary(document)
    assert (shown["pypi"], shown["deb"]) == (0, 0)
