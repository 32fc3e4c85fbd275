"""Planning for a fleet: driver floors, GPU architectures, --explain, and what works instead."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from envbuild.cli.main import main
from envbuild.core.models import Combination, Knowledge
from envbuild.plan.compat import find_gpu, gpu_runs


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def combo(version: str, cuda: str) -> Combination:
    return Combination(
        framework="torch", framework_version=version, cuda=cuda, python="3.11", os="bookworm"
    )


@pytest.mark.parametrize(
    ("text", "cc"),
    [("H100", "9.0"), ("h200", "9.0"), ("RTX 4090", "8.9"), ("rtx-4090", "8.9"), ("NVIDIA H100 80GB HBM3", "9.0"),
     ("sm_90", "9.0"), ("sm_120", "12.0"), ("8.6", "8.6"), ("A100", "8.0")],
)  # fmt: skip
def test_gpus_by_name_or_compute_capability(knowledge: Knowledge, text: str, cc: str) -> None:
    gpu = find_gpu(knowledge, text)
    assert gpu is not None
    assert gpu.cc == cc


def test_unknown_gpu_is_none(knowledge: Knowledge) -> None:
    assert find_gpu(knowledge, "Voodoo 3") is None


def test_cuda_13_builds_dropped_maxwell(knowledge: Knowledge) -> None:
    gpu = find_gpu(knowledge, "sm_52")
    assert gpu is not None
    fact = gpu_runs(knowledge, combo("2.14.0", "13.0"), gpu)
    assert not fact.holds
    assert "torch 2.14.0 cu130 wheels have no kernels for sm_52" in fact.text
    assert gpu_runs(
        knowledge, combo("2.14.0", "12.6"), gpu
    ).holds  # cu126 keeps Maxwell (sm_50 SASS)


def test_newer_minor_runs_older_sass_and_ptx_covers_newer_majors(knowledge: Knowledge) -> None:
    ada = find_gpu(knowledge, "8.9")
    assert ada is not None
    assert gpu_runs(knowledge, combo("2.14.0", "13.0"), ada).holds  # sm_86 SASS runs on 8.9
    future = find_gpu(knowledge, "sm_130")
    assert future is not None
    assert gpu_runs(knowledge, combo("2.14.0", "13.0"), future).holds  # PTX of sm_120


def test_plan_with_an_old_gpu_exits_2_and_names_what_runs() -> None:
    code, _, err = run(
        "plan",
        "--framework",
        "torch",
        "--framework-version",
        "2.14.0",
        "--cuda",
        "13.0",
        "--gpu",
        "sm_52",
    )
    assert code == 2
    assert "no kernels for sm_52" in err
    assert "that fleet can run e.g." in err
    assert "cu126" in err


def test_driver_floor_for_cuda_13() -> None:
    code, _, err = run(
        "plan", "--framework-version", "2.14.0", "--cuda", "13", "--driver", "570.86.15"
    )
    assert code == 2
    assert "needs driver >= 580.65.06" in err
    code, out, _ = run(
        "plan",
        "--framework-version",
        "2.14.0",
        "--cuda",
        "13",
        "--driver",
        "580.65.06",
        "--format",
        "json",
    )
    assert code == 0
    assert {e["cuda"] for e in json.loads(out)["entries"]} == {"13.0", "13.2"}


def test_unknown_gpu_on_the_command_line_exits_2() -> None:
    code, _, err = run("plan", "--gpu", "H10O")
    assert code == 2
    assert "--gpu 'H10O' is not a GPU envbuild knows; did you mean" in err


def test_explain_gives_facts_with_sources() -> None:
    code, out, _ = run(
        "plan", "--framework-version", "2.6.0", "--cuda", "12", "--gpu", "A100", "--driver", "535.104.05",
        "--explain", "--format", "json",
    )  # fmt: skip
    assert code == 0
    document = json.loads(out)
    entry = next(e for e in document["entries"] if e["cuda"] == "12.4")
    facts = [f["fact"] for f in entry["facts"]]
    assert "torch 2.6.0 cu124 is PyPI's plain wheel, bundling cuDNN 9.1.0.70, NCCL 2.21.5" in facts
    assert any(f.startswith("CUDA 12.4 needs driver >= 525.60.13") for f in facts)
    assert any("run on A100 (sm_80)" in f for f in facts)
    assert all(f["source"] and f["holds"] for f in entry["facts"])
    excluded = next(x for x in document["excluded"] if x["cuda"] == "12.1")
    assert excluded["facts"][-1]["holds"] is False
    assert excluded["facts"][-1]["fact"] == excluded["reason"]
    # "publishes no cu121" rests on the list of every variant the release published, not on PyPI
    assert "pytorch/test-infra" in excluded["facts"][-1]["source"]


def test_jax_cuda_13_needs_a_580_driver() -> None:
    code, _, err = run("plan", "--framework", "jax", "--cuda", "13", "--driver", "570.86.15")
    assert code == 2
    assert "CUDA 13 needs driver >= 580.65.06" in err
    assert "that fleet can run e.g. jax" in err
    code, out, _ = run(
        "plan", "--framework", "jax", "--cuda", "13", "--driver", "580.65.06", "--format", "json"
    )
    assert code == 0
    assert {e["cuda"] for e in json.loads(out)["entries"]} == {"13"}


def test_tensorflow_2_15_plans_cuda_12_2_with_cudnn_8_9() -> None:
    code, out, _ = run(
        "plan",
        "--framework",
        "tensorflow",
        "--framework-version",
        "2.15",
        "--cuda",
        "12",
        "--format",
        "json",
    )
    assert code == 0
    entries = json.loads(out)["entries"]
    assert entries
    assert {e["cuda"] for e in entries} == {"12.2"}
    assert all(e["cudnn"].startswith("8.9.") for e in entries)
    code, _, err = run(
        "plan", "--framework", "tensorflow", "--framework-version", "2.15", "--python", "3.12"
    )
    assert code == 2
    assert "supports Python 3.9-3.11" in err
