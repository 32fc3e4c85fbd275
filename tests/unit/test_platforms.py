"""The platform axis: linux/amd64 and linux/arm64 in matrices, selectors, ids, plans and locks.

What exists on aarch64 comes from matrices/knowledge/platforms.yaml; these tests read the real
knowledge base and the real matrix reader.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from envbuild.cli.main import main
from envbuild.core.errors import MatrixError
from envbuild.core.models import Combination, Fleet, Knowledge, Selection
from envbuild.core.platforms import AMD64, ARM64, host_platform, platform_of, tag_suffix
from envbuild.knowledge.load import load_knowledge
from envbuild.lock.uv import platform_tag
from envbuild.plan.compat import judge
from envbuild.plan.matrix import knowledge_matrix, make_plan
from envbuild.plan.matrix_file import default_matrix_path, load_matrix

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("linux/amd64", AMD64), ("amd64", AMD64), ("x86_64", AMD64), ("AMD64", AMD64),
        ("linux/arm64", ARM64), ("linux/arm64/v8", ARM64), ("arm64", ARM64), ("aarch64", ARM64),
        (" arm64 ", ARM64), ("linux/arm/v7", None), ("windows/amd64", None), ("", None),
        ("arm64\n", ARM64), ("linux/amd64,linux/arm64", None),
    ],
)  # fmt: skip
def test_each_spelling_names_one_platform_or_none(text: str, named: str | None) -> None:
    assert platform_of(text) == named


def test_only_arm64_changes_ids_and_tags() -> None:
    assert tag_suffix(AMD64) == ""
    assert tag_suffix(ARM64) == "-arm64"
    assert host_platform() in (AMD64, ARM64)


def plan_for(knowledge: Knowledge, **selectors: str) -> tuple[dict[str, object], list[str]]:
    """The entries (id -> entry) and exclusion reasons of the knowledge base's matrix."""
    selection = Selection(**selectors)
    defaults = load_matrix(default_matrix_path(), knowledge)
    matrix = knowledge_matrix(knowledge, selection, defaults)
    plan = make_plan(knowledge, matrix, selection)
    return {e.id: e for e in plan.entries}, [x.reason for x in plan.excluded]


def test_torch_up_to_2_10_on_arm64_is_pypis_cpu_build(knowledge: Knowledge) -> None:
    entries, _ = plan_for(
        knowledge, framework="torch", framework_version="2.10.0", cuda="cpu", platform=ARM64
    )
    entry = entries["torch2.10.0-cpu-py3.11-bookworm-arm64"]
    assert entry.platform == ARM64  # type: ignore[attr-defined]
    assert entry.image == "envbuild/torch:2.10.0-cpu-py3.11-bookworm-arm64"  # type: ignore[attr-defined]
    # A plain install from PyPI: on aarch64 it is the CPU build (no +cpu, no CPU index).
    assert entry.install.requirement == "torch==2.10.0"  # type: ignore[attr-defined]
    assert entry.install.index_url is None  # type: ignore[attr-defined]


def test_the_same_selection_on_amd64_keeps_the_ids_envbuild_always_gave(
    knowledge: Knowledge,
) -> None:
    entries, _ = plan_for(
        knowledge, framework="torch", framework_version="2.10.0", cuda="cpu", platform=AMD64
    )
    entry = entries["torch2.10.0-cpu-py3.11-bookworm"]
    assert entry.install.requirement == "torch==2.10.0+cpu"  # type: ignore[attr-defined]
    assert entry.install.index_url == "https://download.pytorch.org/whl/cpu"  # type: ignore[attr-defined]


def test_torch_2_11_cuda_13_on_arm64_is_pypis_plain_wheel_and_its_cpu_build_the_cpu_index(
    knowledge: Knowledge,
) -> None:
    entries, _ = plan_for(knowledge, framework="torch", framework_version="2.11.0", platform=ARM64)
    cuda = entries["torch2.11.0-cu130-py3.11-bookworm-arm64"]
    assert (cuda.install.requirement, cuda.install.index_url) == ("torch==2.11.0", None)  # type: ignore[attr-defined]
    # The pins were read from linux/amd64 wheels: none is claimed for aarch64.
    assert (cuda.cudnn, cuda.nccl) == (None, None)  # type: ignore[attr-defined]
    cpu = entries["torch2.11.0-cpu-py3.11-bookworm-arm64"]
    assert cpu.install.requirement == "torch==2.11.0+cpu"  # type: ignore[attr-defined]
    assert cpu.install.index_url == "https://download.pytorch.org/whl/cpu"  # type: ignore[attr-defined]


