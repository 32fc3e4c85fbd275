"""Whether this host's kernel runs another platform's binaries for containers (binfmt_misc with
qemu-user-static), and what to type when it does not.

An x86_64 engine builds and runs linux/arm64 images only when the kernel hands aarch64 programs
to qemu; with the F (fix-binary) flag the interpreter is opened when it is registered, so a
container needs no qemu of its own. Debian's `qemu-user-static` registers it that way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from envbuild.core.platforms import ARM64, MACHINE
from envbuild.engine.interface import EngineInfo

BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
MAX_ENTRY_BYTES = (
    4096  # an entry is a few lines; the folder is the kernel's, but bound it all the same
)
# The ELF header bytes binfmt_misc matches for each platform's programs (class, data, machine).
_ELF_MAGIC = {ARM64: "7f454c460201010000000000000000000200b700"}
_INSTALL = "apt-get install -y qemu-user-static"


@dataclass(frozen=True, kw_only=True)
class Registration:
    """One binfmt_misc entry: its name, whether it is enabled, its flags and magic."""

    name: str
    enabled: bool
    flags: str
    magic: str
    mask: str
    interpreter: str

    def matches(self, magic: str) -> bool:
        """True when a program starting with `magic` (hex) is handed to this interpreter."""
        try:
            ours, theirs = bytes.fromhex(magic), bytes.fromhex(self.magic)
            mask = bytes.fromhex(self.mask) if self.mask else b"\xff" * len(theirs)
        except ValueError:
            return False
        if not theirs or len(theirs) > len(ours) or len(mask) != len(theirs):
            return False
        return all(o & m == t & m for o, t, m in zip(ours, theirs, mask, strict=False))


def parse_entry(name: str, text: str) -> Registration:
    """A binfmt_misc entry file's text (`enabled`, `interpreter …`, `flags: PF`, `magic …`)."""
    fields: dict[str, str] = {}
    enabled = False
    for line in text.splitlines():
        line = line.strip()
        if line == "enabled":
            enabled = True
        key, _, value = line.partition(" ")
        fields[key.rstrip(":")] = value.strip()
    return Registration(
        name=name,
        enabled=enabled,
        flags=fields.get("flags", ""),
        magic=fields.get("magic", "").lower(),
        mask=fields.get("mask", "").lower(),
        interpreter=fields.get("interpreter", ""),
    )


def registrations(folder: Path = BINFMT_DIR) -> tuple[Registration, ...] | None:
    """Every binfmt_misc entry the kernel has, or None when binfmt_misc is not mounted."""
    if not (folder / "register").exists():
        return None
    found = []
    for path in sorted(folder.iterdir()):
        if path.name in ("register", "status") or not path.is_file():
            continue
        try:
            with path.open("rb") as handle:
                text = handle.read(MAX_ENTRY_BYTES).decode("utf-8", errors="replace")
        except OSError:
            continue  # removed while read
        found.append(parse_entry(path.name, text))
    return tuple(found)


def emulation_problem(platform: str, folder: Path = BINFMT_DIR) -> str:
    """ "" when this host's kernel runs `platform`'s programs in containers, else one line
    saying why not and the commands that enable it."""
    magic = _ELF_MAGIC.get(platform)
    if magic is None:
        return f"envbuild knows no emulator for {platform}"
    machine = MACHINE[platform]
    found = registrations(folder)
    if found is None:
        return (
            f"this host cannot run {platform} ({machine}) programs: binfmt_misc is not mounted; "
            f"run `mount -t binfmt_misc binfmt_misc {folder}` and `{_INSTALL}` (as root)"
        )
    matching = [r for r in found if r.matches(magic)]
    if not matching:
        return (
            f"this host cannot run {platform} ({machine}) programs: no emulator is registered "
            f"with binfmt_misc; run `{_INSTALL}` (as root)"
        )
    enabled = [r for r in matching if r.enabled]
    if not enabled:
        return (
            f"this host's {machine} emulator ({matching[0].name}) is registered but disabled; "
            f"run `update-binfmts --enable {matching[0].name}` (as root)"
        )
    if not any("F" in r.flags for r in enabled):
        return (
            f"this host's {machine} emulator ({enabled[0].name}) is registered without the F "
            "flag, so containers would need qemu inside them; register it with F (Debian's "
            f"`{_INSTALL}` does, after `update-binfmts --disable {enabled[0].name}`, as root)"
        )
    return ""


def platform_problem(engine: EngineInfo, platform: str, folder: Path = BINFMT_DIR) -> str:
    """ "" when `engine` can build and run `platform`'s images: its own machine's, or another's
    under this host's emulator when the engine runs on this host. A remote engine's emulation
    cannot be seen from here: its builds say (an exec format error, or the built image's
    platform, which every build checks)."""
    if not engine.platform or engine.platform == platform:
        return ""
    if not engine.address.startswith("unix://"):
        return ""
    return emulation_problem(platform, folder)


def how_platform_runs(engine: EngineInfo, platform: str) -> str:
    """For `doctor`: natively, under emulation, or why not."""
    if engine.platform == platform:
        return "natively"
    problem = platform_problem(engine, platform)
    if problem:
        return f"not here: {problem}"
    if not engine.address.startswith("unix://"):
        return "unknown (a remote engine: its own emulator decides)"
    return "under emulation (qemu, about 10 times slower)"
