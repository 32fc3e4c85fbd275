"""What a CUDA environment holds, read without a GPU or a driver (stdlib only).

Runs inside an image (copied beside the smoke payloads) and on the host's tests alike:

* `fatbin_targets(path)`: the GPU code compiled into a shared object, read from its
  `.nv_fatbin` ELF section: each fat-binary container (magic 0xBA55ED50) holds entries whose
  headers name their kind (PTX or ELF, i.e. SASS machine code) and their `sm_` architecture.
* `library_version(path, symbol)`: a version a CUDA library reports about itself
  (`cudnnGetVersion`, `ncclGetVersion`, `cudaRuntimeGetVersion`, `cublasGetVersion_v2`),
  loaded with ctypes; none of these needs a GPU; `read_versions` asks each in a child process;
* `unresolved(libraries, system)`: the libraries the environment's shared objects need
  (DT_NEEDED, read by `dynamic`) that neither their RUNPATH, the system nor the environment
  itself provides;
* `payload_body`: the payload, one JSON report as the framework payloads give (sections
  closure, versions, archs), run by smoke_harness.

One module, not several, because the host imports it (`Targets`) and a payload module the
host imports may import no sibling when it loads.

Bounded for hostile files: a section or a container that does not add up is an error naming
the file, never a loop or an unbounded read.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import platform
import re
import signal
import site
import struct
import subprocess
import sys
import time
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


# The driver's own libraries: mounted into a container by the NVIDIA runtime, never in an image.
DRIVER_LIBRARIES = ("libcuda.so", "libcuda.so.1", "libnvidia-ml.so.1")
# Where the dynamic loader looks after a library's own RUNPATH (Debian's multiarch first: the
# image's machine's, x86_64 or aarch64).
SYSTEM_DIRS = (
    f"/lib/{platform.machine()}-linux-gnu", f"/usr/lib/{platform.machine()}-linux-gnu",
    "/lib64", "/usr/lib64", "/lib", "/usr/lib", "/usr/local/lib",
)  # fmt: skip
MAX_LIBRARIES = 20_000  # a walk that finds more is not an environment: stop and say so
_DT_NEEDED, _DT_RPATH, _DT_RUNPATH = 1, 15, 29


@dataclass(frozen=True)
class Dynamic:
    """What a shared object asks of the dynamic loader."""

    needed: tuple[str, ...]
    search: tuple[str, ...]  # its RUNPATH (or RPATH) folders, $ORIGIN expanded


def dynamic(path: str) -> Dynamic:
    """DT_NEEDED and DT_RUNPATH/DT_RPATH of ELF file `path` (from .dynamic and .dynstr)."""
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            raise FatbinError(f"{path} is not an ELF file")
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            table = _section(data, b".dynamic", path)
            strings = _section(data, b".dynstr", path)
            if table is None or strings is None:
                return Dynamic(needed=(), search=())
            (table_at, table_size), (strings_at, strings_size) = table, strings

            def text(offset: int) -> str:
                if offset >= strings_size:
                    raise FatbinError(f"{path}: a .dynamic string lies outside .dynstr")
                start = strings_at + offset
                end = data.find(b"\0", start, strings_at + strings_size)
                end = strings_at + strings_size if end < 0 else end
                return data[start:end].decode("utf-8", "replace")

            needed, search = [], []
            origin = os.path.dirname(os.path.abspath(path))
            for at in range(table_at, table_at + table_size - 15, 16):
                tag, value = struct.unpack_from("<qQ", data, at)
                if tag == 0:
                    break
                if tag == _DT_NEEDED:
                    needed.append(text(value))
                elif tag in (_DT_RPATH, _DT_RUNPATH):
                    for folder in text(value).split(":"):
                        folder = folder.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)
                        search.append(os.path.normpath(folder))
            return Dynamic(needed=tuple(needed), search=tuple(search))


def shared_objects(roots: list[str]) -> list[str]:
    """Every ELF shared object (a regular file named *.so or *.so.N…) under `roots`."""
    found = []
    for root in roots:
        for folder, _, files in os.walk(root):
            for name in files:
                if ".so" not in name or name.endswith((".py", ".pyc", ".pyi", ".txt")):
                    continue
                path = os.path.join(folder, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                with open(path, "rb") as handle:
                    if handle.read(4) != b"\x7fELF":
                        continue
                found.append(path)
                if len(found) > MAX_LIBRARIES:
                    raise FatbinError(f"more than {MAX_LIBRARIES} shared objects under {roots}")
    return sorted(found)


def unresolved(libraries: list[str], system: set[str]) -> list[tuple[str, str]]:
    """(library, name) for each needed library found neither on the library's own RUNPATH,
    nor among the system's (`system`: names in the loader's folders and cache), nor in the
    environment itself (a framework loads its CUDA libraries before the libraries needing
    them, so a name there resolves); the driver's own libraries are not asked for."""
    in_environment = {os.path.basename(path) for path in libraries}
    for path in libraries:  # the names a library answers to through its symlinks, too
        folder = os.path.dirname(path)
        in_environment.update(
            name for name in os.listdir(folder) if os.path.islink(os.path.join(folder, name))
        )
    missing = []
    for path in libraries:
        try:
            wants = dynamic(path)
        except (FatbinError, OSError, struct.error) as exc:
            missing.append((path, f"unreadable: {exc}"))
            continue
        for name in wants.needed:
            if name in DRIVER_LIBRARIES or name in system or name in in_environment:
                continue
            if any(os.path.exists(os.path.join(folder, name)) for folder in wants.search):
                continue
            missing.append((path, name))
    return missing


