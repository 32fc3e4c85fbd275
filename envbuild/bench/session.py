"""One `envbuild bench` run: each image measured in turn on this host, the document with its
advice and its comparison with an earlier run, the figures recorded, the files written."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from envbuild.bench.advice import advise
from envbuild.bench.compare import compare_documents
from envbuild.bench.document import bench_document
from envbuild.bench.run import bench_image, vetted_images
from envbuild.core.errors import BadInput
from envbuild.core.models import Entry
from envbuild.core.store import ResultStore
from envbuild.engine.interface import Engine
from envbuild.host.probes import host_facts, host_key
from envbuild.publish.push import built_entries
from envbuild.report.documents import write_json, write_text

# Compare with the figures this host recorded last for each image.
LAST = "last"


def vetted_refs(
    engine: Engine, store: ResultStore, entries: tuple[Entry, ...], on_note: Callable[[str], None]
) -> list[str]:
    """The entries' images that are built here and passed their smoke test; each one left out
    is said through `on_note`."""
    refs, notes = vetted_images(engine, store, [e.image for e in built_entries(engine, entries)])
    for note in notes:
        on_note(note)
    if not refs:
        msg = "no vetted image of the selected entries is built here; run `envbuild build` with the same selectors first"
        raise BadInput(msg)
    return refs


def bench_session(
    engine: Engine,
    store: ResultStore,
    refs: list[str],
    *,
    gpus: str,
    budget_s: float,
    compare: str | None,
    previous: dict[str, Any] | None,
    on_progress: Callable[[str], None],
) -> dict[str, Any]:
    """Bench each image alone (the figures are this host's), then advise, compare with
    `previous` (or this host's last figures, with `compare="last"`) and record the figures."""
    for ref in refs:
        if engine.image(ref) is None:
            msg = f"image {ref} is not in the local engine; build it (`envbuild build`) or pull it"
            raise BadInput(msg)
    host = host_facts(engine)
    key = host_key(host)
    runs = []
    for n, ref in enumerate(refs, 1):
        on_progress(f"bench [{n}/{len(refs)}] {ref}: measuring, up to {budget_s:g} s ...")
        run = bench_image(engine, ref, gpus=gpus, budget_s=budget_s)
        state = "done" if run.ok else f"{len(run.errors)} error(s)"
        skipped = f", {len(run.skipped)} item(s) skipped for time" if run.skipped else ""
        on_progress(f"bench [{n}/{len(refs)}] {ref}: {state} in {run.seconds:.0f} s{skipped}")
        runs.append(run)
    doc = bench_document(runs, host, budget_s=budget_s)
    doc["advice"] = [a.as_dict() for a in advise(doc)]
    if compare == LAST:
        found = [store.latest_bench(run.image, key) for run in runs]
        previous = {"images": [f for f in found if f is not None]}
    if previous is not None:
        doc["comparison"] = compare_documents(doc, previous, against=compare or "")
    for entry in doc["images"]:
        store.record_bench(key, entry)
    return doc


def write_outputs(
    doc: dict[str, Any], *, json_file: Path | None, html_file: Path | None
) -> list[Path]:
    """The document as JSON and as the HTML page, where asked; the files written."""
    written = []
    if json_file is not None:
        write_json(json_file, doc)
        written.append(json_file)
    if html_file is not None:
        # matplotlib: imported only when a page is asked for
        from envbuild.bench.html.page import render_html

        write_text(html_file, render_html(doc))
        written.append(html_file)
    return written


def failed_images(doc: dict[str, Any]) -> list[str]:
    """The images whose bench reported errors."""
    return [str(image["image"]) for image in doc["images"] if not image["ok"]]


def regressions(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The comparison's rows that regressed beyond their spread."""
    rows: list[dict[str, Any]] = (doc.get("comparison") or {}).get("rows", [])
    return [row for row in rows if row.get("regression")]
