"""cuda_static: the GPU code a library carries, read from its `.nv_fatbin` without a GPU.

The real case is a library nvcc built (tests/unit/recorded/README.md says how); the same reader
agreed with `cuobjdump --list-elf --list-ptx` on torch 2.11.0+cu130's libtorch_cuda.so on an
H200 machine (benchmarks/gpu_probe.py). The hostile cases are fat binaries cut or inflated by
hand: each must end in a FatbinError naming the file, never a hang or an unbounded read.
"""

from __future__ import annotations

import contextlib
import struct
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envbuild.payload import cuda_static
from envbuild.payload.cuda_static import FatbinError, Targets, fatbin_targets, parse_fatbin

RECORDED = Path(__file__).parent / "recorded"
TINY = RECORDED / "libtiny_kernel.so"


def entry(kind: int, arch: int, payload: bytes = b"\x00" * 16, header: int = 64) -> bytes:
    head = struct.pack("<HHIQ", kind, 0x0101, header, len(payload))
    head += b"\x00" * 12 + struct.pack("<I", arch)  # arch at offset 28
    return head.ljust(header, b"\x00") + payload


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", cuda_static.FATBIN_MAGIC, 1, 16, len(body)) + body


def test_the_library_nvcc_built_carries_what_its_command_line_asked_for() -> None:
    targets = fatbin_targets(str(TINY))
    assert targets == Targets(sass=frozenset({75, 80, 90}), ptx=frozenset({90}))
    assert targets.describe() == "sm_75, sm_80, sm_90; PTX compute_90"


def test_a_library_without_gpu_code_has_no_targets() -> None:
    assert fatbin_targets(str(Path(sys.executable).resolve())) is None


@pytest.mark.parametrize(
    ("arch", "runs"),
    [(75, True), (80, True), (86, True), (89, True), (90, True), (100, True), (70, False), (61, False)],
)  # fmt: skip
def test_which_gpus_a_library_runs_on(arch: int, runs: bool) -> None:
    # SASS runs within its major generation upwards; PTX compute_90 is JIT-compiled for 9.0+.
    assert fatbin_targets(str(TINY)).runs_on(arch) is runs  # type: ignore[union-attr]


def test_machine_code_alone_does_not_reach_a_later_generation() -> None:
    sass_only = Targets(sass=frozenset({80, 90}), ptx=frozenset())
    assert sass_only.runs_on(86)
    assert not sass_only.runs_on(120)
    assert sass_only.describe() == "sm_80, sm_90; no PTX"


def test_containers_separated_by_alignment_zeros_are_all_read() -> None:
    data = container(entry(2, 70)) + b"\x00" * 5 + container(entry(1, 80), entry(2, 120))
    assert parse_fatbin(data) == Targets(sass=frozenset({70, 120}), ptx=frozenset({80}))


def test_an_entry_of_another_kind_is_skipped() -> None:
    assert parse_fatbin(container(entry(4, 99), entry(2, 90))).sass == frozenset({90})


HOSTILE = {
    "garbage before a container": b"junk" + b"\x00" * 4 + container(entry(2, 90)),
    "garbage after a container": container(entry(2, 90)) + b"\x01",
    "container header cut short": container(entry(2, 90))[:10],
    "container longer than its section": container(entry(2, 90))[:-1],
    "entry longer than its container": container(entry(2, 90, payload=b"\x00" * 8)).replace(
        struct.pack("<Q", 8), struct.pack("<Q", 2**40), 1
    ),
    "entry header smaller than its fields": container(entry(2, 90, header=16)),
    "entry cut inside its header": container(entry(2, 90))[:40].replace(
        struct.pack("<Q", 64 + 16), struct.pack("<Q", 24), 1
    ),
    "container header size below its fields": struct.pack(
        "<IHHQ", cuda_static.FATBIN_MAGIC, 1, 4, 0
    ),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_broken_fat_binary_is_one_error_naming_the_file(case: str) -> None:
    with pytest.raises(FatbinError, match=r"libbad\.so"):
        parse_fatbin(HOSTILE[case], path="libbad.so")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400), st.integers(min_value=0, max_value=400))
