"""What a CUDA environment holds, read without a GPU or a driver (stdlib only).

Runs inside an image (copied beside the smoke payloads) and on the host's tests alike:

* `fatbin_targets(path)`: the GPU code compiled into a shared object, read from its
  `.nv_fatbin` ELF section: each fat-binary container (magic 0xBA55ED50) holds entries whose
  headers name their kind (PTX or ELF, i.e. SASS machine code) and their `sm_` architecture.
* `library_version(path, symbol)`: a version a CUDA library reports about itself
  (`cudnnGetVersion`, `ncclGetVersion`, `cudaRuntimeGetVersion`, `cublasGetVersion_v2`),
  loaded with ctypes; none of these needs a GPU.

Bounded for hostile files: a section or a container that does not add up is an error naming
the file, never a loop or an unbounded read.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from dataclasses import dataclass

FATBIN_MAGIC = 0xBA55ED50
_MAGIC = struct.pack("<I", FATBIN_MAGIC)
_CONTAINER = struct.Struct("<IHHQ")  # magic, version, header size, size of what follows
_ENTRY = struct.Struct("<HHIQ")  # kind, version, header size, payload size
_ARCH_OFFSET = 28  # the entry header's uint32 sm_ architecture
KIND_PTX = 1
KIND_ELF = 2


class FatbinError(Exception):
    """A `.nv_fatbin` section that cannot be read; the message names the file."""


@dataclass(frozen=True)
class Targets:
    """The architectures a library carries machine code (SASS) and PTX for."""

    sass: frozenset[int]
    ptx: frozenset[int]

    def describe(self) -> str:
        """`sm_50, sm_60 … sm_90; PTX compute_90` or `… no PTX`."""
        sass = ", ".join(f"sm_{a}" for a in sorted(self.sass)) or "no machine code"
        ptx = ", ".join(f"compute_{a}" for a in sorted(self.ptx))
        return f"{sass}; " + (f"PTX {ptx}" if ptx else "no PTX")

    def runs_on(self, arch: int) -> bool:
        """Whether a GPU of compute capability `arch` (e.g. 90) has a kernel to run.

        SASS runs on its own major generation at the same or a higher minor (sm_80 on 8.6);
        PTX is compiled by the driver for any equal or later architecture.
        """
        if any(a // 10 == arch // 10 and a <= arch for a in self.sass):
            return True
        return any(a <= arch for a in self.ptx)


def _section(data: bytes | mmap.mmap, name: bytes, path: str) -> tuple[int, int] | None:
    """(offset, size) of ELF64 little-endian section `name`, or None if the file has none."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise FatbinError(f"{path} is not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise FatbinError(f"{path} is not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shentsize != 64 or shstrndx >= shnum or shoff + shnum * 64 > len(data):
        raise FatbinError(f"{path}: its ELF section table lies outside the file")

    def header(index: int) -> tuple[int, int, int]:
        base = shoff + index * 64
        (name_offset,) = struct.unpack_from("<I", data, base)
        offset, size = struct.unpack_from("<QQ", data, base + 0x18)
        return name_offset, offset, size

    _, names_at, names_size = header(shstrndx)
    if names_at + names_size > len(data):
        raise FatbinError(f"{path}: its section names lie outside the file")
    names = data[names_at : names_at + names_size]
    for index in range(shnum):
        name_offset, offset, size = header(index)
        end = names.find(b"\0", name_offset)
        if names[name_offset:end] != name:
            continue
        if offset + size > len(data):
            raise FatbinError(f"{path}: section {name.decode()} lies outside the file")
        return offset, size
    return None


def parse_fatbin(
    data: bytes | mmap.mmap, start: int = 0, end: int | None = None, path: str = ""
) -> Targets:
    """The targets of every container in `data[start:end]`, a `.nv_fatbin` section."""
    end = len(data) if end is None else end
    where = path or "<fatbin>"
    sass: set[int] = set()
    ptx: set[int] = set()
    at = start
    while at < end:
        found = data.find(_MAGIC, at, end)
        gap = data[at : end if found < 0 else found]
        if gap.count(b"\0") != len(gap):  # between containers: zeros, for alignment
            raise FatbinError(f"{where}: no fat-binary container at offset {at - start}")
        if found < 0:
            break
        at = found
        if at + _CONTAINER.size > end:
            raise FatbinError(f"{where}: the container at offset {at - start} is cut short")
        _, _, header_size, size = _CONTAINER.unpack_from(data, at)
        stop = at + header_size + size
        if header_size < _CONTAINER.size or stop > end:
            raise FatbinError(f"{where}: the container at offset {at - start} overruns its section")
        entry = at + header_size
        while entry < stop:
            if entry + _ARCH_OFFSET + 4 > stop:
                raise FatbinError(f"{where}: an entry at offset {entry - start} is cut short")
            kind, _, entry_header, payload = _ENTRY.unpack_from(data, entry)
            if entry_header < _ARCH_OFFSET + 4 or entry + entry_header + payload > stop:
                msg = f"{where}: an entry at offset {entry - start} overruns its container"
                raise FatbinError(msg)
            (arch,) = struct.unpack_from("<I", data, entry + _ARCH_OFFSET)
            if kind == KIND_ELF:
                sass.add(arch)
            elif kind == KIND_PTX:
                ptx.add(arch)
            entry += entry_header + payload
        at = stop
    return Targets(frozenset(sass), frozenset(ptx))


def fatbin_targets(path: str) -> Targets | None:
    """The GPU code in shared object `path`; None when it has no `.nv_fatbin` section."""
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            raise FatbinError(f"{path} is not an ELF file")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            section = _section(data, b".nv_fatbin", path)
            if section is None:
                return None
            offset, size = section
            return parse_fatbin(data, offset, offset + size, path)


def library_version(path: str, symbol: str) -> int:
    """The integer `symbol` reports: a plain `size_t f(void)` or an `int f(int *)` getter."""
    library = ctypes.CDLL(path)
    function = getattr(library, symbol)
    if symbol == "cudnnGetVersion":
        function.restype = ctypes.c_size_t
        function.argtypes = []
        return int(function())
    value = ctypes.c_int(0)
    if symbol == "cublasGetVersion_v2":
        function.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
        status = function(None, ctypes.byref(value))
    else:  # ncclGetVersion, cudaRuntimeGetVersion
        function.argtypes = [ctypes.POINTER(ctypes.c_int)]
        status = function(ctypes.byref(value))
    if status != 0:
        raise OSError(f"{symbol} in {path} returned status {status}")
    return int(value.value)
