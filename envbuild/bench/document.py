"""The bench document: what `--json` writes, the HTML report draws and the advice cites (JSON
pointers into it); and a document read back (`--compare FILE`), treated as hostile: bounded in
bytes and checked before anything reads a figure."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from envbuild.bench.run import BenchRun
from envbuild.core.errors import BadInput

SCHEMA = "envbuild-bench"
SCHEMA_VERSION = 1
# A document read back (--compare FILE) larger than this is refused, not parsed.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024


def now() -> str:
    """The document's creation time, UTC, to the second."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def bench_document(
    runs: list[BenchRun], host: dict[str, Any], *, budget_s: float, created: str | None = None
) -> dict[str, Any]:
    """The bench document without its advice and comparison (see advise / compare)."""
    return {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "created": created or now(),
        "host": host,
        "budget_s": budget_s,
        "images": [run.as_dict() for run in runs],
        "advice": [],
        "comparison": None,
    }


def load_document(path: Path) -> dict[str, Any]:
    """A bench document written before (`--compare FILE`), checked; BadInput naming the file."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        msg = f"--compare {path}: cannot read it ({exc.strerror}); give a file `envbuild bench --json` wrote, or `last`"
        raise BadInput(msg) from None
    if size > MAX_DOCUMENT_BYTES:
        msg = f"--compare {path}: {size} bytes is more than a bench document can be ({MAX_DOCUMENT_BYTES}); give a file `envbuild bench --json` wrote"
        raise BadInput(msg)
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        msg = f"--compare {path}: not JSON ({type(exc).__name__}); give a file `envbuild bench --json` wrote"
        raise BadInput(msg) from None
    return checked_document(doc, source=f"--compare {path}")


def checked_document(doc: Any, *, source: str) -> dict[str, Any]:
    """``doc`` when it is a bench document of this version with images; BadInput otherwise."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        msg = f'{source}: not an envbuild bench document (no "schema": "{SCHEMA}"); give a file `envbuild bench --json` wrote'
        raise BadInput(msg)
    if doc.get("version") != SCHEMA_VERSION:
        msg = f"{source}: bench document version {doc.get('version')!r}; this envbuild reads version {SCHEMA_VERSION}: run `envbuild bench` again to compare"
        raise BadInput(msg)
    images = doc.get("images")
    if not isinstance(images, list) or not all(isinstance(i, dict) for i in images):
        msg = f'{source}: its "images" is not a list of results; give a file `envbuild bench --json` wrote'
        raise BadInput(msg)
    return doc
