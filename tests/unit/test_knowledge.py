"""The knowledge base: loads, holds the sourced facts PyPI and the reference agree on."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from envbuild.core.errors import MatrixError
from envbuild.core.models import CPU, Knowledge
from envbuild.knowledge.load import load_knowledge
from tests.conftest import REPO


def test_every_torch_release_from_2_0_to_2_15_is_known(knowledge: Knowledge) -> None:
    versions = [r.version for r in knowledge.frameworks["torch"].releases]
    assert versions[0] == "2.0.0"
    assert "2.15.0" in versions
    minors = {".".join(v.split(".")[:2]) for v in versions}
    assert minors >= {f"2.{n}" for n in range(16)}
    assert versions == sorted(versions, key=Version)


@pytest.mark.parametrize(
    ("version", "pypi_cuda", "cudnn", "nccl"),
    [
        ("2.0.1", "11.7", "8.5.0.96", "2.14.3"),
        ("2.1.2", "12.1", "8.9.2.26", "2.18.1"),
        ("2.4.1", "12.1", "9.1.0.70", "2.20.5"),
        ("2.6.0", "12.4", "9.1.0.70", "2.21.5"),
        ("2.7.1", "12.6", "9.5.1.17", "2.26.2"),
        ("2.11.0", "13.0", "9.19.0.56", "2.28.9"),  # PyPI's metadata wins over RELEASE.md here
        ("2.14.0", "13.0", "9.24.0.43", "2.30.7"),
    ],
)
def test_pypi_default_wheel_facts(
    knowledge: Knowledge, version: str, pypi_cuda: str, cudnn: str, nccl: str
) -> None:
    release = knowledge.frameworks["torch"].release(version)
    assert release is not None
    assert release.pypi_variant == pypi_cuda
    variant = release.variant(pypi_cuda)
    assert variant is not None
    assert (variant.cudnn, variant.nccl, variant.source) == (cudnn, nccl, "torch:pypi")


def test_every_release_has_a_cpu_variant_and_an_index_for_non_pypi_variants(
    knowledge: Knowledge,
) -> None:
    torch = knowledge.frameworks["torch"]
    for release in torch.releases:
        assert release.variant(CPU) is not None, release.version
        assert release.python, release.version
        for variant in release.variants:
            if variant.cuda != release.pypi_variant:
                assert variant.cuda in torch.indexes, (release.version, variant.cuda)


def test_cuda_driver_floors(knowledge: Knowledge) -> None:
    assert knowledge.cuda_family_driver["12"] == "525.60.13"
    assert knowledge.cuda_family_driver["13"].startswith("580")
    assert knowledge.cuda_toolkit_driver["12.1"] == "530.30.02"


def test_bundled_cudnn_supports_its_cuda_where_the_matrix_is_known(knowledge: Knowledge) -> None:
    checked = 0
    for release in knowledge.frameworks["torch"].releases:
        for variant in release.variants:
            if variant.cudnn is None or variant.cuda == CPU:
                continue
            key = ".".join(variant.cudnn.split(".")[:2])
            ranges = knowledge.cudnn_cuda.get(key)
            if ranges is None:
                continue
            cuda = Version(variant.cuda)
            assert any(Version(lo) <= cuda <= Version(hi) for lo, hi in ranges), (
                release.version,
                variant.cuda,
                variant.cudnn,
            )
            checked += 1
    assert checked > 10


def test_os_bases_give_their_python(knowledge: Knowledge) -> None:
    assert knowledge.os_bases["bookworm"].python == "3.11"
    assert knowledge.os_bases["trixie"].python == "3.13"
    assert knowledge.os_bases["ubuntu22.04"].python_image is None


def test_a_broken_knowledge_file_names_file_and_place(tmp_path: Path) -> None:
    source = REPO / "matrices" / "knowledge"
    for path in source.glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    torch = tmp_path / "torch.yaml"
    torch.write_text(torch.read_text().replace("source: pypi\n", "source: nowhere\n", 1))
    with pytest.raises(MatrixError) as caught:
        load_knowledge(tmp_path)
    assert (
        "torch.yaml: releases.2.0.0: source 'nowhere' is not one of sources" in caught.value.message
    )


def test_tensorflow_2_15_facts(knowledge: Knowledge) -> None:
    tf = knowledge.frameworks["tensorflow"]
    release = tf.release("2.15.1")
    assert release is not None
    assert release.python == ("3.9", "3.10", "3.11")
    variant = release.variant("12.2")
    assert variant is not None
    assert variant.cudnn is not None
    assert variant.cudnn.startswith("8.9.")
    assert variant.requirement == "tensorflow[and-cuda]=={version}"
    cpu = release.variant(CPU)
    assert cpu is not None
    assert cpu.requirement == "tensorflow-cpu=={version}"


def test_tensorflow_before_2_14_has_no_pip_cuda(knowledge: Knowledge) -> None:
    release = knowledge.frameworks["tensorflow"].release("2.13.0")
    assert release is not None
    assert [v.cuda for v in release.variants] == [CPU]


def test_jax_cuda_plugins_and_their_floors(knowledge: Knowledge) -> None:
    jax = knowledge.frameworks["jax"]
    release = jax.release("0.10.0")
    assert release is not None
    assert release.pypi_variant == CPU
    assert {v.cuda for v in release.variants} == {CPU, "12", "13"}
    cuda13 = release.variant("13")
    assert cuda13 is not None
    assert cuda13.requirement == "jax[cuda13]=={version}"
    assert cuda13.cudnn_min is not None
    first = jax.releases[0]
    assert first.version == "0.4.26"
    assert first.variant("13") is None


TF_214_CU118 = '"11.8": {requirement: "tensorflow[and-cuda]=={version}", cudnn: "8.7.0.84",'


@pytest.mark.parametrize(
    ("name", "old", "new", "problem"),
    [
        # a variant's own Pythons must be the release's, and say why and where from
        ("tensorflow.yaml", 'python: ["3.9", "3.10"], python_note', 'python: ["3.9", "3.12"], python_note',
         'variants.11.8.python: 3.12 is not one of the release\'s Pythons'),
        ("tensorflow.yaml", ', python_source: tensorrt-8.5-python', '',
         "releases.2.14.0.variants.11.8: python_source: missing"),
        ("tensorflow.yaml", 'python: ["3.9", "3.10"], python_note: "its and-cuda extra pins tensorrt==8.5.3.1, which has no wheels for Python 3.11 or newer", ',
         'python_note: "x", ', "python_note is used only with python"),
        ("tensorflow.yaml", "python_source: tensorrt-8.5-python", "python_source: tensorrt",
         "python_source 'tensorrt' is not one of sources"),
        ("tensorflow.yaml", 'python: ["3.9", "3.10"], python_note', "python: 3.10, python_note",
         "variants.11.8.python: expected a list"),
        # the variant-list marker names a source, or is false
        ("torch.yaml", "    variants_verified: test-infra\n", "    variants_verified: true\n",
         "releases.2.0.0.variants_verified: name the source"),
        ("torch.yaml", "    variants_verified: test-infra\n", "    variants_verified: nowhere\n",
         "releases.2.0.0: variants_verified 'nowhere' is not one of sources"),
        ("jax.yaml", "variants_verified: pypi ", "variants_verified: pypy ",
         "jax.yaml: top level: variants_verified 'pypy' is not one of sources"),
        # open variants only on a verified list, and never also listed
        ("torch.yaml", '    variants_verified: test-infra\n    unverified_variants: ["12.9"]',
         '    unverified_variants: ["12.9"]', "unverified_variants: only with variants_verified"),
        ("torch.yaml", 'unverified_variants: ["12.9"]', 'unverified_variants: ["12.8"]',
         "unverified_variants: '12.8' is also listed under variants"),
        ("torch.yaml", 'unverified_variants: ["12.9"]', 'unverified_variants: ["twelve"]',
         "unverified_variants[0]: 'twelve' is not 'cpu' or a CUDA version"),
        ("torch.yaml", "    variants_verified: test-infra\n", "    variants_verifed: test-infra\n",
         "unknown key; did you mean 'variants_verified'?"),
    ],
)  # fmt: skip
def test_the_audit_keys_are_checked(
    tmp_path: Path, name: str, old: str, new: str, problem: str
) -> None:
    for path in (REPO / "matrices" / "knowledge").glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    target = tmp_path / name
    text = target.read_text()
    assert old in text, old
    target.write_text(text.replace(old, new, 1))
    with pytest.raises(MatrixError) as caught:
        load_knowledge(tmp_path)
    assert problem in caught.value.message


def test_audit_facts_load_into_the_model(knowledge: Knowledge) -> None:
    tf = knowledge.frameworks["tensorflow"].release("2.14.0")
    assert tf is not None
    variant = tf.variant("11.8")
    assert variant is not None
    assert variant.python == ("3.9", "3.10")
    assert variant.python_source == "tensorflow:tensorrt-8.5-python"
    assert tf.variants_verified == "tensorflow:pypi"
    torch = knowledge.frameworks["torch"]
    verified = {r.version: r.variants_verified for r in torch.releases}
    assert verified["2.15.0"] is None
    assert all(v == "torch:test-infra" for k, v in verified.items() if k != "2.15.0")
    release = torch.release("2.12.1")
    assert release is not None
    assert release.unverified_variants == ("12.9",)
