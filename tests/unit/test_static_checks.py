"""Host-side checks of the static CUDA report (cuda_static.py) against labels and knowledge.

The reports are shaped as cuda_static.py writes them; the torch 2.4.1 cu121 one holds what the
payload read in that image here (the e2e test reads it again from the real libraries).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from click.testing import CliRunner

from envbuild.cli.main import main
from envbuild.core.models import Gpu, Knowledge
from envbuild.smoke.static import check_static, fleet_refusal
from tests.unit import test_smoke_checks as smoke_checks

LABELS = {**smoke_checks.LABELS, "org.envbuild.os": "bookworm"}  # the torch 2.4.1 cu121 image


def version(path: str, text: str) -> list[dict[str, str]]:
    return [{"path": path, "version": text}]


REPORT: dict[str, Any] = {
    "payload": "cuda_static",
    "ok": True,
    "closure": {"libraries": 212, "missing": [], "ok": True},
    "versions": {
        "libraries": {
            "cudnn": version("/opt/venv/.../nvidia/cudnn/lib/libcudnn.so.9", "9.1.0"),
            "nccl": version("/opt/venv/.../nvidia/nccl/lib/libnccl.so.2", "2.20.5"),
            "cuda_runtime": version("/opt/venv/.../libcudart.so.12", "12.1"),
            "cublas": version("/opt/venv/.../libcublas.so.12", "12.1.3"),
        },
        "errors": [],
        "ok": True,
    },
    "archs": {
        "library": "/opt/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so",
        "sass": [50, 60, 70, 75, 80, 86, 90],
        "ptx": [],
        "describe": "sm_50, sm_60, sm_70, sm_75, sm_80, sm_86, sm_90; no PTX",
        "ok": True,
    },
    "errors": [],
}


def failing(
    knowledge: Knowledge, report: dict[str, Any], labels: dict[str, str] = LABELS
) -> dict[str, str]:
    return {c.name: c.detail for c in check_static(report, labels, knowledge) if not c.passed}


def test_the_cu121_image_as_read_passes_every_check(knowledge: Knowledge) -> None:
    checks = {c.name: c for c in check_static(REPORT, LABELS, knowledge)}
    assert all(c.passed for c in checks.values()), {n: c.detail for n, c in checks.items()}
    assert set(checks) == {"cuda_libraries", "cudnn_library", "nccl_library", "cuda_runtime_library", "gpu_archs"}  # fmt: skip
    assert (
        checks["cudnn_library"].detail == "cuDNN 9.1.0 read from the library (labels say 9.1.0.70)"
    )
    assert "libtorch_cuda.so has sm_50" in checks["gpu_archs"].detail


def test_a_missing_library_fails_by_name(knowledge: Knowledge) -> None:
    report = copy.deepcopy(REPORT)
    report["closure"]["missing"] = [
        {"library": "torch/lib/libtorch_cuda.so", "needs": "libcudnn.so.9"}
    ]
    report["closure"]["ok"] = False
    assert failing(knowledge, report) == {
        "cuda_libraries": "torch/lib/libtorch_cuda.so needs libcudnn.so.9, not in the image"
    }


@pytest.mark.parametrize(
    ("key", "text", "check"),
    [("cudnn", "8.9.2", "cudnn_library"), ("nccl", "2.21.5", "nccl_library"),
     ("cuda_runtime", "12.4", "cuda_runtime_library")],
)  # fmt: skip
def test_a_library_of_another_version_than_its_label_fails(
    knowledge: Knowledge, key: str, text: str, check: str
) -> None:
    report = copy.deepcopy(REPORT)
    report["versions"]["libraries"][key] = version("/x/lib", text)
    assert set(failing(knowledge, report)) == {check}


def test_a_cudnn_label_without_the_library_fails(knowledge: Knowledge) -> None:
    report = copy.deepcopy(REPORT)
    report["versions"]["libraries"]["cudnn"] = []
    assert failing(knowledge, report) == {
        "cudnn_library": "no cuDNN library in the image (labels say 9.1.0.70)"
    }


def test_an_arch_the_knowledge_lists_but_the_library_lacks_fails(knowledge: Knowledge) -> None:
    report = copy.deepcopy(REPORT)
    report["archs"]["sass"] = [50, 60, 70, 75, 80, 86]
    (detail,) = failing(knowledge, report).values()
    assert detail.endswith("; missing sm_90")


def test_ptx_the_knowledge_does_not_list_fails(knowledge: Knowledge) -> None:
    report = copy.deepcopy(REPORT)
    report["archs"]["ptx"] = [90]
    assert "PTX present, the knowledge base says none" in failing(knowledge, report)["gpu_archs"]


def test_kernels_for_more_archs_than_listed_pass_and_are_named(knowledge: Knowledge) -> None:
    report = copy.deepcopy(REPORT)
    report["archs"]["sass"] = [50, 60, 70, 75, 80, 86, 89, 90]
    (check,) = [c for c in check_static(report, LABELS, knowledge) if c.name == "gpu_archs"]
    assert check.passed
    assert check.detail.endswith("(some kernels also for sm_89)")


def test_a_framework_library_without_gpu_code_fails(knowledge: Knowledge) -> None:
    report = copy.deepcopy(REPORT)
    report["archs"] = {"library": None, "ok": False}
    assert failing(knowledge, report) == {"gpu_archs": "no library of the framework holds GPU code"}


def test_a_jax_build_is_held_to_its_floor(knowledge: Knowledge) -> None:
    labels = {**LABELS, "org.envbuild.framework": "jax", "org.envbuild.framework-version": "0.10.2",
              "org.envbuild.cuda": "12", "org.envbuild.cudnn": "", "org.envbuild.nccl": ""}  # fmt: skip
    report = copy.deepcopy(REPORT)
    report["versions"]["libraries"]["cuda_runtime"] = version("/x/libcudart.so.12", "12.9")
    report["archs"].update(library="/x/jaxlib/xla_cuda_plugin.so", sass=[52, 60, 70, 80, 90], ptx=[90])  # fmt: skip
    assert failing(knowledge, report, labels) == {}
    report["archs"].update(sass=[80, 90], ptx=[])  # nothing for the documented 5.2 floor
    assert "compute capability >= 5.2" in failing(knowledge, report, labels)["gpu_archs"]


def test_an_error_of_the_payload_fails_the_static_check(knowledge: Knowledge) -> None:
    report = copy.deepcopy(REPORT)
    report["errors"] = ["closure: OSError: [Errno 5] Input/output error"]
    assert failing(knowledge, report) == {
        "cuda_static": "the static CUDA payload failed: closure: OSError: [Errno 5] Input/output error"
    }


# -- --gpu: an image without kernels for a GPU of the fleet is refused ------------------------------


def gpu(name: str, cc: str) -> Gpu:
    return Gpu(name=name, cc=cc, source="test")


@pytest.mark.parametrize(
    ("fleet", "refusal"),
    [
        ((gpu("H100", "9.0"),), None),
        ((gpu("RTX 4090", "8.9"),), None),  # the sm_86 SASS runs on 8.9
        ((gpu("sm_120", "12.0"),), "no kernels for sm_120 in libtorch_cuda.so "
         "(has sm_50, sm_60, sm_70, sm_75, sm_80, sm_86, sm_90; no PTX)"),
        ((gpu("H100", "9.0"), gpu("RTX 5090", "12.0"), gpu("B200", "10.0")),
         "no kernels for sm_120 (RTX 5090), sm_100 (B200) in libtorch_cuda.so "
         "(has sm_50, sm_60, sm_70, sm_75, sm_80, sm_86, sm_90; no PTX)"),
    ],
)  # fmt: skip
def test_a_fleet_gpu_without_a_kernel_is_refused_by_name(
    fleet: tuple[Gpu, ...], refusal: str | None
) -> None:
    report = copy.deepcopy(REPORT)
    report["archs"]["describe"] = "sm_50, sm_60, sm_70, sm_75, sm_80, sm_86, sm_90; no PTX"
    assert fleet_refusal({"cuda_static": report}, LABELS, fleet) == refusal


def test_ptx_reaches_a_newer_gpu() -> None:
    report = copy.deepcopy(REPORT)
    report["archs"]["ptx"] = [90]
    assert fleet_refusal({"cuda_static": report}, LABELS, (gpu("sm_120", "12.0"),)) is None


def test_a_cpu_image_is_never_refused_for_a_fleet() -> None:
    labels = {**LABELS, "org.envbuild.cuda": "cpu"}
    assert fleet_refusal({}, labels, (gpu("sm_120", "12.0"),)) is None


def test_a_cuda_report_without_architectures_asks_for_a_new_smoke_test() -> None:
    refusal = fleet_refusal({"ok": True}, LABELS, (gpu("H100", "9.0"),))
    assert refusal is not None
    assert "smoke-test it again" in refusal


@pytest.mark.parametrize("command", ["smoke", "publish"])
def test_an_unknown_fleet_gpu_is_one_line_before_any_work(command: str) -> None:
    extra = ["--registry", "127.0.0.1:5000/x"] if command == "publish" else []
    result = CliRunner().invoke(main, [command, "some/image:1", *extra, "--gpu", "H9999"])
    assert result.exit_code == 2
    assert "--gpu 'H9999' is not a GPU envbuild knows" in result.output
    assert "Traceback" not in result.output


def test_an_optional_extension_of_another_package_is_named_but_does_not_fail(
    knowledge: Knowledge,
) -> None:
    report = copy.deepcopy(REPORT)
    report["closure"]["missing_elsewhere"] = [
        {"library": "numba/np/ufunc/tbbpool.so", "needs": "libtbb.so.12"}
    ]
    (check,) = [c for c in check_static(report, LABELS, knowledge) if c.name == "cuda_libraries"]
    assert check.passed
    assert check.detail.endswith(
        "; optional extensions whose needs the image does not hold (loaded only when used): numba/np/ufunc/tbbpool.so needs libtbb.so.12"
    )


def test_an_arm64_image_is_held_to_the_aarch64_wheels_list_not_amd64s(knowledge: Knowledge) -> None:
    # What the static payload read here, under qemu, from the aarch64 torch 2.11.0+cu130 image.
    labels = {
        **LABELS, "org.envbuild.framework-version": "2.11.0", "org.envbuild.cuda": "13.0",
        "org.envbuild.cudnn": "", "org.envbuild.nccl": "", "org.envbuild.platform": "linux/arm64",
    }  # fmt: skip
    report = copy.deepcopy(REPORT)
    report["versions"]["libraries"] = {
        "cudnn": version("/opt/venv/.../nvidia/cudnn/lib/libcudnn.so.9", "9.19.0"),
        "nccl": version("/opt/venv/.../nvidia/nccl/lib/libnccl.so.2", "2.28.9"),
        "cuda_runtime": version("/opt/venv/.../nvidia/cu13/lib/libcudart.so.13", "13.0"),
    }
    report["archs"]["sass"] = [80, 90, 100, 103, 110, 120, 121]
    report["archs"]["describe"] = "sm_80, sm_90, sm_100, sm_103, sm_110, sm_120, sm_121; no PTX"

    assert failing(knowledge, report, labels) == {}
    amd64 = {k: v for k, v in labels.items() if k != "org.envbuild.platform"}
    assert failing(knowledge, report, amd64)["gpu_archs"].endswith("missing sm_75, sm_86")
