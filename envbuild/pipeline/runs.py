"""One `envbuild build` run after its entries are built and smoke-tested: the reports it was
asked for, the CI step summary, and the publication of what passed (`--push`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from envbuild.core.labels import CONTENT_HASH
from envbuild.core.results import EntryResult
from envbuild.core.store import ResultStore
from envbuild.engine.interface import Engine, connect
from envbuild.publish.keys import SigningKey
from envbuild.publish.platform_index import IndexPublished
from envbuild.publish.push import (
    Candidate,
    Published,
    entry_candidates,
    publish_platform_indexes,
    publish_reported,
)
from envbuild.report.documents import append_step_summary, write_build_reports


def record_run(
    results: list[EntryResult],
    *,
    json_file: Path | None,
    junit_file: Path | None,
    step_summary: Path | None,
) -> list[str]:
    """Write the reports asked for and append the step summary; a line for each problem that
    must not fail the run (a step summary that cannot be appended to)."""
    write_build_reports(results, json_file=json_file, junit_file=junit_file)
    if step_summary is None:
        return []
    try:
        append_step_summary(step_summary, results)
    except OSError as exc:
        return [f"cannot append to $GITHUB_STEP_SUMMARY: {exc.strerror}"]
    return []


def push_passed(
    results: list[EntryResult],
    registry: str,
    *,
    on_start: Callable[[Candidate], None],
    on_published: Callable[[Candidate, Published], None],
    on_index: Callable[[IndexPublished], None] = lambda index: None,
    signing_key: SigningKey | None = None,
) -> None:
    """Publish the entries that passed and that the registry did not already hold vetted (and,
    with a `signing_key`, signed with it); then, for entries built for several platforms, the
    index that names their images under one tag."""
    fresh = [r.entry for r in results if r.passed and r.published is None]
    engine = connect()
    if fresh:
        store = ResultStore.default()
        items = entry_candidates(engine, store, fresh, run=[r.entry for r in results])
        publish_reported(
            engine, store, items, registry, report_file=None, on_start=on_start,
            on_published=on_published, signing_key=signing_key,
        )  # fmt: skip
    members = [(r.entry, published_hash(engine, r)) for r in results]
    publish_platform_indexes(registry, members, on_published=on_index, signing_key=signing_key)


def published_hash(engine: Engine, result: EntryResult) -> str | None:
    """The content hash (or its first characters, as the immutable tag holds them) of the
    image an entry has in the registry now; None for an entry that did not pass."""
    if not result.passed:
        return None
    if result.published is not None:  # host/repo:<tag>-<hash>@sha256:...
        return result.published.split("@", 1)[0].rsplit("-", 1)[-1]
    image = engine.image(result.entry.image)
    return image.labels.get(CONTENT_HASH) if image is not None else None
