"""What `envbuild doctor` concludes and prints, from a host report: the newest CUDA a driver runs
(the knowledge base's driver table) and the report's lines and JSON. Probing a real engine and
driver is the integration tier's job; nothing here fakes one."""

from __future__ import annotations

import dataclasses
import json

import pytest

from envbuild.core.models import Knowledge
from envbuild.host import probes
from envbuild.host.doctor import CONTAINER_SHM, HostReport, _needs, newest_cuda, report_lines
from envbuild.host.probes import GpuInfo, GpuProbe

GIB = 1024**3


@pytest.mark.parametrize(
    ("driver", "full", "family"),
    [
        ("535.104.05", "12.2", "12.x"),  # the driver of the plan --driver example
        ("525.60.13", "12.0", "12.x"),  # exactly CUDA 12.0's minimum, and the 12 family's
        ("525.60.12", "11.8", "11.x"),  # one patch short of both
        ("450.51.05", "11.0", None),  # 11.0 GA runs; the 11.x family needs 450.80.02
        ("580.95.05", "13.0", "13.x"),
        ("418.87.01", None, None),  # older than every CUDA the knowledge base knows
    ],
)
def test_the_newest_cuda_a_driver_runs(
    knowledge: Knowledge, driver: str, full: str | None, family: str | None
) -> None:
    assert newest_cuda(knowledge, driver) == {"full": full, "minor_version_compatible": family}


@pytest.mark.parametrize("driver", [None, "", "[N/A]", "r535", "535.x"])
def test_no_driver_or_an_unreadable_one_runs_no_cuda(
    knowledge: Knowledge, driver: str | None
) -> None:
    assert newest_cuda(knowledge, driver) == {"full": None, "minor_version_compatible": None}


KIT_MISSING = "no docker client here builds with BuildKit (...)"


def host_report(
    *, gpus: tuple[GpuInfo, ...], engine_up: bool, builders: dict[str, str] | None = None
) -> HostReport:
    builders = builders if builders is not None else {"buildkit": "", "classic": ""}
    engine = (
        {"reachable": True, "kind": "Docker", "address": "unix:///var/run/docker.sock",
         "version": "27.5.1", "api_version": "1.47", "rootless": False,
         "runtimes": ["runc", "nvidia"], "nvidia_runtime": True, "cdi_spec_dirs": [],
         "builders": {n: {"works": not why, "why_not": why} for n, why in builders.items()},
         "needs": _needs(builders, nvidia=True), "platform": "linux/amd64",
         "platforms": {"linux/amd64": "natively",
                       "linux/arm64": "under emulation (qemu, about 10 times slower)"}}
        if engine_up
        else {"reachable": False, "error": "cannot connect to the Docker engine; start dockerd"}
    )  # fmt: skip
    probe = GpuProbe(
        driver="535.104.05" if gpus else None,
        gpus=gpus,
        method="nvidia-smi" if gpus else None,
        note=f"{len(gpus)} GPU(s) via nvidia-smi" if gpus else "no NVIDIA GPU found",
    )
    return HostReport(
        engine=engine,
        gpu=probe,
        shm_bytes=None if not gpus else 64 * GIB,
        disk_free_bytes=123_400_000_000,
        disk_path="/var/lib/docker",
        newest_cuda={"full": "12.2", "minor_version_compatible": "12.x"} if gpus else {},
        runnable=("jax-0.4.30-cpu-py3.11", "torch-2.4.1-cpu-py3.11"),
        not_runnable=(("torch-2.4.1-cu121-py3.11", "no NVIDIA GPU on this host"),),
        warnings=("GPU 1 (Tesla T4) has 5.0 GB: below the 8 GB floor for training",),
    )


H100 = GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", memory_bytes=85_520_000_000, cc="9.0")


def test_a_cpu_host_without_an_engine_is_reported_plainly() -> None:
    lines = report_lines(host_report(gpus=(), engine_up=False))

    assert lines[:2] == [
        "Container engine:",
        "  NOT reachable: cannot connect to the Docker engine; start dockerd",
    ]
    assert "  no NVIDIA GPU found; images still build and smoke-test on the CPU" in lines
    assert (
        f"Shared memory: /dev/shm unknown on the host; smoke containers get {CONTAINER_SHM}"
        in lines
    )
    assert "Disk: 123.4 GB free at /var/lib/docker (a CUDA torch image takes ~6 GB)" in lines
    runnable = lines.index("This host can run 2 of the matrix's entries:")
    assert lines[runnable + 1 : runnable + 3] == [
        "  jax-0.4.30-cpu-py3.11",
        "  torch-2.4.1-cpu-py3.11",
    ]
    assert lines[-3:] == [
        "Not here (1):",
        "  torch-2.4.1-cu121-py3.11: no NVIDIA GPU on this host",
        "WARNING: GPU 1 (Tesla T4) has 5.0 GB: below the 8 GB floor for training",
    ]
    assert not [line for line in lines if "\n" in line]


