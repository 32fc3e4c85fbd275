"""Which docker client builds with BuildKit: the real clients on this host, no engine asked.

scripts/host-setup.sh installs Debian's docker.io, whose 20.10 client builds with BuildKit under
DOCKER_BUILDKIT=1; a newer client earlier on PATH without buildx cannot, and is passed over."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from envbuild.engine.buildkit import CLIENT_ENV, find_client


def test_a_client_that_builds_with_buildkit_is_found() -> None:
    client, why = find_client()
    assert client is not None, why
    major = int(re.match(r"\d+", client.version).group())  # type: ignore[union-attr]
    assert client.buildx or major < 23
    assert Path(client.path).is_file()
    assert client.path in client.describe()


def test_a_named_client_that_is_not_docker_is_refused_with_why(tmp_path: Path) -> None:
    true = shutil.which("true")
    assert true is not None
    for named, said in ((true, "not a docker client"), (str(tmp_path / "none"), "cannot run it")):
        client, why = find_client({CLIENT_ENV: named, "PATH": "/usr/bin:/bin"})
        assert client is None
        assert why.startswith(f"{named}: {said}"), why
        assert "\n" not in why


def test_with_no_client_on_path_debians_is_found(tmp_path: Path) -> None:
    client, why = find_client({"PATH": str(tmp_path)})
    assert client is not None, why
    assert (client.path, client.buildx) == ("/usr/bin/docker", False)