def system_libraries() -> set[str]:
    """The library names the loader finds without a RUNPATH: its folders and ld.so.cache."""
    names: set[str] = set()
    for folder in SYSTEM_DIRS:
        if os.path.isdir(folder):
            names.update(os.listdir(folder))
    for ldconfig in ("/sbin/ldconfig", "/usr/sbin/ldconfig"):
        if os.access(ldconfig, os.X_OK):
            listed = subprocess.run(
                [ldconfig, "-p"], capture_output=True, text=True, timeout=60, check=False
            )
            names.update(line.split()[0] for line in listed.stdout.splitlines()[1:] if line.strip())
            break
    return names


# (report key, file name, getter): the environment's own copies, found by name.
VERSION_LIBRARIES = (
    ("cudnn", r"libcudnn\.so\.\d+$", "cudnnGetVersion"),
    ("nccl", r"libnccl\.so\.\d+$", "ncclGetVersion"),
    ("cuda_runtime", r"libcudart\.so\.\d+$", "cudaRuntimeGetVersion"),
    ("cublas", r"libcublas\.so\.\d+$", "cublasGetVersion_v2"),
)
VERSION_TIMEOUT_S = 60.0


def version_text(key: str, number: int) -> str:
    """A library's integer version as text: cuDNN 90100 -> 9.1.0 (8902 -> 8.9.2), NCCL 22005 ->
    2.20.5, the CUDA runtime 12010 -> 12.1, cuBLAS 120103 -> 12.1.3."""
    if key == "cuda_runtime":
        return f"{number // 1000}.{number % 1000 // 10}"
    if (key == "cudnn" and number < 90000) or (key == "nccl" and number < 10000):
        major, rest = divmod(number, 1000)
    else:
        major, rest = divmod(number, 10000)
    return f"{major}.{rest // 100}.{rest % 100}"


def read_versions(libraries: list[str]) -> tuple[dict[str, list[dict[str, str]]], list[str]]:
    """Each VERSION_LIBRARIES library's own version, asked in a child process (a library that
    crashes its loader cannot take the payload down); ({key: [{path, version}]}, errors)."""
    asks = [
        (key, path, symbol)
        for key, pattern, symbol in VERSION_LIBRARIES
        for path in libraries
        if re.fullmatch(pattern, os.path.basename(path))
    ]
    found: dict[str, list[dict[str, str]]] = {key: [] for key, _, _ in VERSION_LIBRARIES}
    errors: list[str] = []
    for key, path, symbol in asks:
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--version-of", path, symbol],
            capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, check=False,
        )  # fmt: skip
        answer = child.stdout.strip()
        if child.returncode != 0 or not answer.isdigit():
            code = child.returncode
            status = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
            why = (child.stderr.strip().splitlines() or [status])[-1]
            errors.append(f"{os.path.basename(path)}: {symbol} failed: {why[:300]}")
            continue
        found[key].append({"path": path, "version": version_text(key, int(answer))})
    return found, errors


FRAMEWORK_FOLDERS = {
    "torch": ("torch",),
    "tensorflow": ("tensorflow",),
    "jax": ("jaxlib", "jax_plugins", "jax_cuda12_plugin", "jax_cuda13_plugin", "jax_cuda12_pjrt",
            "jax_cuda13_pjrt"),
}  # fmt: skip


# The host's RDMA, fabric and MPI stack, which NVIDIA's optional plugins link and which no
# wheel ships: NVSHMEM's bootstrap plugins (MPI, PMIx, OpenSHMEM) and transports (IBGDA,
# IBDEVX, UCX, libfabric), loaded only when NVSHMEM_BOOTSTRAP / NVSHMEM_REMOTE_TRANSPORT choose
# them, and cuFile's RDMA layer (GPUDirect Storage over InfiniBand). Measured here: the aarch64
# torch 2.11.0+cu130 environment holds nine such needs and trains without them. Sources: NVSHMEM's
# environment variables (docs.nvidia.com/nvshmem/api/gen/env.html); Arch Linux's nvshmem
# package lists openmpi, openpmix, openucx, libfabric and rdma-core as optional, per plugin.
HOST_STACK = frozenset({
    "libibverbs.so.1", "librdmacm.so.1", "libmlx5.so.1", "libmpi.so.40", "libpmix.so.2",
    "liboshmem.so.40", "libfabric.so.1", "libucp.so.0", "libucs.so.0", "libuct.so.0",
    "libucm.so.0",
})  # fmt: skip


