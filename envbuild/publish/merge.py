"""What CI's per-platform jobs published, read from their build reports, for the job that merges
them under one tag (`envbuild publish --merge REPORT...`).

Each job's `build --report` names, per entry, the image the registry holds for it: `pushed` in
this run, or `published` already. The merge job plans the same entries, takes those references
from the reports and publishes the index over each entry's platforms (platform_index). A report
is read as untrusted input: bounded, its shape checked, a bad one named with its place.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from envbuild.core.errors import BadInput
from envbuild.core.files import FileTooLarge, NotRegularFile, read_small_file
from envbuild.core.names import shown

MAX_REPORT_BYTES = 16 << 20  # a report of a few hundred entries is well under 1 MiB
MAX_REPORTS = 64
# host/repository:<tag>-<12 hex of the content hash>@sha256:<64 hex>, as publishing writes it.
_IMMUTABLE = re.compile(
    r"[A-Za-z0-9_./:-]+:[A-Za-z0-9_.-]+-(?P<hash>[0-9a-f]{12})@sha256:[0-9a-f]{64}"
)


def published_hashes(paths: tuple[Path, ...]) -> dict[str, str | None]:
    """Per entry id in the reports: the content hash (its first 12 characters, as the
    immutable tag holds them) of its image in the registry; None for an entry that did not pass
    or was not pushed. BadInput naming the report and the place for anything else."""
    if len(paths) > MAX_REPORTS:
        msg = f"--merge: {len(paths)} reports; give at most {MAX_REPORTS} (one per CI job)"
        raise BadInput(msg)
    found: dict[str, str | None] = {}
    for path in paths:
        for entry_id, content_hash in _read(path).items():
            earlier = found.get(entry_id)
            if earlier is not None and content_hash not in (None, earlier):
                msg = (
                    f"--merge {shown(str(path))}: {entry_id} was published as another "
                    f"image ({content_hash}) than in an earlier report ({earlier}); "
                    "merge the reports of one CI run"
                )
                raise BadInput(msg)
            found[entry_id] = earlier or content_hash
    return found


def _read(path: Path) -> dict[str, str | None]:
    where = f"--merge {shown(str(path))}"
    try:
        data = read_small_file(path, MAX_REPORT_BYTES)
    except FileNotFoundError:
        msg = f"{where}: no such file; give the report.json of each platform's build job"
        raise BadInput(msg) from None
    except NotRegularFile as exc:
        msg = f"{where}: {exc.kind}, not a report; give a report.json of `envbuild build --report`"
        raise BadInput(msg) from None
    except FileTooLarge:
        msg = f"{where}: larger than {MAX_REPORT_BYTES >> 20} MiB; not a build report"
        raise BadInput(msg) from None
    except (OSError, ValueError) as exc:
        msg = f"{where}: cannot read it ({getattr(exc, 'strerror', None) or exc})"
        raise BadInput(msg) from exc
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        msg = f"{where}: not JSON; give a report.json of `envbuild build --report`"
        raise BadInput(msg) from None
    results = document.get("results") if isinstance(document, dict) else None
    if not isinstance(results, list):
        msg = f"{where}: no results list; give a report.json of `envbuild build --report`"
        raise BadInput(msg)
    hashes: dict[str, str | None] = {}
    for number, result in enumerate(results):
        entry_id, content_hash = _result(result, f"{where}: results[{number}]")
        hashes[entry_id] = content_hash
    return hashes


def _result(result: Any, where: str) -> tuple[str, str | None]:
    entry = result.get("entry") if isinstance(result, dict) else None
    entry_id = entry.get("id") if isinstance(entry, dict) else None
    if not isinstance(entry_id, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,200}", entry_id):
        msg = f"{where}: entry.id is missing or not an entry id"
        raise BadInput(msg)
    if result.get("passed") is not True:
        return entry_id, None
    reference = result.get("pushed") or result.get("published")
    if reference is None:
        return entry_id, None  # built without --push: nothing of it is in the registry
    matched = _IMMUTABLE.fullmatch(reference) if isinstance(reference, str) else None
    if matched is None:
        msg = (
            f"{where}: {shown(str(reference), 80)} is not an image reference with its "
            "immutable tag and digest (host/repository:<tag>-<hash>@sha256:...)"
        )
        raise BadInput(msg)
    return entry_id, matched["hash"]