def test_any_bytes_end_in_targets_or_a_fatbin_error(tail: bytes, cut: int) -> None:
    data = (container(entry(2, 90), entry(1, 90)) + tail)[:cut]
    with contextlib.suppress(FatbinError):
        parse_fatbin(data)


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "not an ELF file"),
        (b"#!/bin/sh\n" * 10, "not an ELF file"),
        (b"\x7fELF\x01\x01" + b"\x00" * 80, "not a 64-bit little-endian ELF file"),
    ],
)
def test_a_file_that_is_not_a_library_is_named(tmp_path: Path, content: bytes, reason: str) -> None:
    path = tmp_path / "libfake.so"
    path.write_bytes(content)
    with pytest.raises(FatbinError, match=rf"libfake\.so.*{reason}"):
        fatbin_targets(str(path))


def test_a_section_table_past_the_end_of_the_file_is_named(tmp_path: Path) -> None:
    data = bytearray(TINY.read_bytes())
    struct.pack_into("<Q", data, 0x28, len(data) + 4096)  # e_shoff past the end
    path = tmp_path / "libcut.so"
    path.write_bytes(bytes(data))
    with pytest.raises(FatbinError, match=r"libcut\.so: its ELF section table lies outside"):
        fatbin_targets(str(path))


def test_a_truncated_library_is_named(tmp_path: Path) -> None:
    path = tmp_path / "libhalf.so"
    path.write_bytes(TINY.read_bytes()[: TINY.stat().st_size // 2])
    with pytest.raises(FatbinError, match=r"libhalf\.so"):
        fatbin_targets(str(path))


# -- the static payload: library closure and self-reported versions ------------------------------

ELF = RECORDED / "elf"


def environment(tmp_path: Path, layout: dict[str, str]) -> Path:
    """A site-packages folder holding recorded libraries at the given relative paths."""
    site = tmp_path / "site-packages"
    for relative, name in layout.items():
        target = site / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((ELF / name).read_bytes())
    return site


def test_a_library_names_what_it_needs_and_where_it_looks() -> None:
    found = cuda_static.dynamic(str(ELF / "libneeds_b.so"))
    assert found.needed == ("libneed_b.so.1",)
    assert found.search == (str(ELF.parent / "deps"),)  # $ORIGIN expanded


def test_a_library_found_on_its_runpath_resolves(tmp_path: Path) -> None:
    site = environment(
        tmp_path,
        {"pkg/lib/libneeds_b.so": "libneeds_b.so", "pkg/deps/libneed_b.so.1": "libneed_b.so.1"},
    )
    libraries = cuda_static.shared_objects([str(site)])
    assert [Path(p).name for p in libraries] == ["libneed_b.so.1", "libneeds_b.so"]
    assert cuda_static.unresolved(libraries, system=set()) == []


def test_a_library_the_image_lacks_is_named(tmp_path: Path) -> None:
    site = environment(tmp_path, {"pkg/lib/libneeds_b.so": "libneeds_b.so"})
    libraries = cuda_static.shared_objects([str(site)])
    assert cuda_static.unresolved(libraries, system=set()) == [
        (str(site / "pkg/lib/libneeds_b.so"), "libneed_b.so.1")
    ]
    # The same name among the system's libraries (the loader's folders and cache) resolves.
    assert cuda_static.unresolved(libraries, system={"libneed_b.so.1"}) == []


def test_a_library_elsewhere_in_the_environment_resolves(tmp_path: Path) -> None:
    # Frameworks load their CUDA libraries first; a later library's need is met by name.
    site = environment(
        tmp_path,
        {"a/libneeds_b.so": "libneeds_b.so", "nvidia/x/lib/libneed_b.so.1": "libneed_b.so.1"},
    )
    assert cuda_static.unresolved(cuda_static.shared_objects([str(site)]), system=set()) == []


def test_a_broken_library_is_reported_not_fatal(tmp_path: Path) -> None:
    site = environment(tmp_path, {"pkg/libneeds_b.so": "libneeds_b.so"})
    broken = site / "pkg" / "libbroken.so"
    broken.write_bytes((ELF / "libneeds_b.so").read_bytes()[:200])
    missing = dict(cuda_static.unresolved(cuda_static.shared_objects([str(site)]), system=set()))
    assert missing[str(broken)].startswith("unreadable: ")
    assert missing[str(site / "pkg/libneeds_b.so")] == "libneed_b.so.1"


def test_the_driver_libraries_are_never_asked_for() -> None:
    assert {"libcuda.so.1", "libnvidia-ml.so.1"} <= set(cuda_static.DRIVER_LIBRARIES)


@pytest.mark.parametrize(
    ("key", "number", "text"),
    [
        ("cudnn", 90100, "9.1.0"),
        ("cudnn", 91900, "9.19.0"),
        ("cudnn", 8902, "8.9.2"),
        ("nccl", 22005, "2.20.5"),
        ("nccl", 2708, "2.7.8"),
        ("cuda_runtime", 12010, "12.1"),
        ("cuda_runtime", 13000, "13.0"),
        ("cublas", 120103, "12.1.3"),
    ],
)
def test_library_versions_read_as_the_libraries_mean_them(key: str, number: int, text: str) -> None:
    assert cuda_static.version_text(key, number) == text


def test_versions_come_from_the_libraries_and_a_crashing_one_is_reported(tmp_path: Path) -> None:
    site = environment(
        tmp_path,
        {
            "nvidia/cudnn/lib/libcudnn.so.9": "libcudnn.so.9",
            "nvidia/nccl/lib/libnccl.so.2": "libnccl.so.2",
        },
    )
    found, errors = cuda_static.read_versions(cuda_static.shared_objects([str(site)]))
    assert found["cudnn"] == [
        {"path": str(site / "nvidia/cudnn/lib/libcudnn.so.9"), "version": "9.1.0"}
    ]
    assert found["nccl"] == []
    (error,) = errors
    assert error == "libnccl.so.2: ncclGetVersion failed: killed by SIGABRT"


def test_only_the_frameworks_and_nvidias_libraries_must_be_whole() -> None:
    root = "/opt/venv/lib/python3.11/site-packages"
    missing = [
        (f"{root}/torch/lib/libtorch_cuda.so", "libcudnn.so.9"),
        (f"{root}/nvidia/cudnn/lib/libcudnn_ops.so.9", "libcublas.so.12"),
        (f"{root}/numba/np/ufunc/tbbpool.cpython-311-x86_64-linux-gnu.so", "libtbb.so.12"),
    ]
    must, elsewhere = cuda_static.split_missing(missing, [root], "torch")
    assert must == [
        {"library": "torch/lib/libtorch_cuda.so", "needs": "libcudnn.so.9"},
        {"library": "nvidia/cudnn/lib/libcudnn_ops.so.9", "needs": "libcublas.so.12"},
    ]
    assert elsewhere == [
        {
            "library": "numba/np/ufunc/tbbpool.cpython-311-x86_64-linux-gnu.so",
            "needs": "libtbb.so.12",
        }
    ]
    # For JAX, torch's folder is just another package's.
    must, _ = cuda_static.split_missing(missing[:1], [root], "jax")
    assert must == []


def test_nvidias_plugins_for_the_hosts_rdma_and_mpi_stack_are_optional() -> None:
    # Measured in the aarch64 torch 2.11.0+cu130 image: NVSHMEM's bootstrap and transport
    # plugins and cuFile's RDMA layer link the host's stack, which no wheel ships.
    root = "/opt/venv/lib/python3.11/site-packages"
    missing = [
        (f"{root}/nvidia/nvshmem/lib/nvshmem_bootstrap_mpi.so.3", "libmpi.so.40"),
        (f"{root}/nvidia/nvshmem/lib/nvshmem_transport_ibgda.so.3", "libmlx5.so.1"),
        (f"{root}/nvidia/cu13/lib/libcufile_rdma.so.1", "libibverbs.so.1"),
        (f"{root}/nvidia/nvshmem/lib/libnvshmem_host.so.3", "libcudart.so.13"),
        (f"{root}/torch/lib/libtorch_cuda.so", "libibverbs.so.1"),  # the framework's: must
    ]
    must, elsewhere = cuda_static.split_missing(missing, [root], "torch")
    assert must == [
        {"library": "nvidia/nvshmem/lib/libnvshmem_host.so.3", "needs": "libcudart.so.13"},
        {"library": "torch/lib/libtorch_cuda.so", "needs": "libibverbs.so.1"},
    ]
    assert [m["needs"] for m in elsewhere] == ["libmpi.so.40", "libmlx5.so.1", "libibverbs.so.1"]
