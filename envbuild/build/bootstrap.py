"""Make a local base image from Debian with debootstrap, for hosts that cannot pull.

The root filesystem is loaded as a `docker save` archive whose config records the platform:
`docker import --platform linux/arm64` records the engine's own architecture instead (measured
on engine 20.10), and an image labelled with the wrong platform builds "successfully" with one
platform's programs labelled as another's. Another platform's suite is made with debootstrap's
two stages, the second run under the host's emulator (qemu-user-static, binfmt_misc).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from envbuild.core.errors import BadInput, EnvbuildError
from envbuild.core.platforms import MACHINE, architecture, host_platform, platform_ref
from envbuild.engine.interface import Engine
from envbuild.host.emulation import emulation_problem

DEFAULT_MIRROR = "http://deb.debian.org/debian"
_PATH = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64"}  # debootstrap's --arch of each machine


def default_tag(suite: str) -> str:
    """The reference a bootstrapped suite gets unless told otherwise."""
    return f"envbuild/base:{suite}"


# What `--with-python` adds to the minimal suite: the OS's python3 and venv, and the compiler
# and headers torch.compile builds its kernels with (templates/partials/python.j2 installs the
# same on a base without them).
WITH_PYTHON = ("python3", "python3-venv", "g++", "libpython3-dev")
PACKAGES_LABEL = "org.envbuild.base-packages"  # what was included beyond the minimal suite


def bootstrap_base(
    engine: Engine,
    *,
    suite: str,
    tag: str,
    mirror: str = DEFAULT_MIRROR,
    with_python: bool = False,
    force: bool = False,
    platform: str | None = None,
) -> tuple[str, str, bool]:
    """debootstrap a minimal `suite` for `platform` (default: this host's) and load it as
    `tag`'s image for that platform (`platform_ref`: tag-arm64 for linux/arm64); return (its
    reference, image id, created).

    With `with_python` the suite's own python3 and venv module are included, and what
    torch.compile needs at run time (g++ with gcc, Python's headers), so builds on this base
    need no package archive (offline builds from a complete wheelhouse). The .debs debootstrap
    downloaded are left out of the image.
    """
    platform = platform or host_platform()
    ref = platform_ref(tag, platform)
    existing = engine.image(ref)
    packages = ",".join(WITH_PYTHON) if with_python else ""
    # A base made before the package set changed (or without python) is made again.
    if (
        existing is not None
        and not force
        and existing.labels.get(PACKAGES_LABEL, "") == packages
        and existing.platform == platform
    ):
        return ref, existing.id, False
    if shutil.which("debootstrap") is None:
        msg = "debootstrap is not installed; run `apt-get install -y debootstrap` (as root)"
        raise BadInput(msg)
    foreign = MACHINE[platform] != os.uname().machine
    if foreign:
        problem = emulation_problem(platform)
        if problem:
            msg = f"--platform {platform}: {problem}"
            raise BadInput(msg)
    with tempfile.TemporaryDirectory(prefix="envbuild-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        include = [f"--include={','.join(WITH_PYTHON)}"] if with_python else []
        stages = [f"--arch={_DEBIAN_ARCH[MACHINE[platform]]}", "--foreign"] if foreign else []
        _run_stage(
            ["debootstrap", "--variant=minbase", *stages, *include, suite, str(root), mirror],
            f"debootstrap {suite} from {mirror}",
        )
        if foreign:  # the packages' own scripts run as the image's programs, under emulation
            _run_stage(
                ["chroot", str(root), "/debootstrap/debootstrap", "--second-stage"],
                f"debootstrap's second stage of {suite} for {platform} (under emulation)",
            )
        for deb in (root / "var" / "cache" / "apt" / "archives").glob("*.deb"):
            deb.unlink()  # apt-get clean's part: the image keeps no downloaded packages
        # Nor apt's package lists (as Debian's own images): a build's `apt-get update` brings
        # its own and removes them, and removing files of the base leaves whiteouts in the
        # layer, which hold the time they were made (templates/partials/python.j2).
        for listed in (root / "var" / "lib" / "apt" / "lists").glob("*"):
            if listed.is_file() and not listed.is_symlink() and listed.name != "lock":
                listed.unlink()
        layer = Path(tmp) / "layer.tar"
        with layer.open("wb") as out:
            _run_stage(["tar", "--numeric-owner", "-C", str(root), "-c", "."], "tar", stdout=out)
        shutil.rmtree(root)
        labels = {"org.envbuild.base": f"debian-{suite}", PACKAGES_LABEL: packages}
        archive = Path(tmp) / "image.tar"
        write_image_archive(archive, layer, ref=ref, platform=platform, labels=labels)
        with archive.open("rb") as handle:
            engine.load(handle)
    image = engine.image(ref)
    if image is None or image.platform != platform:
        recorded = "nothing" if image is None else image.platform
        msg = f"the engine loaded {ref} as {recorded}, not as {platform}"
        raise EnvbuildError(msg)
    return ref, image.id, True


def _run_stage(command: list[str], what: str, stdout: io.BufferedWriter | None = None) -> None:
    """Run one step of the bootstrap; EnvbuildError with its last lines when it fails."""
    result = subprocess.run(
        command,
        stdout=stdout if stdout is not None else subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    if result.returncode != 0:
        out = (result.stdout or b"").decode(errors="replace").strip().splitlines()[-3:]
        err = result.stderr.decode(errors="replace").strip().splitlines()[-3:]
        msg = f"{what} failed (exit {result.returncode}): {' | '.join(out + err)}"
        raise EnvbuildError(msg)


def write_image_archive(
    archive: Path, layer: Path, *, ref: str, platform: str, labels: dict[str, str]
) -> str:
    """Write a `docker save` archive of one image: `layer` (a tar of its root filesystem) and a
    config recording `platform`, `labels` and a shell as its command, tagged `ref`. Return the
    image id the engine will give it (the digest of its config)."""
    digest = hashlib.sha256()
    with layer.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    diff_id = f"sha256:{digest.hexdigest()}"
    created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    config = {
        "architecture": architecture(platform),
        **({"variant": "v8"} if architecture(platform) == "arm64" else {}),
        "os": "linux",
        "created": created,
        "config": {"Env": [_PATH], "Cmd": ["/bin/bash"], "Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": created, "created_by": "envbuild base bootstrap"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
    layer_name = f"{digest.hexdigest()}/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": [layer_name]}]
    with tarfile.open(archive, "w") as tar:
        _add_bytes(tar, "manifest.json", json.dumps(manifest).encode())
        _add_bytes(tar, config_name, config_bytes)
        tar.add(layer, arcname=layer_name, recursive=False)
    return f"sha256:{config_name.removesuffix('.json')}"


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))
