"""Make a local base image from Debian with debootstrap, for hosts that cannot pull."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from envbuild.core.errors import BadInput, EnvbuildError
from envbuild.engine.interface import Engine

DEFAULT_MIRROR = "http://deb.debian.org/debian"


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
) -> tuple[str, bool]:
    """debootstrap a minimal `suite` and import it as `tag`; return (image id, created).

    With `with_python` the suite's own python3 and venv module are included, and what
    torch.compile needs at run time (g++ with gcc, Python's headers), so builds on this base
    need no package archive (offline builds from a complete wheelhouse). The .debs debootstrap
    downloaded are left out of the image.
    """
    existing = engine.image(tag)
    packages = ",".join(WITH_PYTHON) if with_python else ""
    # A base made before the package set changed (or without python) is made again.
    if existing is not None and not force and existing.labels.get(PACKAGES_LABEL, "") == packages:
        return existing.id, False
    if shutil.which("debootstrap") is None:
        msg = "debootstrap is not installed; run `apt-get install -y debootstrap` (as root)"
        raise BadInput(msg)
    with tempfile.TemporaryDirectory(prefix="envbuild-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        include = [f"--include={','.join(WITH_PYTHON)}"] if with_python else []
        result = subprocess.run(
            ["debootstrap", "--variant=minbase", *include, suite, str(root), mirror],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            tail = " | ".join(
                result.stdout.strip().splitlines()[-3:] + result.stderr.strip().splitlines()[-3:]
            )
            msg = f"debootstrap {suite} from {mirror} failed (exit {result.returncode}): {tail}"
            raise EnvbuildError(msg)
        for deb in (root / "var" / "cache" / "apt" / "archives").glob("*.deb"):
            deb.unlink()  # apt-get clean's part: the image keeps no downloaded packages
        with subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE) as tar:
            assert tar.stdout is not None
            image_id = engine.import_rootfs(
                tar.stdout,
                tag,
                changes=[
                    f'LABEL org.envbuild.base="debian-{suite}"',
                    f'LABEL {PACKAGES_LABEL}="{packages}"',
                    'CMD ["/bin/bash"]',
                ],
            )
        if tar.returncode not in (0, None):
            msg = f"tar of the {suite} root filesystem failed (exit {tar.returncode})"
            raise EnvbuildError(msg)
    return image_id, True