def test_a_gpu_host_lists_its_driver_gpus_and_cuda() -> None:
    lines = report_lines(host_report(gpus=(H100,), engine_up=True))

    assert lines[1:10] == [
        "  Docker at unix:///var/run/docker.sock, version 27.5.1 (API 1.47); NVIDIA runtime: yes; "
        "runtimes: runc, nvidia",
        "  builder buildkit: works",
        "  builder classic: works",
        "  secrets: yes: BuildKit secret mounts",
        "  package cache: yes: a BuildKit cache mount",
        "  offline network: yes: BuildKit's --network=none",
        "  gpus: yes: the NVIDIA runtime",
        "  builds for linux/amd64: natively",
        "  builds for linux/arm64: under emulation (qemu, about 10 times slower)",
    ]
    assert "  driver 535.104.05 (1 GPU(s) via nvidia-smi)" in lines
    assert "  GPU 0: NVIDIA H100 80GB HBM3, 85.5 GB, compute capability 9.0" in lines
    assert "  newest CUDA: 12.2 fully, 12.x by minor-version compatibility" in lines
    assert (
        f"Shared memory: /dev/shm 68.7 GB on the host; smoke containers get {CONTAINER_SHM}"
        in lines
    )


def test_the_json_report_has_every_finding() -> None:
    document = host_report(gpus=(H100,), engine_up=True).as_dict()

    assert json.loads(json.dumps(document)) == document  # plain JSON all the way down
    assert document["has_gpu"] is True
    assert document["nvidia"]["gpus"] == [
        {
            "index": 0,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_gb": 85.5,
            "compute_capability": "9.0",
        }
    ]
    assert document["not_runnable"] == [
        {"id": "torch-2.4.1-cu121-py3.11", "reason": "no NVIDIA GPU on this host"}
    ]
    assert document["container_shm"] == CONTAINER_SHM
    assert document["disk"] == {"path": "/var/lib/docker", "free_bytes": 123_400_000_000}
    assert host_report(gpus=(), engine_up=False).as_dict()["has_gpu"] is False


@pytest.mark.parametrize(
    ("output", "names", "memory", "skipped"),
    [
        (
            "0, NVIDIA H100 80GB HBM3, 81559, 9.0, 570.86.15",
            ["NVIDIA H100 80GB HBM3"],
            [81559 * 2**20],
            0,
        ),
        ("0, NVIDIA GB10, [N/A], 12.1, 580.95.05", ["NVIDIA GB10"], [None], 0),
        ("0, Tesla, Inc. X1, 16000, 8.0, 550.1", ["Tesla, Inc. X1"], [16000 * 2**20], 0),
        ("garbage\n1, NVIDIA A10, 23028, 8.6, 550.1", ["NVIDIA A10"], [23028 * 2**20], 1),
        ("No devices were found", [], [], 1),
    ],
)
def test_nvidia_smi_output_is_read_without_a_traceback(
    output: str, names: list[str], memory: list[int | None], skipped: int
) -> None:
    gpus, driver, unread = probes.parse_smi(output)
    assert [g.name for g in gpus] == names
    assert [g.memory_bytes for g in gpus] == memory
    assert unread == skipped
    assert (driver is None) == (not names)


def test_an_engine_without_buildkit_says_what_the_classic_builder_gives_and_what_it_lacks() -> None:
    report = host_report(gpus=(), engine_up=True, builders={"buildkit": KIT_MISSING, "classic": ""})
    lines = report_lines(report)

    assert f"  builder buildkit: not here: {KIT_MISSING}" in lines
    assert "  secrets: yes: served from this host during the build" in lines
    assert "  package cache: no: needs BuildKit" in lines
    assert "  offline network: yes: an internal network reaching only this host" in lines
    assert report.as_dict()["engine"]["builders"]["buildkit"] == {
        "works": False, "why_not": KIT_MISSING,
    }  # fmt: skip


def test_no_builder_at_all_is_said_for_each_need() -> None:
    builders = {"buildkit": KIT_MISSING, "classic": "the engine is rootless; use buildkit"}
    needs = _needs(builders, nvidia=False)

    assert needs["secrets"] == needs["offline_network"] == "no builder works here"
    assert needs["gpus"] == "no: install nvidia-container-toolkit"


def test_a_remote_engine_has_no_disk_figure_from_this_host() -> None:
    report = dataclasses.replace(
        host_report(gpus=(), engine_up=True), disk_path="", disk_free_bytes=None
    )
    assert "Disk: the engine is not on this host; its free space is not measured here" in (
        report_lines(report)
    )