def test_an_old_cuda_torch_on_arm64_is_excluded_with_the_reason(knowledge: Knowledge) -> None:
    entries, reasons = plan_for(
        knowledge, framework="torch", framework_version="2.4.1", cuda="12.1", platform=ARM64
    )
    assert entries == {}
    (reason,) = reasons
    assert reason.startswith("torch 2.4.1 has no cu121 build for linux/arm64 (it has CPU-only): ")
    assert "PyPI's torch up to 2.10 is a CPU build on aarch64" in reason


def test_tensorflow_with_cuda_on_arm64_is_excluded_with_the_reason(knowledge: Knowledge) -> None:
    combo = Combination(
        framework="tensorflow", framework_version="2.20.0", cuda="12", python="3.11",
        os="bookworm", platform=ARM64,
    )  # fmt: skip
    facts = judge(knowledge, combo)
    assert not facts[-1].holds
    assert "no CUDA TensorFlow for aarch64 on PyPI" in facts[-1].text
    assert "#121157" in facts[-1].source
    cpu = judge(knowledge, Combination(**{**combo.as_dict(), "cuda": "cpu"}))
    assert cpu[-1].holds
    assert cpu[-1].text == (
        "tensorflow 2.20.0 publishes a CPU-only build for linux/arm64 on PyPI (a plain install)"
    )


def test_every_platform_fact_names_its_source(knowledge: Knowledge) -> None:
    assert knowledge.platform_builds
    for row in knowledge.platform_builds:
        assert row.platform == ARM64
        assert row.variants, row
        assert knowledge.sources.get(row.source), row