def split_missing(
    missing: list[tuple[str, str]], roots: list[str], framework: str
) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The unresolved needs of the framework's own libraries and NVIDIA's wheels, which must be
    whole, and those of optional extensions, which are reported but do not fail the image: other
    packages' (numba's TBB layer, cupy's cuTENSOR binding) and NVIDIA's plugins for the host's
    RDMA and MPI stack (HOST_STACK); paths relative to site-packages."""
    framework_folders = FRAMEWORK_FOLDERS.get(framework, (framework,))
    must: list[dict[str, str]] = []
    elsewhere: list[dict[str, str]] = []
    for path, name in missing:
        relative = os.path.relpath(path, roots[0]) if roots else path
        folder = top_folder(path, roots)
        required = folder in framework_folders or (folder == "nvidia" and name not in HOST_STACK)
        (must if required else elsewhere).append({"library": relative, "needs": name})
    return must, elsewhere


def top_folder(path: str, roots: list[str]) -> str:
    """The top folder of `path` under the site-packages folder that holds it ("torch")."""
    for root in roots:
        if path.startswith(root + os.sep):
            return os.path.relpath(path, root).split(os.sep)[0]
    return ""


def framework_library(framework: str, libraries: list[str], roots: list[str]) -> str | None:
    """The framework's library with the most GPU code (torch: libtorch_cuda.so)."""
    folders = FRAMEWORK_FOLDERS.get(framework, (framework,))
    best, best_size = None, 0
    for path in libraries:
        if top_folder(path, roots) not in folders:
            continue
        with open(path, "rb") as handle:
            if os.fstat(handle.fileno()).st_size == 0:
                continue
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
                section = _section(data, b".nv_fatbin", path)
        if section is not None and section[1] > best_size:
            best, best_size = path, section[1]
    return best


def payload_body(run, framework: str) -> None:  # type: ignore[no-untyped-def]
    """The sections: closure, versions, archs (each fills its part of the document)."""
    roots = sorted({os.path.realpath(p) for p in site.getsitepackages() if os.path.isdir(p)})
    found: list[str] = []

    def closure(doc: dict) -> None:  # type: ignore[type-arg]
        started = time.perf_counter()
        found.extend(shared_objects(roots))
        missing = unresolved(found, system_libraries())
        part = doc["closure"]
        part["roots"] = roots
        part["libraries"] = len(found)
        part["missing"], part["missing_elsewhere"] = split_missing(missing, roots, framework)
        part["ok"] = bool(found) and not part["missing"]
        part["seconds"] = round(time.perf_counter() - started, 3)

    def versions(doc: dict) -> None:  # type: ignore[type-arg]
        part = doc["versions"]
        part["libraries"], part["errors"] = read_versions(found)
        part["ok"] = not part["errors"]

    def archs(doc: dict) -> None:  # type: ignore[type-arg]
        started = time.perf_counter()
        part = doc["archs"]
        library = framework_library(framework, found, roots)
        part["library"] = library
        if library is not None:
            targets = fatbin_targets(library)
            assert targets is not None
            part["sass"] = sorted(targets.sass)
            part["ptx"] = sorted(targets.ptx)
            part["describe"] = targets.describe()
        part["ok"] = library is not None
        part["seconds"] = round(time.perf_counter() - started, 3)

    run.section("closure", 240, closure)
    run.section("versions", 120, versions)
    run.section("archs", 120, archs)


CHECKS = (
    ("libraries_resolve", "closure", "ok"),
    ("versions_read", "versions", "ok"),
    ("archs_read", "archs", "ok"),
)


def main(argv: list[str]) -> None:
    """`cuda_static.py FRAMEWORK`: the report; `--version-of PATH SYMBOL`: one version (child)."""
    if argv[:1] == ["--version-of"] and len(argv) == 3:
        print(library_version(argv[1], argv[2]))
        return
    import smoke_harness as harness  # beside this file in the image, as for the payloads

    framework = argv[0] if argv else "torch"
    parts = {"closure": {}, "versions": {}, "archs": {}}
    harness.main(
        "cuda_static",
        lambda run: payload_body(run, framework),
        parts=parts,
        checks=CHECKS,
        extra={"framework": framework},
        total_s=480.0,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
