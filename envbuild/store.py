"""The record of smoke results and publications, keyed by image id (SQLite in the user's data dir)."""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from envbuild.models import SmokeResult

_SCHEMA = """
CREATE TABLE IF NOT EXISTS smoke (
    image_id TEXT NOT NULL,
    image_ref TEXT NOT NULL,
    passed INTEGER NOT NULL,
    report TEXT NOT NULL,
    created TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS smoke_image ON smoke (image_id, created);
CREATE TABLE IF NOT EXISTS published (
    image_id TEXT NOT NULL,
    reference TEXT NOT NULL,
    digest TEXT NOT NULL,
    created TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS published_image ON published (image_id);
"""


def data_dir() -> Path:
    """ENVBUILD_DATA_DIR, else $XDG_DATA_HOME/envbuild, else ~/.local/share/envbuild."""
    explicit = os.environ.get("ENVBUILD_DATA_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "envbuild"


@dataclass(frozen=True, kw_only=True)
class SmokeRecord:
    """The latest smoke result recorded for an image id."""

    image_id: str
    image_ref: str
    passed: bool
    report: dict[str, Any]
    created: str


@dataclass(frozen=True, kw_only=True)
class PublishedRecord:
    """A reference in a registry whose digest was verified to be this image."""

    image_id: str
    reference: str
    digest: str
    created: str


class ResultStore:
    """Smoke results and publications; every write is its own transaction."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._connect() as db:
            db.executescript(_SCHEMA)

    @classmethod
    def default(cls) -> ResultStore:
        """The store in the user's data directory."""
        return cls(data_dir() / "results.sqlite3")

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.path, timeout=30)) as db, db:
            yield db

    def record_smoke(self, result: SmokeResult) -> None:
        """Keep a smoke result for the exact image id it ran on."""
        with self._connect() as db:
            db.execute(
                "INSERT INTO smoke VALUES (?, ?, ?, ?, ?)",
                (
                    result.image_id,
                    result.image,
                    int(result.passed),
                    json.dumps(result.as_dict()),
                    _now(),
                ),
            )

    def latest_smoke(self, image_id: str) -> SmokeRecord | None:
        """The newest smoke result for this image id, passing or not."""
        with self._connect() as db:
            row = db.execute(
                "SELECT image_id, image_ref, passed, report, created FROM smoke "
                "WHERE image_id = ? ORDER BY created DESC, rowid DESC LIMIT 1",
                (image_id,),
            ).fetchone()
        if row is None:
            return None
        return SmokeRecord(
            image_id=row[0],
            image_ref=row[1],
            passed=bool(row[2]),
            report=json.loads(row[3]),
            created=row[4],
        )

    def record_published(self, image_id: str, reference: str, digest: str) -> None:
        """Keep a verified publication."""
        with self._connect() as db:
            db.execute(
                "INSERT INTO published VALUES (?, ?, ?, ?)", (image_id, reference, digest, _now())
            )

    def publications(self, image_id: str) -> list[PublishedRecord]:
        """Every verified publication of this image id, oldest first."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT image_id, reference, digest, created FROM published WHERE image_id = ? ORDER BY rowid",
                (image_id,),
            ).fetchall()
        return [
            PublishedRecord(image_id=r[0], reference=r[1], digest=r[2], created=r[3]) for r in rows
        ]


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
