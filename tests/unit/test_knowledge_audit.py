"""The facts corrected by the audit against upstream, asserted through the real planner.

Each test plans on the shipped knowledge base (make_plan over the knowledge matrix, as
`envbuild plan` does) and checks what is kept, what is excluded, and the reason and source given.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from envbuild.cli.main import main
from envbuild.core.models import Combination, Exclusion, Fleet, Knowledge, Plan, Selection
from envbuild.knowledge.load import load_knowledge
from envbuild.plan.compat import SASS_RULE_SOURCE, arch_build, find_gpu
from envbuild.plan.matrix import default_matrix_path, knowledge_matrix, load_matrix, make_plan
from tests.conftest import REPO

KNOWLEDGE_DIR = REPO / "matrices" / "knowledge"


def plan_for(
    knowledge: Knowledge,
    framework: str,
    version: str,
    *,
    gpu: str | None = None,
    python: str | None = None,
) -> Plan:
    """What `envbuild plan --framework F --framework-version V [--gpu G] [--python P]` plans."""
    shipped = knowledge
    selection = Selection(framework=framework, framework_version=version, python=python)
    defaults = load_matrix(default_matrix_path(), shipped)
    fleet = None
    if gpu is not None:
        found = find_gpu(shipped, gpu)
        assert found is not None, gpu
        fleet = Fleet(gpus=(found,))
    return make_plan(
        shipped, knowledge_matrix(shipped, selection, defaults), selection, fleet=fleet
    )


def cudas(plan: Plan) -> set[str]:
    return {e.cuda for e in plan.entries}


def excluded(plan: Plan, cuda: str) -> Exclusion:
    return next(x for x in plan.excluded if x.combination.cuda == cuda)


# --- torch 2.8 cu128 / cu129 keep Volta (sm_70) ---------------------------------------------


def test_torch_2_8_cuda_12_8_and_12_9_wheels_run_on_a_v100(knowledge: Knowledge) -> None:
    plan = plan_for(knowledge, "torch", "2.8.0", gpu="V100")
    assert {"12.6", "12.8", "12.9"} <= cudas(plan)
    for entry in plan.entries:
        if entry.cuda in ("12.8", "12.9"):
            gpu_fact = entry.facts[-1]
            assert gpu_fact.holds
            assert gpu_fact.text.startswith(
                f"torch 2.8.0 cu{entry.cuda.replace('.', '')} wheels ship sm_70,"
            )
            assert "they run on V100 (sm_70)" in gpu_fact.text
            assert "issues/160269" in gpu_fact.source
            assert ".ci/manywheel/build_cuda.sh" in gpu_fact.source


@pytest.mark.parametrize(("cuda", "ptx"), [("12.6", False), ("12.8", False), ("12.9", True)])
def test_torch_2_8_arch_lists_are_the_build_script_s(
    knowledge: Knowledge, cuda: str, ptx: bool
) -> None:
    row = arch_build(knowledge, Combination(
        framework="torch", framework_version="2.8.0", cuda=cuda, python="3.11", os="bookworm"
    ))  # fmt: skip
    assert row is not None
    expected = ["5.0", "6.0", "7.0", "7.5", "8.0", "8.6", "9.0"] if cuda == "12.6" else [
        "7.0", "7.5", "8.0", "8.6", "9.0", "10.0", "12.0"
    ]  # fmt: skip
    assert list(row.sm) == expected
    assert row.ptx is ptx


# --- torch 2.0-2.5 pip wheels: no sm_61 ------------------------------------------------------

PIP_ERA = [
    (release, cuda)
    for release, cudas_ in {
        "2.0.1": ("11.7", "11.8"),
        "2.1.2": ("11.8", "12.1"),
        "2.2.2": ("11.8", "12.1"),
        "2.3.1": ("11.8", "12.1"),
        "2.4.1": ("11.8", "12.1", "12.4"),
        "2.5.1": ("11.8", "12.1", "12.4"),
    }.items()
    for cuda in cudas_
]


@pytest.mark.parametrize(("version", "cuda"), PIP_ERA)
def test_torch_2_0_to_2_5_pip_wheels_carry_no_sm_61(
    knowledge: Knowledge, version: str, cuda: str
) -> None:
    row = arch_build(knowledge, Combination(
        framework="torch", framework_version=version, cuda=cuda, python="3.11", os="bookworm"
    ))  # fmt: skip
    assert row is not None
    assert "6.1" not in row.sm
    assert "6.0" in row.sm
    assert not row.ptx
    assert "manywheel/build_cuda.sh" in knowledge.sources[row.source]


def test_a_gtx_1080_runs_torch_2_1_pip_wheels_through_their_sm_60_sass(
    knowledge: Knowledge,
) -> None:
    plan = plan_for(knowledge, "torch", "2.1.0", gpu="GTX 1080")
    assert cudas(plan) == {"cpu", "11.8", "12.1"}
    entry = next(e for e in plan.entries if e.cuda == "12.1")
    fact = entry.facts[-1]
    assert fact.text == (
        "torch 2.1.0 cu121 wheels ship sm_50, sm_60, sm_70, sm_75, sm_80, sm_86, sm_90: they run "
        "on GTX 1080 (sm_61); there are no sm_61 kernels, but the sm_60 SASS runs on compute "
        "capability 6.x from 6.0 up"
    )
    assert "pytorch/builder" in fact.source
    assert "maxwell-compatibility-guide" in fact.source  # the same-major SASS rule's source


def test_a_gtx_1080_has_no_kernels_in_torch_2_8_cuda_12_8_or_12_9(knowledge: Knowledge) -> None:
    plan = plan_for(knowledge, "torch", "2.8.0", gpu="GTX 1080")
    assert "12.6" in cudas(plan)  # cu126 keeps sm_60 SASS
    cu128 = excluded(plan, "12.8")
    assert cu128.reason.startswith("torch 2.8.0 cu128 wheels have no kernels for GTX 1080 (sm_61)")
    assert cu128.reason.endswith(
        "no SASS of compute capability 6.x at or below 6.1, and they carry no PTX to JIT-compile"
    )
    cu129 = excluded(plan, "12.9")
    assert cu129.reason.endswith("their PTX (sm_120) cannot be JIT-compiled for an older GPU")


def test_ptx_is_jit_compiled_only_for_newer_gpus(knowledge: Knowledge) -> None:
    plan = plan_for(knowledge, "torch", "2.8.0", gpu="sm_130")
    assert "12.9" in cudas(plan)  # 12.0+PTX
    entry = next(e for e in plan.entries if e.cuda == "12.9")
    assert entry.facts[-1].text.endswith("the driver JIT-compiles the sm_120 PTX for it")
    assert "torch 2.8.0 cu128 wheels have no kernels for sm_130" in excluded(plan, "12.8").reason


def test_the_sass_rule_source_is_in_the_knowledge_base(knowledge: Knowledge) -> None:
    assert "docs.nvidia.com" in knowledge.sources[SASS_RULE_SOURCE]


# --- tensorflow and-cuda extras that cannot install ------------------------------------------


@pytest.mark.parametrize("version", ["2.14.0", "2.14.1"])
def test_tensorflow_2_14_and_cuda_is_excluded_on_python_3_11(
    knowledge: Knowledge, version: str
) -> None:
    plan = plan_for(knowledge, "tensorflow", version, python="3.11")
    assert "cpu" in cudas(plan)  # tensorflow-cpu has cp311 wheels
    reason = excluded(plan, "11.8").reason
    assert reason == (
        f"tensorflow {version} cu118 installs only on Python 3.9-3.10, not 3.11: its and-cuda "
        "extra pins tensorrt==8.5.3.1, which has no wheels for Python 3.11 or newer"
    )
    source = excluded(plan, "11.8").facts[-1].source
    assert "tensorflow/tensorflow/issues/61986" in source
    assert "NVIDIA/TensorRT/issues/2744" in source
    kept = plan_for(knowledge, "tensorflow", version, python="3.10")
    assert "11.8" in cudas(kept)


@pytest.mark.parametrize("python", ["3.9", "3.10", "3.11"])
def test_tensorflow_2_15_0_and_cuda_installs_on_no_python(
    knowledge: Knowledge, python: str
) -> None:
    plan = plan_for(knowledge, "tensorflow", "2.15.0", python=python)
    reason = excluded(plan, "12.2").reason
    assert reason.startswith("tensorflow 2.15.0 cu122 installs on no Python: ")
    assert "tensorrt-libs==8.6.1" in reason
    assert "tensorflow/pull/62520" in excluded(plan, "12.2").facts[-1].source
    fixed = plan_for(knowledge, "tensorflow", "2.15.0.post1", python=python)
    assert "12.2" in cudas(fixed)  # post1 dropped the TensorRT pins


# --- "publishes no" only where the variant list is verified ----------------------------------


def test_a_verified_variant_list_says_publishes_no(knowledge: Knowledge) -> None:
    fact = excluded(plan_for(knowledge, "torch", "2.8.0"), "13.0").facts[-1]
    assert fact.text == "torch 2.8.0 publishes no cu130 wheels; it ships cpu, cu126, cu128, cu129"
    assert "pytorch/test-infra" in fact.source


def test_an_unverified_variant_list_says_what_is_known(knowledge: Knowledge) -> None:
    plan = plan_for(knowledge, "torch", "2.15.0")
    assert cudas(plan) == {"cpu", "13.2"}
    reason = excluded(plan, "13.0").reason
    assert reason == (
        "torch 2.15.0 has no known cu130 wheels: its download.pytorch.org variants are not "
        "verified (known: cpu, cu132)"
    )
    assert all("publishes no" not in x.reason for x in plan.excluded)


def test_an_open_variant_of_a_verified_list_is_not_called_absent(knowledge: Knowledge) -> None:
    plan = plan_for(knowledge, "torch", "2.11.0")
    assert excluded(plan, "12.9").reason.startswith("torch 2.11.0 has no known cu129 wheels")
    assert excluded(plan, "11.8").reason.startswith("torch 2.11.0 publishes no cu118 wheels")


def test_the_marker_in_the_data_decides_the_message(tmp_path: Path) -> None:
    # A release `envbuild refresh` adds carries no marker: drop 2.14.1's and it becomes unverified.
    for path in KNOWLEDGE_DIR.glob("*.yaml"):
        (tmp_path / path.name).write_text(path.read_text())
    torch = tmp_path / "torch.yaml"
    text = torch.read_text()
    head = text.index('  "2.14.1":')
    at = text.index("    variants_verified: test-infra\n", head)
    torch.write_text(text[:at] + text[at + len("    variants_verified: test-infra\n") :])
    changed = load_knowledge(tmp_path)
    reason = excluded(plan_for(changed, "torch", "2.14.1"), "12.8").reason
    assert reason.startswith("torch 2.14.1 has no known cu128 wheels: its download.pytorch.org")
    shipped = load_knowledge()
    assert excluded(plan_for(shipped, "torch", "2.14.1"), "12.8").reason.startswith(
        "torch 2.14.1 publishes no cu128 wheels"
    )


# --- plan --explain shows the sources ---------------------------------------------------------


def explain(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["plan", *args, "--explain", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_explain_shows_the_corrected_facts_sources() -> None:
    volta = explain("--framework", "torch", "--framework-version", "2.8.0", "--gpu", "V100")
    cu128 = next(e for e in volta["entries"] if e["cuda"] == "12.8")
    assert any("issues/160269" in f["source"] for f in cu128["facts"])
    tf = explain("--framework", "tensorflow", "--framework-version", "2.14.0")
    trt = next(x for x in tf["excluded"] if x["cuda"] == "11.8")
    assert trt["facts"][-1]["fact"] == trt["reason"]
    assert "issues/61986" in trt["facts"][-1]["source"]


# --- every fact in every knowledge file names a source ---------------------------------------

# Where the entries of each file sit: a path of keys, "*" for every key or list item.
ENTRIES = {
    "torch.yaml": [("releases", "*"), ("releases", "*", "variants", "*"), ("releases", "*", "tested")],
    "tensorflow.yaml": [("releases", "*"), ("releases", "*", "variants", "*"), ("releases", "*", "tested")],
    "jax.yaml": [("releases", "*"), ("releases", "*", "variants", "*"), ("releases", "*", "tested")],
    "cuda.yaml": [("families", "*"), ("toolkits", "*")],
    "cudnn.yaml": [("releases", "*")],
    "os.yaml": [("bases", "*")],
    "gpus.yaml": [("gpus", "*"), ("cuda_targets", "*"), ("builds", "*", "*")],
    "platforms.yaml": [("platforms", "*", "*", "*")],
}  # fmt: skip
SOURCE_KEYS = ("source", "python_source", "variants_verified")


def entries(data: Any, path: tuple[str, ...], where: str = "") -> list[tuple[str, dict[Any, Any]]]:
    if not path:
        return [(where, data)] if isinstance(data, dict) else []
    head, rest = path[0], path[1:]
    if head != "*":
        return entries(data.get(head), rest, f"{where}.{head}") if isinstance(data, dict) else []
    items = data.items() if isinstance(data, dict) else enumerate(data or [])
    return [found for key, value in items for found in entries(value, rest, f"{where}.{key}")]


def test_the_entry_map_covers_every_knowledge_file() -> None:
    assert {p.name for p in KNOWLEDGE_DIR.glob("*.yaml")} == set(ENTRIES)


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_fact_entry_names_a_known_source(name: str) -> None:
    data = yaml.safe_load((KNOWLEDGE_DIR / name).read_text())
    sources = data["sources"]
    assert sources
    assert all(isinstance(text, str) and text.strip() for text in sources.values())
    found = [e for path in ENTRIES[name] for e in entries(data, path)]
    assert found
    for where, entry in found:
        assert entry.get("source") in sources, f"{name}{where}: no known source"
        for key in SOURCE_KEYS:
            if isinstance(entry.get(key), str):
                assert entry[key] in sources, f"{name}{where}.{key}: {entry[key]!r} is not a source"
    if "variants_verified" in data:
        assert data["variants_verified"] in sources
