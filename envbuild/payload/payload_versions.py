"""The versions CUDA libraries and frameworks report, as 'x.y.z'; runs INSIDE the container.

Frameworks give NCCL's and cuDNN's versions as integer codes, tuples or text; each parser
here takes every form seen and gives one text, so that the host compares like with like.
``loaded_nccl_version`` asks the libnccl this process has mapped when the framework does not
say.  Standard library only (the host's tests import it too), Python 3.8 and later.
"""

from __future__ import annotations

import ctypes
from typing import Any


def nccl_version_from(value: Any) -> str | None:
    """NCCL's version as 'x.y.z' from the forms frameworks give it, else None.

    ``21803`` / ``"21803"`` (2.9 and later: major*10000 + minor*100 + patch),
    ``2708`` (older: major*1000 + minor*100 + patch), ``(2, 18, 3)`` or
    ``(2, 18, 3, "suffix")``, and ``"2.18.3"`` (kept as it is).
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (tuple, list)):
        return ".".join(str(int(x)) for x in value[:3]) or None
    if isinstance(value, str):
        text = value.strip()
        if not text.isdigit():
            return text or None
        value = int(text)
    number = int(value)
    if number <= 0:
        return None
    if number >= 10000:
        major, rest = divmod(number, 10000)
    else:
        major, rest = divmod(number, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def cudnn_version_from(value: Any) -> str | None:
    """cuDNN's version as 'x.y.z': 90100 -> '9.1.0' (9 and later), 8902 -> '8.9.2' (8 and earlier)."""
    if value is None:
        return None
    number = int(value)
    if number >= 90000:  # major*10000 + minor*100 + patch
        major, rest = divmod(number, 10000)
    else:  # major*1000 + minor*100 + patch
        major, rest = divmod(number, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def loaded_nccl_version() -> str | None:
    """ncclGetVersion() of the libnccl this process has mapped, else None.

    Only a library that is already loaded (seen in /proc/self/maps) is asked,
    so a stray libnccl elsewhere on the system cannot be reported by mistake;
    a statically linked NCCL is not found and gives None.
    """
    try:
        with open("/proc/self/maps") as fh:
            paths = sorted(
                {
                    line.split(None, 5)[5].strip()
                    for line in fh
                    if "libnccl" in line and len(line.split(None, 5)) == 6
                }
            )
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            version = ctypes.c_int(0)
            if lib.ncclGetVersion(ctypes.byref(version)) == 0 and version.value > 0:
                return nccl_version_from(version.value)
        except Exception:
            continue
    return None
