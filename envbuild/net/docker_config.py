"""Docker's client config (config.json), read the one way: where Docker reads it, a regular file
only, as core.files reads every small file (without blocking, bounded in bytes), its text never
quoted in a message (it may hold credentials). The credentials lookup and the proxy choice both
read it here."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from envbuild.core.errors import BadInput
from envbuild.core.files import FileTooLarge, NotRegularFile, read_small_file

# Docker's config is a few KB; a bigger one is not a config.
MAX_CONFIG_BYTES = 1 << 20


def docker_config_path(environ: Mapping[str, str]) -> Path:
    """Docker's client config: $DOCKER_CONFIG/config.json, else ~/.docker/config.json."""
    directory = environ.get("DOCKER_CONFIG")
    base = Path(directory).expanduser() if directory else Path.home() / ".docker"
    return base / "config.json"


def read_docker_config(path: Path, *, fix: str) -> dict[str, Any] | None:
    """The JSON object in Docker's config at `path`; None when there is no such file (an empty
    file is an empty config). Anything else is one line naming the file, ending with `fix`."""
    try:
        data = read_small_file(path, MAX_CONFIG_BYTES)
    except (FileNotFoundError, NotADirectoryError):
        # NotADirectoryError: HOME (or DOCKER_CONFIG) is a file, so there is no config below it.
        return None
    except NotRegularFile as exc:
        msg = f"Docker's config {path} is not a regular file ({exc.kind}); {fix}"
        raise BadInput(msg) from exc
    except FileTooLarge as exc:
        msg = f"Docker's config {path} is over {MAX_CONFIG_BYTES >> 20} MiB; {fix}"
        raise BadInput(msg) from exc
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or "not a usable file name"
        msg = f"cannot read Docker's config {path}: {reason}; {fix}"
        raise BadInput(msg) from exc
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
