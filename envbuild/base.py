"""Make a local base image from Debian with debootstrap, for hosts that cannot pull."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from envbuild.engine import Engine
from envbuild.errors import BadInput, EnvbuildError

DEFAULT_MIRROR = "http://deb.debian.org/debian"


def default_tag(suite: str) -> str:
    """The reference a bootstrapped suite gets unless told otherwise."""
    return f"envbuild/base:{suite}"


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

    With `with_python` the suite's own python3 and venv module are included, so builds on
    this base need no package archive (offline builds from a complete wheelhouse).
    """
    existing = engine.image(tag)
    if existing is not None and not force:
        return existing.id, False
    if shutil.which("debootstrap") is None:
        msg = "debootstrap is not installed; run `apt-get install -y debootstrap` (as root)"
        raise BadInput(msg)
    with tempfile.TemporaryDirectory(prefix="envbuild-rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        include = ["--include=python3,python3-venv"] if with_python else []
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
        with subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE) as tar:
            assert tar.stdout is not None
            image_id = engine.import_rootfs(
                tar.stdout,
                tag,
                changes=[
                    f'LABEL org.envbuild.base="debian-{suite}"',
                    'CMD ["/bin/bash"]',
                ],
            )
        if tar.returncode not in (0, None):
            msg = f"tar of the {suite} root filesystem failed (exit {tar.returncode})"
            raise EnvbuildError(msg)
    return image_id, True
