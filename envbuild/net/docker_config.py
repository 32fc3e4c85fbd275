"""Docker's client config (config.json), read the one way: where Docker reads it, a regular file
only, opened without blocking and bounded in bytes, its text never quoted in a message (it may
hold credentials). The credentials lookup and the proxy choice both read it here."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envbuild.core.errors import BadInput

# Docker's config is a few KB; a bigger one is not a config.
MAX_CONFIG_BYTES = 1 << 20
# O_NONBLOCK: a FIFO swapped in after the check must not hang the read.
_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)


def docker_config_path(environ: Mapping[str, str]) -> Path:
    """Docker's client config: $DOCKER_CONFIG/config.json, else ~/.docker/config.json."""
    directory = environ.get("DOCKER_CONFIG")
    base = Path(directory).expanduser() if directory else Path.home() / ".docker"
    return base / "config.json"


def read_docker_config(path: Path, *, fix: str) -> dict[str, Any] | None:
    """The JSON object in Docker's config at `path`; None when there is no such file (an empty
    file is an empty config). Anything else is one line naming the file, ending with `fix`."""
    try:
        fd = os.open(path, _FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        msg = f"cannot read Docker's config {path}: {exc.strerror}; {fix}"
        raise BadInput(msg) from exc
    try:
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                msg = f"Docker's config {path} is not a regular file; {fix}"
                raise BadInput(msg)
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        msg = f"cannot read Docker's config {path}: {exc.strerror}; {fix}"
        raise BadInput(msg) from exc
    if len(data) > MAX_CONFIG_BYTES:
        msg = f"Docker's config {path} is over {MAX_CONFIG_BYTES >> 20} MiB; {fix}"
        raise BadInput(msg)
    try:
        document: Any = json.loads(data.decode("utf-8")) if data.strip() else {}
    except (ValueError, RecursionError) as exc:
        # The position only: the text may hold credentials.
        where = f" (line {exc.lineno})" if isinstance(exc, json.JSONDecodeError) else ""
        msg = f"Docker's config {path} is not valid UTF-8 JSON{where}; {fix}"
        raise BadInput(msg) from None
    if not isinstance(document, dict):
        msg = f"Docker's config {path} is not a JSON object; {fix}"
        raise BadInput(msg)
    return document
