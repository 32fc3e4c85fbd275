"""Host-side checks of a payload report against the image's labels."""

from __future__ import annotations

import copy
import json
from typing import Any

from envbuild.smoke.checks import check_report

LABELS = {
    "org.envbuild.framework": "torch",
    "org.envbuild.framework-version": "2.4.1",
    "org.envbuild.cuda": "12.1",
    "org.envbuild.cudnn": "9.1.0.70",
    "org.envbuild.nccl": "2.20.5",
    "org.envbuild.python": "3.11",
}

REPORT: dict[str, Any] = {
    "payload": "torch",
    "ok": True,
    "versions": {
        "python": "3.11.2",
        "framework": "2.4.1+cu121",
        "cuda": "12.1",
        "cudnn": "9.1.0",
        "nccl": "2.20.5",
    },
    "train": {
        "device": "cuda",
        "steps": 20,
        "loss_first": 1.4,
        "loss_last": 0.3,
        "loss_fell": True,
    },
    "allreduce": {
        "backend": "nccl",
        "world_size": 1,
        "correct": True,
        "expected": 1.0,
        "got": 1.0,
        "busbw_gbps": 0.0,
    },
    "errors": [],
}


def failing(report: dict[str, Any], *, gpus: bool = True) -> dict[str, str]:
    return {c.name: c.detail for c in check_report(report, LABELS, gpus=gpus) if not c.passed}


def test_a_matching_report_passes() -> None:
    assert failing(REPORT) == {}


def test_a_different_torch_is_named() -> None:
    report = copy.deepcopy(REPORT)
    report["versions"]["framework"] = "2.5.0+cu121"
    assert failing(report) == {"framework_version": "torch 2.5.0+cu121 (labels say 2.4.1)"}


def test_a_cpu_wheel_in_a_cuda_image_fails() -> None:
    report = copy.deepcopy(REPORT)
    report["versions"].update(cuda=None, cudnn=None, nccl=None)
    assert set(failing(report)) == {"cuda_version"}


def test_python_cudnn_and_nccl_mismatches_fail() -> None:
    report = copy.deepcopy(REPORT)
    report["versions"].update(python="3.12.1", cudnn="9.5.1", nccl="2.21.5")
    assert set(failing(report)) == {"python_version", "cudnn_version", "nccl_version"}


def test_a_loss_that_does_not_fall_fails() -> None:
    report = copy.deepcopy(REPORT)
    report["train"].update(loss_last=1.4, loss_fell=False)
    report["ok"] = False
    assert {"loss_fell", "payload"} <= set(failing(report))


def test_on_cpu_the_all_reduce_needs_two_ranks() -> None:
    report = copy.deepcopy(REPORT)
    report["versions"].update(cuda=None, cudnn=None, nccl=None)
    cpu_labels = {**LABELS, "org.envbuild.cuda": "cpu"}
    checks = {c.name: c for c in check_report(report, cpu_labels, gpus=False)}
    assert not checks["allreduce"].passed
    report["allreduce"].update(world_size=2, backend="gloo", expected=3.0, got=3.0)
    checks = {c.name: c for c in check_report(report, cpu_labels, gpus=False)}
    assert all(c.passed for c in checks.values())


def test_payload_errors_are_reported() -> None:
    report = copy.deepcopy(REPORT)
    report["errors"] = ["allreduce: RuntimeError: rank 1 died"]
    assert failing(report) == {"payload": "allreduce: RuntimeError: rank 1 died"}


def test_a_framework_that_reports_cuda_only_on_a_gpu_is_not_failed_without_one() -> None:
    report = copy.deepcopy(REPORT)
    report["payload"] = "jax"
    report["versions"].update(cuda=None, cudnn=None, nccl=None)
    report["devices"] = [{"kind": "cpu"}, {"kind": "cpu"}]
    report["allreduce"].update(world_size=2)
    labels = {**LABELS, "org.envbuild.framework": "jax", "org.envbuild.cuda": "12"}
    report["cuda_needs_gpu"] = True
    checks = {c.name: c for c in check_report(report, labels, gpus=False)}
    assert checks["cuda_version"].passed
    assert checks["cuda_version"].detail.startswith(
        "not checked: jax reports its CUDA version only on a GPU"
    )
    report["devices"] = [{"kind": "gpu"}]
    checks = {c.name: c for c in check_report(report, labels, gpus=True)}
    assert not checks["cuda_version"].passed  # with a GPU, a missing CUDA version is a failure