def test_a_matrix_file_crosses_the_platform_axis(knowledge: Knowledge, tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(
        "axes:\n  framework: [torch]\n  framework_version: ['2.10.0']\n  cuda: [cpu]\n"
        "  platform: [amd64, aarch64]\n"
        "include:\n  - {framework: jax, framework_version: '0.10.2', platform: linux/arm64}\n"
    )
    matrix = load_matrix(path, knowledge)
    assert matrix.axes["platform"] == (AMD64, ARM64)
    plan = make_plan(knowledge, matrix, Selection())
    assert [e.id for e in plan.entries] == [
        "torch2.10.0-cpu-py3.11-bookworm",
        "torch2.10.0-cpu-py3.11-bookworm-arm64",
        "jax0.10.2-cpu-py3.11-bookworm-arm64",
    ]
    chosen = make_plan(knowledge, matrix, Selection(platform=ARM64))
    assert [e.platform for e in chosen.entries] == [ARM64, ARM64]


def test_a_matrix_without_a_platform_builds_for_the_host(
    knowledge: Knowledge, tmp_path: Path
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("axes:\n  framework: [torch]\n  cuda: [cpu]\n")
    assert load_matrix(path, knowledge).axes["platform"] == (host_platform(),)
    path.write_text("defaults: {platform: arm64}\naxes:\n  framework: [torch]\n  cuda: [cpu]\n")
    assert load_matrix(path, knowledge).axes["platform"] == (ARM64,)


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("sparc", "axes.platform[0]: 'sparc' is not a platform envbuild builds for (use linux/amd64 or linux/arm64)"),
        ("linux/arm/v7", "axes.platform[0]: 'linux/arm/v7' is not a platform envbuild builds for"),
        ("64", "axes.platform[0]: 64 was read as a YAML number"),
        ("[arm64]", "axes.platform[0]: expected a string, got a list"),
        ("'" + "a" * 100 + "'", "axes.platform[0]: 'aaaa"),
        ("'arm64 '", "has a space or line break at an end; write 'arm64'"),
        ('"arm\\u0007"', "holds control characters"),
    ],
)  # fmt: skip
def test_a_bad_platform_in_a_matrix_names_its_place(
    knowledge: Knowledge, tmp_path: Path, value: str, problem: str
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(f"axes:\n  framework: [torch]\n  platform: [{value}]\n")
    with pytest.raises(MatrixError) as caught:
        load_matrix(path, knowledge)
    assert problem in caught.value.message


def test_a_lock_for_arm64_is_resolved_for_aarch64(knowledge: Knowledge) -> None:
    entries, _ = plan_for(
        knowledge, framework="jax", framework_version="0.10.2", cuda="cpu", platform=ARM64
    )
    (entry,) = entries.values()
    assert platform_tag(entry, knowledge) == "aarch64-manylinux_2_36"  # type: ignore[arg-type]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stderr


@pytest.mark.parametrize(
    "value",
    [
        "sparc",
        "linux/amd64,",
        ",",
        "linux/arm64,mips",
        "x" * 300,
        "arm64\x1b[2J",
        "linux/amd64 linux/arm64",
    ],
)
def test_a_bad_platform_option_is_one_line_exit_2(value: str) -> None:
    code, err = run("plan", "--framework", "torch", "--platform", value)
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("envbuild: error: --platform ")
    assert "give linux/amd64 or linux/arm64, or both comma-separated" in line
    assert "\x1b" not in line


def test_plan_lists_both_platforms_when_asked() -> None:
    result = CliRunner().invoke(
        main,
        ["plan", "--framework", "torch", "--framework-version", "2.10.0", "--cuda", "cpu",
         "--platform", "linux/amd64,linux/arm64"],
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "torch2.10.0-cpu-py3.11-bookworm " in result.stdout
    assert "torch2.10.0-cpu-py3.11-bookworm-arm64" in result.stdout


def test_platforms_yaml_problems_name_file_and_place(tmp_path: Path) -> None:
    cases = [
        ('versions: ">=2.0,<2.11"', 'versions: "2.0 to 2.10"', "is not a version specifier"),
        ("variants: {cpu: plain}", "variants: {cpu: pypi}", "expected plain or variant, got 'pypi'"),
        ("variants: {cpu: plain}", "variants: {gpu: plain}", "'gpu' is not a variant"),
        ("variants: {cpu: plain}", "variants: [cpu]", "expected a mapping of variant"),
        ("  linux/arm64:\n", "  linux/riscv64:\n", "platforms.linux/riscv64: unknown key"),
        ("    jax:\n", "    jaxx:\n", "unknown key"),
        ("source: jax-aarch64-pypi\n", "source: nowhere\n", "source 'nowhere' is not one of sources"),
    ]  # fmt: skip
    for i, (old, new, problem) in enumerate(cases):
        folder = tmp_path / f"knowledge-{i}"  # knowledge is cached per folder
        folder.mkdir()
        for path in (REPO / "matrices" / "knowledge").glob("*.yaml"):
            (folder / path.name).write_text(path.read_text())
        target = folder / "platforms.yaml"
        text = target.read_text()
        assert old in text, old
        target.write_text(text.replace(old, new, 1))
        with pytest.raises(MatrixError) as caught:
            load_knowledge(folder)
        assert "platforms.yaml: " in caught.value.message, (new, caught.value.message)
        assert problem in caught.value.message, (new, caught.value.message)


def test_an_arm64_build_without_sm_100_kernels_is_refused_for_gb200(knowledge: Knowledge) -> None:
    # Early aarch64 cu126 builds carry sm_90 only: GH200 runs them, GB200 does not.
    base = Combination(
        framework="torch", framework_version="2.6.0", cuda="12.6", python="3.11",
        os="bookworm", platform=ARM64,
    )  # fmt: skip
    gb200 = judge(knowledge, base, Fleet(gpus=(knowledge.gpus["GB200"],)))
    assert not gb200[-1].holds
    assert "have no kernels for GB200 (sm_100); they ship sm_90" in gb200[-1].text
    assert "aarch64_ci_build.sh" in gb200[-1].source
    assert judge(knowledge, base, Fleet(gpus=(knowledge.gpus["GH200"],)))[-1].holds
    # The same release and CUDA on amd64 reads amd64's row.
    amd64 = judge(knowledge, Combination(**{**base.as_dict(), "platform": AMD64}),
                  Fleet(gpus=(knowledge.gpus["GH200"],)))  # fmt: skip
    assert "aarch64" not in amd64[-1].source
