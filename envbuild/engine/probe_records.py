"""What a probe found in a base image (its OS and its python3), kept in the cache by image id.

An image id is the digest of the image's configuration, which names each layer of its file
system by digest: the same id is the same files, so what a probe container found in them holds
for as long as the id does. A probe is a container made, started and removed (0.3 s on an idle
engine here, twice that on a busy one) before every build, warm or cold; a record is read
instead.

The record lies in the user's cache, so it is read as any input is: a regular file, bounded in
bytes, each field checked against what a probe can find. Anything else (a link, a FIFO, a record
of another version or of another probe script, a field of the wrong shape) counts as no record:
the image is probed again and the record written over. A record that cannot be written is no
error either; the next build probes again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from envbuild.core.atomic import write_atomically
from envbuild.core.errors import BadInput
from envbuild.core.files import read_small_file
from envbuild.core.places import base_probes_dir

log = logging.getLogger(__name__)

# The record's layout; a record of another is probed again.
RECORD_VERSION = 1
RECORD_LIMIT = 1024  # bytes: a record is under 200
# Only an id of this form names a record: the id comes from the engine, and becomes a file name.
_IMAGE_ID = re.compile(r"sha256:([0-9a-f]{64})")
# What os-release's ID and VERSION_CODENAME hold (lowercase letters, digits, `-`, `_`, `.`), or
# the probe's "unknown"; anything else is probed every time, never recorded.
_OS_WORD = re.compile(r"[a-z0-9._-]{1,64}")
_PYTHON = re.compile(r"[0-9]{1,2}\.[0-9]{1,3}")


@dataclass(frozen=True, kw_only=True)
class ProbeFindings:
    """What the probe script printed about an image: its OS and its python3, if any."""

    os_id: str
    os_codename: str
    python: str | None  # major.minor, None when the image has no python3


def record_path(image_id: str) -> Path | None:
    """Where the record of `image_id` lies; None for an id that cannot name one."""
    match = _IMAGE_ID.fullmatch(image_id)
    if match is None:
        return None
    return base_probes_dir() / f"{match.group(1)}.json"


def recalled(image_id: str, script: str) -> ProbeFindings | None:
    """The recorded findings of `script` in image `image_id`; None when there is no usable one."""
    try:
        path = record_path(image_id)
        if path is None:
            return None
        data = json.loads(read_small_file(path, RECORD_LIMIT, follow_links=False))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError, BadInput) as exc:
        log.debug("the probe record of %s is not usable (%s): probing again", image_id, exc)
        return None
    # type(), not ==: a JSON true or 1.0 equals 1 in Python.
    if not isinstance(data, dict) or type(data.get("version")) is not int:
        return None
    if data["version"] != RECORD_VERSION:
        return None
    if data.get("image") != image_id or data.get("script") != script_digest(script):
        return None
    fields = (data.get("os_id"), data.get("os_codename"), data.get("python"))
    if not _recordable(fields):
        return None
    os_id, codename, python = fields
    return ProbeFindings(os_id=os_id, os_codename=codename, python=python)


def remember(image_id: str, script: str, findings: ProbeFindings) -> None:
    """Record what `script` found in image `image_id`, when the findings have the shape a record
    may hold; a cache that cannot be written is left as it is."""
    if not _recordable((findings.os_id, findings.os_codename, findings.python)):
        return
    record = {
        "version": RECORD_VERSION,
        "image": image_id,
        "script": script_digest(script),
        "os_id": findings.os_id,
        "os_codename": findings.os_codename,
        "python": findings.python,
    }
    try:
        path = record_path(image_id)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, json.dumps(record, sort_keys=True) + "\n")
    except (OSError, BadInput) as exc:
        log.debug("the probe record of %s was not written (%s)", image_id, exc)


def script_digest(script: str) -> str:
    """The probe script's digest: a record holds for the script that made it."""
    return hashlib.sha256(script.encode("utf-8")).hexdigest()


def _recordable(fields: tuple[object, object, object]) -> TypeGuard[tuple[str, str, str | None]]:
    """Whether (os id, os codename, python) have the shape a record may hold, read back or about
    to be written: what the probe script can print (words of os-release's alphabet; python None
    or major.minor)."""
    os_id, os_codename, python = fields
    words = all(isinstance(w, str) and _OS_WORD.fullmatch(w) for w in (os_id, os_codename))
    return words and (
        python is None or (isinstance(python, str) and bool(_PYTHON.fullmatch(python)))
    )