def test_a_bare_major_label_is_met_by_any_minor() -> None:
    report = copy.deepcopy(REPORT)
    report["versions"]["cuda"] = "12.9"
    labels = {**LABELS, "org.envbuild.cuda": "12"}
    checks = {c.name: c for c in check_report(report, labels, gpus=True)}
    assert checks["cuda_version"].passed


def test_the_smoke_test_runs_with_the_options_the_image_declares_and_prints_them() -> None:
    from envbuild.core import labels as label_keys
    from envbuild.engine.interface import RunResult
    from envbuild.knowledge.load import load_knowledge
    from envbuild.report.documents import smoke_lines
    from envbuild.smoke.vet import smoke_image
    from tests.support.engine_double import InMemoryEngine

    cpu = {**LABELS, "org.envbuild.cuda": "cpu", "org.envbuild.cudnn": "", "org.envbuild.nccl": ""}
    report = copy.deepcopy(REPORT)
    report["versions"].update(framework="2.4.1+cpu", cuda=None, cudnn=None, nccl=None)
    report["train"]["device"] = "cpu"
    report["allreduce"].update(backend="gloo", world_size=2, expected=3.0, got=3.0)
    printed = RunResult(exit_code=0, stdout=json.dumps(report), stderr="", timed_out=False, seconds=1.0)  # fmt: skip
    double = InMemoryEngine()
    for tag, extra in (("t/declares:1", {label_keys.RUN_SHM_SIZE: "1g"}), ("t/plain:1", {})):
        double.add_image(tag, tags=(tag,), labels={**cpu, **extra})
        double.outputs[tag] = printed
    knowledge = load_knowledge()
    declares = smoke_image(double, "t/declares:1", knowledge=knowledge, gpus="none")
    plain = smoke_image(double, "t/plain:1", knowledge=knowledge, gpus="none")
    assert [run.shm_size for run in double.runs] == ["1g", None]  # None: Docker's 64 MB
    assert declares.passed, declares.checks
    assert declares.payload["run_with"] == "--shm-size=1g"
    assert (
        smoke_lines(declares)[-1]
        == "  run it as it was tested: docker run --shm-size=1g t/declares:1"
    )
    assert smoke_lines(plain)[-1] == "  run it as it was tested: docker run t/plain:1"


def test_each_training_section_is_a_check_and_a_failed_one_says_why() -> None:
    report = copy.deepcopy(REPORT)
    report["checks"] = {
        "loss_fell": True, "allreduce_correct": True, "compiled_step": False,
        "data_loader": True, "checkpoint_resumed": True, "numpy_interop": True,
        "packages_import": False,
    }  # fmt: skip
    report["compile"] = {"compiler": "inductor (g++)", "loss_first": 1.0, "loss_last": None}
    report["loader"] = {"batches": 24, "workers": 2, "batches_per_s": 180.4, "loss_first": 1.2, "loss_last": 0.8}  # fmt: skip
    report["checkpoint"] = {"loss_after_resume": 0.5, "loss_uninterrupted": 0.5}
    report["numpy"] = {"skipped": "numpy is not installed in this image"}
    report["packages"] = {"imported": 40, "distributions": 41}
    report["errors"] = [
        "compile: InvalidCxxCompiler: torch.compile needs a C++ compiler (g++) in the image",
        "packages: RuntimeError: 1 failed: brokenpkg: brokenpkg: ImportError: no",
    ]
    checks = {c.name: c for c in check_report(report, LABELS, gpus=True)}
    assert checks["compiled_step"].detail == "InvalidCxxCompiler: torch.compile needs a C++ compiler (g++) in the image"  # fmt: skip
    assert checks["packages_import"].detail == "RuntimeError: 1 failed: brokenpkg: brokenpkg: ImportError: no"  # fmt: skip
    assert not checks["compiled_step"].passed
    assert checks["data_loader"].detail == "24 batches from 2 workers at 180/s: loss 1.2 -> 0.8"
    assert checks["checkpoint_resumed"].detail == "resumed at loss 0.5 (uninterrupted 0.5)"
    assert checks["numpy_interop"].detail == "skipped: numpy is not installed in this image"
    assert checks["numpy_interop"].passed
    assert not checks["payload"].passed
