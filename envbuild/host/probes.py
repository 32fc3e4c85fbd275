"""What this host has, read without the engine: the NVIDIA driver and GPUs (nvidia-smi, else NVML
directly), shared memory, free disk, and the machine facts bench figures belong to."""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envbuild.engine.interface import Engine


@dataclass(frozen=True, kw_only=True)
class GpuInfo:
    """One GPU as the driver reports it."""

    index: int
    name: str
    memory_bytes: int | None  # None: the driver did not say (unified-memory parts report [N/A])
    cc: str

    def as_dict(self) -> dict[str, Any]:
        """Plain mapping for JSON."""
        return {
            "index": self.index,
            "name": self.name,
            "memory_gb": None if self.memory_bytes is None else round(self.memory_bytes / 1e9, 1),
            "compute_capability": self.cc,
        }


@dataclass(frozen=True, kw_only=True)
class GpuProbe:
    """What the NVIDIA driver says, and through which probe."""

    driver: str | None
    gpus: tuple[GpuInfo, ...]
    method: str | None  # "nvidia-smi", "nvml", or None
    note: str


def _smi() -> GpuProbe | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    fields = "index,name,memory.total,compute_cap,driver_version"
    try:
        result = subprocess.run(
            [smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return GpuProbe(driver=None, gpus=(), method="nvidia-smi", note=f"nvidia-smi failed: {exc}")
    if result.returncode != 0:
        note = (result.stderr or result.stdout).strip().splitlines()
        return GpuProbe(
            driver=None,
            gpus=(),
            method="nvidia-smi",
            note=f"nvidia-smi: {note[0] if note else result.returncode}",
        )
    gpus, driver, skipped = parse_smi(result.stdout)
    said = f"{len(gpus)} GPU(s) via nvidia-smi"
    if skipped:
        said += f"; {skipped} line(s) of its output not understood"
    return GpuProbe(driver=driver, gpus=gpus, method="nvidia-smi", note=said)


def parse_smi(output: str) -> tuple[tuple[GpuInfo, ...], str | None, int]:
    """nvidia-smi's `index, name, memory.total, compute_cap, driver_version` CSV lines: the GPUs,
    the driver, and how many lines could not be read. A name may hold commas; a memory of
    [N/A] (unified-memory parts) is None."""
    gpus: list[GpuInfo] = []
    driver, skipped = None, 0
    for line in output.strip().splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) < 5 or not parts[0].isdigit():
            skipped += 1
            continue
        index, name, (memory_mib, cc, version) = parts[0], ", ".join(parts[1:-3]), parts[-3:]
        try:
            memory = int(float(memory_mib) * 1024 * 1024)
        except ValueError:
            memory = None
        driver = version or driver
        gpus.append(GpuInfo(index=int(index), name=name, memory_bytes=memory, cc=cc))
    return tuple(gpus), driver, skipped


class _Memory(ctypes.Structure):
    _fields_ = [
        ("total", ctypes.c_ulonglong),
        ("free", ctypes.c_ulonglong),
        ("used", ctypes.c_ulonglong),
    ]


def _nvml() -> GpuProbe | None:
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if lib.nvmlInit_v2() != 0:
        return GpuProbe(
            driver=None, gpus=(), method="nvml", note="NVML is installed but nvmlInit failed"
        )
    try:
        buffer = ctypes.create_string_buffer(96)
        lib.nvmlSystemGetDriverVersion(buffer, 96)
        count = ctypes.c_uint(0)
        lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
        gpus = []
        for index in range(count.value):
            handle = ctypes.c_void_p()
            lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(handle))
            name = ctypes.create_string_buffer(96)
            lib.nvmlDeviceGetName(handle, name, 96)
            memory = _Memory()
            lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory))
            major, minor = ctypes.c_int(0), ctypes.c_int(0)
            lib.nvmlDeviceGetCudaComputeCapability(handle, ctypes.byref(major), ctypes.byref(minor))
            gpus.append(
                GpuInfo(
                    index=index,
                    name=name.value.decode(errors="replace"),
                    memory_bytes=int(memory.total),
                    cc=f"{major.value}.{minor.value}",
                )
            )
        return GpuProbe(
            driver=buffer.value.decode(errors="replace"),
            gpus=tuple(gpus),
            method="nvml",
            note=f"{len(gpus)} GPU(s) via NVML",
        )
    finally:
        lib.nvmlShutdown()


def probe_gpus() -> GpuProbe:
    """Ask the NVIDIA driver for its version and GPUs: nvidia-smi first, then NVML directly."""
    for probe in (_smi, _nvml):
        found = probe()
        if found is not None and found.gpus:
            return found
    return GpuProbe(
        driver=None,
        gpus=(),
        method=None,
        note="no NVIDIA GPU found (no nvidia-smi on PATH and libnvidia-ml.so.1 not loadable, or no devices)",
    )


def bytes_free(path: str) -> int | None:
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def shm_bytes() -> int | None:
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def _read(path: str) -> str:
    try:
        with Path(path).open(encoding="utf-8", errors="replace") as handle:
            return handle.read(1 << 20)
    except OSError:
        return ""


def host_facts(engine: Engine | None = None) -> dict[str, Any]:
    """The machine the figures belong to: CPU model and cores, memory, GPUs and driver, engine."""
    model = None
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    memory = None
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            memory = int(line.split()[1]) * 1024
    probe = probe_gpus()
    gpus = [
        {
            "index": gpu.index,
            "name": gpu.name,
            "memory_bytes": gpu.memory_bytes,
            "driver": probe.driver,
            "capability": gpu.cc,
        }
        for gpu in probe.gpus
    ]
    engine_version = None
    if engine is not None:
        try:
            engine_version = f"Docker {engine.describe().version}"
        except Exception:  # the facts are informative; an engine that will not say is no failure
            engine_version = None
    return {
        "cpu_model": model or platform.processor() or None,
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "memory_bytes": memory,
        "gpus": gpus,
        "driver": probe.driver,
        "engine": engine_version,
    }


def host_key(host: dict[str, Any]) -> str:
    """What makes two hosts' figures comparable: CPU model and cores, memory to the GB, GPUs."""
    memory = host.get("memory_bytes")
    parts = [
        str(host.get("cpu_model")),
        str(host.get("cores")),
        str(round(memory / 1e9) if isinstance(memory, int) else None),
        *(f"{g.get('name')}/{g.get('memory_bytes')}" for g in host.get("gpus") or []),
    ]
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
