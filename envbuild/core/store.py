"""The record of smoke results, publications and bench figures, keyed by image id (SQLite in the user's data dir)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from envbuild.core.places import DATA_DIR_FIX as _FIX
from envbuild.core.places import StateError, data_dir
from envbuild.core.results import SmokeResult

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
CREATE TABLE IF NOT EXISTS built (
    content_hash TEXT NOT NULL,
    entry_id TEXT NOT NULL,
    image_ref TEXT NOT NULL,
    image_id TEXT NOT NULL,
    created TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS built_hash ON built (content_hash, created);
CREATE TABLE IF NOT EXISTS bench (
    image_id TEXT NOT NULL,
    image_ref TEXT NOT NULL,
    host TEXT NOT NULL,
    result TEXT NOT NULL,
    created TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS bench_image ON bench (image_ref, host, created);
CREATE TABLE IF NOT EXISTS provenance (
    image_id TEXT NOT NULL,
    facts TEXT NOT NULL,
    created TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS provenance_image ON provenance (image_id, created);
"""


@dataclass(frozen=True, kw_only=True)
class SmokeRecord:
    """The latest smoke result recorded for an image id."""

    image_id: str
    passed: bool
    report: dict[str, Any]
    created: str


@dataclass(frozen=True, kw_only=True)
class BuiltRecord:
    """The image envbuild itself built for a content hash (an inherited label proves nothing)."""

    content_hash: str
    entry_id: str
    image_ref: str
    image_id: str
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
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            msg = f"cannot create envbuild's data directory {path.parent}: {exc.strerror}; {_FIX}"
            raise StateError(msg) from None
        if not path.parent.is_dir():
            msg = f"envbuild's data directory {path.parent} is not a directory; {_FIX}"
            raise StateError(msg)
        with self._connect() as db:
            db.executescript(_SCHEMA)

    @classmethod
    def default(cls) -> ResultStore:
        """The store in the user's data directory."""
        return cls(data_dir() / "results.sqlite3")

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        try:
            with closing(sqlite3.connect(self.path, timeout=30)) as db, db:
                yield db
        except sqlite3.Error as exc:
            # "file is not a database", "attempt to write a readonly database", ...
            msg = (
                f"envbuild's record {self.path} cannot be used ({exc}); move the file away to "
                f"start a fresh record, fix its permissions, or {_FIX}"
            )
            raise StateError(msg) from None

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
                "SELECT image_id, passed, report, created FROM smoke "
                "WHERE image_id = ? ORDER BY created DESC, rowid DESC LIMIT 1",
                (image_id,),
            ).fetchone()
        if row is None:
            return None
        try:
            report = json.loads(row[2])
        except ValueError:
            report = None
        if not isinstance(report, dict):
            msg = (
                f"envbuild's record {self.path} holds a damaged smoke report for image "
                f"{image_id[:19]}; vet the image again with `envbuild smoke`, or move the file away"
            )
            raise StateError(msg)
        return SmokeRecord(image_id=row[0], passed=bool(row[1]), report=report, created=row[3])

    def record_built(self, content_hash: str, entry_id: str, image_ref: str, image_id: str) -> None:
        """Keep the id of the image a build produced for this content hash."""
        with self._connect() as db:
            db.execute(
                "INSERT INTO built VALUES (?, ?, ?, ?, ?)",
                (content_hash, entry_id, image_ref, image_id, _now()),
            )

    def built_image(self, content_hash: str) -> BuiltRecord | None:
        """The newest image envbuild built for this content hash, or None."""
        found = self.built_images(content_hash, limit=1)
        return found[0] if found else None

    def built_images(self, content_hash: str, *, limit: int = 100) -> list[BuiltRecord]:
        """The images envbuild built for this content hash, newest first, one per image id: one
        per engine that built it (a local engine, a remote one, rootless, Podman) and per build
        that did not reuse an earlier one (--no-cache)."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT content_hash, entry_id, image_ref, image_id, created FROM built "
                "WHERE content_hash = ? ORDER BY created DESC, rowid DESC LIMIT ?",
                (content_hash, limit * 10),
            ).fetchall()
        found: dict[str, BuiltRecord] = {}
        for row in rows:
            if row[3] not in found and len(found) < limit:
                found[row[3]] = BuiltRecord(
                    content_hash=row[0], entry_id=row[1], image_ref=row[2], image_id=row[3],
                    created=row[4],
                )  # fmt: skip
        return list(found.values())

    def record_provenance(self, image_id: str, facts: dict[str, Any]) -> None:
        """Keep how envbuild built this image (base, Dockerfile, installer, times), for its
        signed provenance."""
        with self._connect() as db:
            db.execute(
                "INSERT INTO provenance VALUES (?, ?, ?)", (image_id, json.dumps(facts), _now())
            )

    def provenance(self, image_id: str) -> dict[str, Any]:
        """The newest build facts recorded for this image id; {} when there are none (an image
        built before they were recorded, or not by envbuild) or they are damaged."""
        with self._connect() as db:
            row = db.execute(
                "SELECT facts FROM provenance WHERE image_id = ? "
                "ORDER BY created DESC, rowid DESC LIMIT 1",
                (image_id,),
            ).fetchone()
        try:
            facts = json.loads(row[0]) if row is not None else {}
        except ValueError:
            facts = {}
        return facts if isinstance(facts, dict) else {}

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

    def record_bench(self, host: str, result: dict[str, Any]) -> None:
        """Keep one image's bench result (its entry in the bench document) for this host."""
        with self._connect() as db:
            db.execute(
                "INSERT INTO bench VALUES (?, ?, ?, ?, ?)",
                (
                    str(result.get("image_id")),
                    str(result.get("image")),
                    host,
                    json.dumps(result),
                    _now(),
                ),
            )

    def latest_bench(self, image_ref: str, host: str) -> dict[str, Any] | None:
        """The newest bench result of this image reference on this host, or None; a damaged
        record is skipped for the one before it."""
        with self._connect() as db:
            rows = db.execute(
                "SELECT result FROM bench WHERE image_ref = ? AND host = ? "
                "ORDER BY created DESC, rowid DESC LIMIT 20",
                (image_ref, host),
            ).fetchall()
        for (text,) in rows:
            try:
                result = json.loads(text)
            except ValueError:
                continue
            if isinstance(result, dict):
                return result
        return None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
