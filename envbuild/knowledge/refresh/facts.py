"""From PyPI's JSON and wheel metadata to facts: what a plain `pip install <package>==X` pulls
on Linux x86_64 (release date, Requires-Python, CPython wheels, CUDA runtime, cuDNN, NCCL)."""

from __future__ import annotations

import email.parser
import logging
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from envbuild.knowledge.refresh.errors import PypiError
from envbuild.knowledge.refresh.pypi import PypiClient

log = logging.getLogger(__name__)

_PREFERRED_PYTHON = (3, 11)  # the wheel whose metadata is read; its markers are evaluated for it


@dataclass(frozen=True, kw_only=True)
class ReleaseFacts:
    """What PyPI says about one release's Linux x86_64 wheels."""

    version: str
    released: str | None  # date of the release's earliest upload, YYYY-MM-DD
    requires_python: str | None
    python: tuple[str, ...]  # "3.11", ... with a plain CPython manylinux x86_64 wheel
    pypi_variant: str | None  # "12.1"; "cpu" when the wheel pins no CUDA; None: no such wheel
    cuda_runtime: str | None
    cudnn: str | None
    nccl: str | None


def _linux_env(python: tuple[int, int]) -> dict[str, str]:
    """Marker environment of CPython `python` on Linux x86_64 (what the wheel is read for)."""
    full = f"{python[0]}.{python[1]}.0"
    return {
        "implementation_name": "cpython",
        "implementation_version": full,
        "os_name": "posix",
        "platform_machine": "x86_64",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": full,
        "platform_python_implementation": "CPython",
        "python_version": f"{python[0]}.{python[1]}",
        "sys_platform": "linux",
        "extra": "",
    }


def _applies(marker: Marker | None, env: dict[str, str]) -> bool:
    if marker is None:
        return True
    if re.search(r"\bextra\b", str(marker)):
        return False  # only what a plain install pulls, never an extra's requirements
    return marker.evaluate(env)


def _exact_pin(req: Requirement, version: str) -> str:
    pins = [s.version for s in req.specifier if s.operator in ("==", "===")]
    if len(pins) != 1 or "*" in pins[0]:
        msg = (
            f"{version}: Requires-Dist {req} is not pinned to one version with ==; "
            "the refresh cannot tell which one the wheel installs"
        )
        raise PypiError(msg)
    return pins[0]


def facts_from_metadata(
    metadata: str, *, version: str, python: tuple[int, int]
) -> dict[str, str | None]:
    """CUDA variant, runtime, cuDNN and NCCL pins a wheel's METADATA requires on Linux x86_64."""
    env = _linux_env(python)
    headers = email.parser.HeaderParser().parsestr(metadata)
    runtime: str | None = None
    toolkit: str | None = None
    cudnn: str | None = None
    nccl: str | None = None
    for raw in headers.get_all("Requires-Dist") or []:
        try:
            req = Requirement(" ".join(str(raw).split()))
        except InvalidRequirement as exc:
            msg = f"{version}: cannot parse Requires-Dist {raw!r} ({exc})"
            raise PypiError(msg) from exc
        if not _applies(req.marker, env):
            continue
        name = canonicalize_name(req.name)
        if re.fullmatch(r"nvidia-cuda-runtime(-cu\d+)?", name):
            runtime = _exact_pin(req, version)
        elif name == "cuda-toolkit":
            toolkit = _exact_pin(req, version)
        elif re.fullmatch(r"nvidia-cudnn(-cu\d+)?", name):
            cudnn = _exact_pin(req, version)
        elif re.fullmatch(r"nvidia-nccl(-cu\d+)?", name):
            nccl = _exact_pin(req, version)
    cuda_runtime = runtime or toolkit
    if cuda_runtime is None:
        return {"pypi_variant": "cpu", "cuda_runtime": None, "cudnn": cudnn, "nccl": nccl}
    variant = ".".join(cuda_runtime.split(".")[:2])
    return {"pypi_variant": variant, "cuda_runtime": cuda_runtime, "cudnn": cudnn, "nccl": nccl}


def _cpython(filename: str) -> tuple[int, int] | None:
    """(3, 11) for a plain CPython manylinux x86_64 wheel; None for anything else."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    for tag in tags:
        match = re.fullmatch(r"cp(\d)(\d+)", tag.interpreter)
        linux = tag.platform.startswith("manylinux") and tag.platform.endswith("_x86_64")
        if match and tag.abi == tag.interpreter and linux:
            return int(match.group(1)), int(match.group(2))
    return None


def _usable(version: str, oldest: Version | None) -> Version | None:
    try:
        parsed = Version(version)
    except InvalidVersion:
        return None
    if parsed.is_prerelease or (oldest is not None and parsed < oldest):
        return None
    return parsed


def fetch_release_facts(
    client: PypiClient, package: str, *, oldest: str | None
) -> dict[str, ReleaseFacts]:
    """Facts of every final, non-yanked release of `package` from `oldest` on, ascending."""
    project_url = client.project_url(package)
    data = client.project(package)
    floor = Version(oldest) if oldest else None
    found: list[tuple[Version, ReleaseFacts]] = []
    for version, raw_files in data["releases"].items():
        parsed = _usable(str(version), floor)
        files = [f for f in raw_files or [] if isinstance(f, dict)]
        if parsed is None or not files or all(f.get("yanked") for f in files):
            continue
        facts = _release_facts(client, project_url, str(version), files)
        found.append((parsed, facts))
    found.sort(key=lambda item: item[0])
    return {facts.version: facts for _, facts in found}


def _release_facts(
    client: PypiClient, project_url: str, version: str, files: list[dict[str, Any]]
) -> ReleaseFacts:
    uploads = sorted(
        str(f.get("upload_time_iso_8601") or f.get("upload_time") or "") for f in files
    )
    released = next((u[:10] for u in uploads if u), None)
    wheels = [
        (py, f)
        for f in files
        if not f.get("yanked") and (py := _cpython(str(f.get("filename", "")))) is not None
    ]
    pythons = tuple(f"{a}.{b}" for a, b in sorted({py for py, _ in wheels}))
    if not wheels:
        log.warning("%s %s has no CPython manylinux x86_64 wheel", project_url, version)
        requires = next(
            (str(f["requires_python"]) for f in files if f.get("requires_python")), None
        )
        return ReleaseFacts(
            version=version,
            released=released,
            requires_python=requires,
            python=(),
            pypi_variant=None,
            cuda_runtime=None,
            cudnn=None,
            nccl=None,
        )

    def nearness(item: tuple[tuple[int, int], dict[str, Any]]) -> tuple[int, int, int, str]:
        (major, minor), f = item
        distance = abs(major - _PREFERRED_PYTHON[0]) * 100 + abs(minor - _PREFERRED_PYTHON[1])
        return distance, major, minor, str(f.get("filename"))

    python, wheel = min(wheels, key=nearness)
    url = urljoin(project_url, str(wheel["url"]))
    log.info("reading %s %s metadata from %s", project_url, version, wheel["filename"])
    pins = facts_from_metadata(client.core_metadata(url), version=version, python=python)
    requires_python = wheel.get("requires_python")
    return ReleaseFacts(
        version=version,
        released=released,
        requires_python=str(requires_python) if requires_python else None,
        python=pythons,
        pypi_variant=pins["pypi_variant"],
        cuda_runtime=pins["cuda_runtime"],
        cudnn=pins["cudnn"],
        nccl=pins["nccl"],
    )
