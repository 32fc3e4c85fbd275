"""Building for another platform: the host's emulator (binfmt_misc), bases per platform, the
platform a built image records, the uv an image of another machine runs, and the archive a
bootstrapped base is loaded from.

binfmt_misc is read from folders laid out as the kernel's; the engine is the in-memory double;
the knowledge base, planning and rendering are real.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from envbuild.build.bootstrap import write_image_archive
from envbuild.build.entry import check_built_platform, prepare
from envbuild.build.server import elf_machine, find_uv, uv_for
from envbuild.core.errors import BadInput, BuildFailed, EnvbuildError
from envbuild.core.models import BuildOptions, Entry, Knowledge, Lock, Selection
from envbuild.core.platforms import AMD64, ARM64, platform_ref
from envbuild.engine.interface import EngineInfo
from envbuild.host.emulation import emulation_problem, parse_entry, platform_problem
from envbuild.plan.matrix import knowledge_matrix, make_plan
from envbuild.plan.matrix_file import default_matrix_path, load_matrix
from tests.support.engine_double import InMemoryEngine
from tests.support.registry_server import free_port

DEBIAN_AARCH64 = """enabled
interpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P
flags: PF
offset 0
magic 7f454c460201010000000000000000000200b700
mask ffffffffffffff00fffffffffffffffffeffffff
"""
RISCV = DEBIAN_AARCH64.replace("0200b700", "0200f300").replace("aarch64", "riscv64")


def binfmt(tmp_path: Path, **entries: str) -> Path:
    """A folder laid out as /proc/sys/fs/binfmt_misc with these entries."""
    folder = tmp_path / "binfmt_misc"
    folder.mkdir()
    (folder / "register").write_text("")
    (folder / "status").write_text("enabled\n")
    for name, text in entries.items():
        (folder / name.replace("_", "-")).write_text(text)
    return folder


def test_debians_registration_runs_arm64_programs(tmp_path: Path) -> None:
    assert emulation_problem(ARM64, binfmt(tmp_path, qemu_aarch64=DEBIAN_AARCH64)) == ""


def test_the_mask_lets_any_os_abi_byte_through() -> None:
    entry = parse_entry("qemu-aarch64", DEBIAN_AARCH64)
    assert entry.enabled
    assert entry.flags == "PF"
    assert entry.matches("7f454c460201010300000000000000000200b700")  # GNU/Linux OS ABI
    assert not entry.matches("7f454c460201010000000000000000000200f300")  # RISC-V
    assert not entry.matches("7f454c46020101")  # shorter than the magic
    assert not parse_entry("broken", "magic zz\n").matches("7f454c46")


@pytest.mark.parametrize(
    ("entries", "said"),
    [
        (None, "binfmt_misc is not mounted; run `mount -t binfmt_misc binfmt_misc"),
        ({}, "no emulator is registered with binfmt_misc; run `apt-get install -y qemu-user-static"),
        ({"qemu_riscv64": RISCV}, "no emulator is registered"),
        ({"qemu_aarch64": DEBIAN_AARCH64.replace("enabled", "disabled")},
         "registered but disabled; run `update-binfmts --enable qemu-aarch64`"),
        ({"qemu_aarch64": DEBIAN_AARCH64.replace("flags: PF", "flags: P")},
         "registered without the F flag, so containers would need qemu inside them"),
        ({"qemu_aarch64": "enabled\nmagic \n"}, "no emulator is registered"),
    ],
)  # fmt: skip
def test_each_missing_piece_is_one_line_with_its_command(
    tmp_path: Path, entries: dict[str, str] | None, said: str
) -> None:
    if entries is None:
        folder = tmp_path / "unmounted"
        folder.mkdir()
    else:
        folder = binfmt(tmp_path, **entries)
    problem = emulation_problem(ARM64, folder)
    assert said in problem
    assert "\n" not in problem
    assert problem.startswith("this host")


def test_a_hostile_entry_is_read_bounded_and_a_folder_in_it_skipped(tmp_path: Path) -> None:
    folder = binfmt(tmp_path, qemu_aarch64=DEBIAN_AARCH64 + "x" * 100_000)
    (folder / "a-folder").mkdir()
    assert emulation_problem(ARM64, folder) == ""


def info(platform: str, address: str = "unix:///var/run/docker.sock") -> EngineInfo:
    return EngineInfo(
        version="20.10", runtimes=(), cdi_spec_dirs=(), root_dir="", address=address,
        platform=platform,
    )  # fmt: skip


def test_an_engine_builds_its_own_platform_and_a_remote_ones_emulation_is_its_own(
    tmp_path: Path,
) -> None:
    broken = tmp_path / "none"
    broken.mkdir()
    assert platform_problem(info(ARM64), ARM64, broken) == ""
    assert platform_problem(info(AMD64, "tcp://builder:2376"), ARM64, broken) == ""
    assert platform_problem(info(AMD64, "ssh://builder"), ARM64, broken) == ""
    assert "binfmt_misc is not mounted" in platform_problem(info(AMD64), ARM64, broken)
    working = binfmt(tmp_path, qemu_aarch64=DEBIAN_AARCH64)
    assert platform_problem(info(AMD64), ARM64, working) == ""


@pytest.mark.parametrize(
    ("reference", "tagged"),
    [
        ("corp/base:bookworm", "corp/base:bookworm-arm64"),
        ("corp/base", "corp/base:latest-arm64"),
        ("registry:5000/team/base", "registry:5000/team/base:latest-arm64"),
        ("registry:5000/team/base:v1", "registry:5000/team/base:v1-arm64"),
        ("corp/base@sha256:" + "a" * 64, "corp/base@sha256:" + "a" * 64),
        ("sha256:" + "b" * 64, "sha256:" + "b" * 64),
    ],
)
def test_another_platforms_base_has_its_own_tag(reference: str, tagged: str) -> None:
    assert platform_ref(reference, ARM64) == tagged
    assert platform_ref(reference, AMD64) == reference


def arm64_entry(knowledge: Knowledge) -> Entry:
    chosen = Selection(framework="jax", cuda="cpu", platform=ARM64)
    matrix = knowledge_matrix(knowledge, chosen, load_matrix(default_matrix_path(), knowledge))
    entry = make_plan(knowledge, matrix, chosen).entries[-1]
    assert entry.platform == ARM64
    return entry


def a_lock(entry: Entry) -> Lock:
    return Lock(
        entry_id=entry.id, text=f"{entry.install.requirement} \\\n    --hash=sha256:{'0' * 64}\n"
    )


@pytest.fixture
def cached_arm64_uv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An aarch64 uv in envbuild's cache, as uv_for leaves one (only its ELF header matters)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    version = importlib.metadata.version("uv")
    binary = tmp_path / "cache" / "envbuild" / "uv" / f"{version}-aarch64" / "uv"
    binary.parent.mkdir(parents=True)
    binary.write_bytes(elf_header(183))
    return binary


def elf_header(machine: int) -> bytes:
    return b"\x7fELF\x02\x01\x01" + b"\x00" * 11 + machine.to_bytes(2, "little") + b"\x00" * 44


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the case of an x86_64 host")
def test_an_arm64_entry_builds_from_the_platform_tag_and_runs_an_aarch64_uv(
    knowledge: Knowledge, cached_arm64_uv: Path
) -> None:
    entry = arm64_entry(knowledge)
    double = InMemoryEngine()
    double.add_base(entry.base_image, python=entry.python)  # amd64, under the plain tag
    arm64_base = platform_ref(entry.base_image, ARM64)
    double.add_base(arm64_base, python=entry.python, platform=ARM64)

    context = prepare(double, knowledge, entry, BuildOptions(), None, a_lock(entry))

    assert f"FROM {arm64_base} AS runtime" in context.dockerfile
    assert context.served.uv == cached_arm64_uv
    assert elf_machine(cached_arm64_uv) == "aarch64"


def test_an_arm64_entry_on_an_amd64_base_is_refused_with_the_bootstrap_command(
    knowledge: Knowledge, cached_arm64_uv: Path
) -> None:
    entry = arm64_entry(knowledge)
    double = InMemoryEngine()
    double.add_base(entry.base_image, python=entry.python)

    with pytest.raises(BadInput) as caught:
        prepare(double, knowledge, entry, BuildOptions(), None, a_lock(entry))

    assert caught.value.message == (
        f"base image {entry.base_image} is linux/amd64, but {entry.id} is for linux/arm64; make "
        f"one with `envbuild base bootstrap --platform linux/arm64 --tag {entry.base_image}` "
        f"(tagged {platform_ref(entry.base_image, ARM64)}), or pass a linux/arm64 --base-image"
    )


def test_an_image_recorded_as_another_platform_fails_its_build(knowledge: Knowledge) -> None:
    entry = arm64_entry(knowledge)
    double = InMemoryEngine()
    mislabelled = double.add_image("aarch64 programs labelled amd64")
    right = double.add_image("arm64", platform=ARM64)

    with pytest.raises(BuildFailed, match="recorded as linux/amd64 for a linux/arm64 entry"):
        check_built_platform(double, entry, mislabelled)
    with pytest.raises(BuildFailed, match="recorded as nothing"):
        check_built_platform(double, entry, "sha256:" + "0" * 64)
    check_built_platform(double, entry, right)


def test_the_hosts_own_machine_runs_the_hosts_uv() -> None:
    own = {"x86_64": AMD64, "aarch64": ARM64}[os.uname().machine]
    assert uv_for(own, BuildOptions()) == find_uv()
    assert elf_machine(find_uv()) == os.uname().machine


@pytest.mark.parametrize(
    ("header", "machine"),
    [
        (elf_header(62), "x86_64"), (elf_header(183), "aarch64"), (elf_header(243), None),
        (b"#!/bin/sh\n" + b"\x00" * 20, None), (b"\x7fELF", None), (b"", None),
    ],
)  # fmt: skip
def test_the_machine_of_a_program_is_read_from_its_elf_header(
    tmp_path: Path, header: bytes, machine: str | None
) -> None:
    program = tmp_path / "program"
    program.write_bytes(header)
    assert elf_machine(program) == machine
    assert elf_machine(tmp_path / "missing") is None


def test_a_bootstrapped_root_filesystem_loads_as_its_platform(tmp_path: Path) -> None:
    layer = tmp_path / "layer.tar"
    with tarfile.open(layer, "w") as tar:
        info = tarfile.TarInfo("etc/os-release")
        data = b"ID=debian\nVERSION_CODENAME=bookworm\n"
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    archive = tmp_path / "image.tar"
    labels = {"org.envbuild.base": "debian-bookworm"}
    image_id = write_image_archive(
        archive, layer, ref="corp/base:bookworm-arm64", platform=ARM64, labels=labels
    )

    with tarfile.open(archive) as tar:
        (item,) = json.load(tar.extractfile("manifest.json"))  # type: ignore[arg-type]
        config_bytes = tar.extractfile(item["Config"]).read()  # type: ignore[union-attr]
        stored = tar.extractfile(item["Layers"][0]).read()  # type: ignore[union-attr]
    config = json.loads(config_bytes)
    assert image_id == "sha256:" + hashlib.sha256(config_bytes).hexdigest()
    assert (config["os"], config["architecture"], config["variant"]) == ("linux", "arm64", "v8")
    assert config["rootfs"]["diff_ids"] == ["sha256:" + hashlib.sha256(stored).hexdigest()]
    assert stored == layer.read_bytes()
    assert config["config"]["Labels"] == labels
    assert item["RepoTags"] == ["corp/base:bookworm-arm64"]

    double = InMemoryEngine()
    with archive.open("rb") as handle:
        (loaded,) = double.load(handle)
    image = double.image("corp/base:bookworm-arm64")
    assert image is not None
    assert (image.id, image.platform, image.labels) == (loaded, ARM64, labels)


SECRET = "uv-fetch-s3cret-77"


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the case of an x86_64 host")
def test_a_uv_that_cannot_be_fetched_is_one_line_without_the_index_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The index refuses connections: the line names the way out, never the credentials.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    index = f"http://envbuild:{SECRET}@127.0.0.1:{free_port()}/simple"

    with pytest.raises(EnvbuildError) as caught:
        uv_for(ARM64, BuildOptions(index_url=index))

    message = caught.value.message
    assert message.startswith("cannot fetch uv ")
    assert "put its wheel (uv-" in message
    assert "--wheelhouse" in message
    assert SECRET not in message
    assert "\n" not in message
    assert not list((tmp_path / "cache").rglob("*aarch64*"))  # nothing half-made in the cache
