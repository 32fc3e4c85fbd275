"""`envbuild doctor`'s report: the engine, NVIDIA driver and GPUs, shared memory and disk (the
probes), and which images of a matrix this host can run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from envbuild.core.errors import EngineUnavailable
from envbuild.core.models import BUILDKIT, CLASSIC, CPU, Fleet, Gpu, Knowledge, Selection
from envbuild.core.platforms import PLATFORMS
from envbuild.core.versions import version_sort_key
from envbuild.engine.interface import connect
from envbuild.host.emulation import how_platform_runs
from envbuild.host.probes import GpuProbe, bytes_free, probe_gpus, shm_bytes
from envbuild.plan.compat import entry_id
from envbuild.plan.gpus import find_gpu
from envbuild.plan.matrix import make_plan
from envbuild.plan.matrix_file import Matrix

MIN_GPU_MEMORY_GB = 8  # below this, training images are of little use (the guide's floor)
CONTAINER_SHM = "1g"  # what `envbuild smoke` gives containers; Docker's default is 64 MB


@dataclass(frozen=True, kw_only=True)
class HostReport:
    """Everything `envbuild doctor` found."""

    engine: dict[str, Any]
    gpu: GpuProbe
    shm_bytes: int | None
    disk_free_bytes: int | None
    disk_path: str
    newest_cuda: dict[str, str | None]
    runnable: tuple[str, ...]
    not_runnable: tuple[tuple[str, str], ...]
    warnings: tuple[str, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        """The document `doctor --json` prints."""
        return {
            "engine": self.engine,
            "nvidia": {
                "driver": self.gpu.driver,
                "probe": self.gpu.method,
                "note": self.gpu.note,
                "gpus": [g.as_dict() for g in self.gpu.gpus],
            },
            "has_gpu": bool(self.gpu.gpus),
            "shm_bytes": self.shm_bytes,
            "container_shm": CONTAINER_SHM,
            "disk": {"path": self.disk_path, "free_bytes": self.disk_free_bytes},
            "newest_cuda": self.newest_cuda,
            "runnable": list(self.runnable),
            "not_runnable": [{"id": i, "reason": r} for i, r in self.not_runnable],
            "warnings": list(self.warnings),
        }


def newest_cuda(knowledge: Knowledge, driver: str | None) -> dict[str, str | None]:
    """The newest CUDA a driver fully supports, and the newest family it runs by minor-version compatibility."""
    if driver is None:
        return {"full": None, "minor_version_compatible": None}
    have = version_sort_key(driver)
    full = [c for c, d in knowledge.cuda_toolkit_driver.items() if version_sort_key(d) <= have]
    families = [m for m, d in knowledge.cuda_family_driver.items() if version_sort_key(d) <= have]
    return {
        "full": max(full, key=version_sort_key) if full else None,
        "minor_version_compatible": f"{max(families, key=int)}.x" if families else None,
    }


def examine_host(knowledge: Knowledge, matrix: Matrix, selection: Selection) -> HostReport:
    """Check the engine, GPUs, shared memory and disk; plan the matrix for this host."""
    engine_report: dict[str, Any]
    root = "/var/lib/docker"
    local = True
    try:
        engine = connect()
        info = engine.describe()
        builders = {name: engine.builder_problem(name) for name in (BUILDKIT, CLASSIC)}
    except EngineUnavailable as exc:
        engine_report = {"reachable": False, "error": exc.message}
    else:
        root = info.root_dir or root
        local = info.address.startswith("unix://")  # tcp:// and ssh:// name another host
        engine_report = {
            "reachable": True,
            "kind": info.kind,
            "address": info.address,
            "version": info.version,
            "api_version": info.api_version,
            "rootless": info.rootless,
            "runtimes": list(info.runtimes),
            "nvidia_runtime": "nvidia" in info.runtimes,
            "cdi_spec_dirs": list(info.cdi_spec_dirs),
            "builders": {
                name: {"works": not why, "why_not": why} for name, why in builders.items()
            },
            "needs": _needs(builders, "nvidia" in info.runtimes),
            "platform": info.platform,
            "platforms": {p: how_platform_runs(info, p) for p in PLATFORMS},
        }
    gpu = probe_gpus()
    warnings = [
        f"GPU {g.index} ({g.name}) has {g.memory_bytes / 1e9:.1f} GB: below the {MIN_GPU_MEMORY_GB} GB floor for training"
        for g in gpu.gpus
        if g.memory_bytes is not None and g.memory_bytes < MIN_GPU_MEMORY_GB * 1e9
    ]
    if gpu.gpus and engine_report.get("reachable") and not engine_report.get("nvidia_runtime"):
        warnings.append(
            "the engine has no NVIDIA runtime: containers cannot get GPUs (install nvidia-container-toolkit)"
        )
    # A remote engine's disk is not this host's: say nothing rather than the wrong figure.
    disk_path = (root if Path(root).exists() else "/") if local else ""
    fleet_gpus: list[Gpu] = []
    for g in gpu.gpus:
        known = find_gpu(knowledge, g.name)
        fleet_gpus.append(
            Gpu(
                name=g.name,
                cc=g.cc,
                source=known.source if known else "the driver",
            )
        )
    plan = make_plan(
        knowledge, matrix, selection, fleet=Fleet(driver=gpu.driver, gpus=tuple(fleet_gpus))
    )
    runnable: list[str] = []
    not_runnable = [(entry_id(x.combination), x.reason) for x in plan.excluded]
    for entry in plan.entries:
        if entry.cuda != CPU and not gpu.gpus:
            not_runnable.append(
                (entry.id, "no NVIDIA GPU on this host (it would train on the CPU only)")
            )
        else:
            runnable.append(entry.id)
    return HostReport(
        engine=engine_report,
        gpu=gpu,
        shm_bytes=shm_bytes(),
        disk_free_bytes=bytes_free(disk_path) if disk_path else None,
        disk_path=disk_path,
        newest_cuda=newest_cuda(knowledge, gpu.driver),
        runnable=tuple(runnable),
        not_runnable=tuple(not_runnable),
        warnings=tuple(warnings),
    )


def _needs(builders: dict[str, str], nvidia: bool) -> dict[str, str]:
    """Whether each of envbuild's needs is met with this engine, and how (or why not)."""
    kit, classic = not builders[BUILDKIT], not builders[CLASSIC]
    return {
        "secrets": (
            "yes: BuildKit secret mounts" if kit
            else "yes: served from this host during the build" if classic
            else "no builder works here"
        ),
        "package_cache": "yes: a BuildKit cache mount" if kit else "no: needs BuildKit",
        "offline_network": (
            "yes: BuildKit's --network=none" if kit
            else "yes: an internal network reaching only this host" if classic
            else "no builder works here"
        ),
        "gpus": "yes: the NVIDIA runtime" if nvidia else "no: install nvidia-container-toolkit",
    }  # fmt: skip


