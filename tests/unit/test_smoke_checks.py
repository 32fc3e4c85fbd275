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


USER_LABELS = {**LABELS, "org.envbuild.user": "1000:1000"}
RAN_AS_USER: dict[str, Any] = {
    "uid": 1000,
    "gid": 1000,
    "name": "envbuild",
    "folders": {"HOME": "/home/envbuild", "XDG_CACHE_HOME": "/home/envbuild/.cache"},
    "unwritable": {},
    "environment": "/opt/venv",
    "environment_writable": [],
}


def user_failure(part: Any, label: str = "1000:1000") -> str | None:
    """The user check's detail when it failed, None when it passed."""
    report = {**REPORT, "user": part}
    (check,) = [
        c
        for c in check_report(report, {**LABELS, "org.envbuild.user": label}, gpus=True)
        if c.name == "user"
    ]
    return None if check.passed else check.detail


def test_the_user_the_payload_ran_as_is_checked_against_the_label() -> None:
    assert user_failure(RAN_AS_USER) is None
    passed = [c for c in check_report({**REPORT, "user": RAN_AS_USER}, USER_LABELS, gpus=True)]
    assert [c.detail for c in passed if c.name == "user"] == [
        "ran as 1000:1000 (envbuild), not root: HOME and the caches writable, the environment "
        "/opt/venv read-only"
    ]
    as_root = {**RAN_AS_USER, "uid": 0, "gid": 0, "name": "root"}
    assert user_failure(as_root) == (
        "ran as 0:0; the image's org.envbuild.user label says 1000:1000"
    )
    # root where the matrix chose it: the environment is root's to write.
    assert user_failure({**as_root, "environment_writable": ["/opt/venv"]}, "0:0") is None


def test_an_image_without_the_user_label_is_not_checked() -> None:
    assert "user" not in {c.name for c in check_report(REPORT, LABELS, gpus=True)}


def test_a_user_who_cannot_write_its_caches_or_can_write_the_environment_fails() -> None:
    unwritable = {
        **RAN_AS_USER,
        "folders": {**RAN_AS_USER["folders"], "TRITON_CACHE_DIR": "/home/envbuild/.cache/triton"},
        "unwritable": {"TRITON_CACHE_DIR": "PermissionError: [Errno 13] Permission denied"},
    }
    assert user_failure(unwritable) == (
        "cannot write TRITON_CACHE_DIR /home/envbuild/.cache/triton (PermissionError: [Errno 13] "
        "Permission denied); the image's org.envbuild.user label says 1000:1000"
    )
    writable = {**RAN_AS_USER, "environment_writable": ["/opt/venv/lib/python3.11/site-packages"]}
    assert user_failure(writable) == (
        "can write into the environment (/opt/venv/lib/python3.11/site-packages); "
        "the image's org.envbuild.user label says 1000:1000"
    )


MALFORMED_USER_PARTS = [
    None, [], "1000", 1000, {},
    *({**RAN_AS_USER, key: value} for key in ("uid", "gid")
      for value in (None, "1000", 1000.0, True, [1000], {"a": 1})),
    *({**RAN_AS_USER, "environment_writable": value} for value in (None, "no", {}, 0, True)),
    *({**RAN_AS_USER, "unwritable": value} for value in (["HOME"], {"HOME": None}, {1: 2})),
]  # fmt: skip


def test_a_malformed_user_part_fails_the_check_never_the_host() -> None:
    for part in MALFORMED_USER_PARTS:
        detail = user_failure(copy.deepcopy(part))
        assert detail is not None, part
        assert "\n" not in detail