def _gb(value: int | None) -> str:
    return "unknown" if value is None else f"{value / 1e9:.1f} GB"


def report_lines(report: HostReport) -> list[str]:
    """The report as the terminal shows it."""
    engine = report.engine
    lines = ["Container engine:"]
    if engine["reachable"]:
        runtime = "yes" if engine["nvidia_runtime"] else "no"
        rootless = ", rootless" if engine["rootless"] else ""
        lines.append(
            f"  {engine['kind']}{rootless} at {engine['address']}, version {engine['version']} "
            f"(API {engine['api_version']}); NVIDIA runtime: {runtime}; "
            f"runtimes: {', '.join(engine['runtimes'])}"
        )
        for name, builder in engine["builders"].items():
            said = "works" if builder["works"] else f"not here: {builder['why_not']}"
            lines.append(f"  builder {name}: {said}")
        lines += [f"  {need.replace('_', ' ')}: {how}" for need, how in engine["needs"].items()]
        lines += [f"  builds for {name}: {how}" for name, how in engine["platforms"].items()]
    else:
        lines.append(f"  NOT reachable: {engine['error']}")
    lines.append("NVIDIA driver and GPUs:")
    if report.gpu.gpus:
        lines.append(f"  driver {report.gpu.driver} ({report.gpu.note})")
        lines += [
            f"  GPU {g.index}: {g.name}, {_gb(g.memory_bytes)}, compute capability {g.cc}"
            for g in report.gpu.gpus
        ]
        newest = report.newest_cuda
        lines.append(
            f"  newest CUDA: {newest['full']} fully, {newest['minor_version_compatible']} by minor-version compatibility"
        )
    else:
        lines.append(f"  {report.gpu.note}; images still build and smoke-test on the CPU")
    lines.append(
        f"Shared memory: /dev/shm {_gb(report.shm_bytes)} on the host; smoke containers get {CONTAINER_SHM}"
    )
    if report.disk_path:
        lines.append(
            f"Disk: {_gb(report.disk_free_bytes)} free at {report.disk_path} (a CUDA torch image takes ~6 GB)"
        )
    else:
        lines.append("Disk: the engine is not on this host; its free space is not measured here")
    lines.append(f"This host can run {len(report.runnable)} of the matrix's entries:")
    lines += [f"  {entry_id}" for entry_id in report.runnable]
    if report.not_runnable:
        lines.append(f"Not here ({len(report.not_runnable)}):")
        lines += [f"  {entry_id}: {reason}" for entry_id, reason in report.not_runnable]
    lines += [f"WARNING: {w}" for w in report.warnings]
    return lines
