"""`envbuild bench`: measure images on this host, side by side, with plots, advice and history.

Registered on the main group by cli; heavy modules are imported inside the command.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from envbuild.cli.options import plan_from, reports_errors, selectors
from envbuild.core.errors import EXIT_FAILED

if TYPE_CHECKING:
    from envbuild.core.store import ResultStore
    from envbuild.engine.interface import Engine

_SELECTOR_KEYS = ("framework", "framework_version", "cuda", "python", "os_name", "matrix_file")


def _vetted_images(engine: Engine, store: ResultStore, kwargs: dict[str, Any]) -> list[str]:
    """The selected entries' images that are built here and passed their smoke test."""
    from envbuild.bench.run import vetted_images
    from envbuild.core.errors import BadInput
    from envbuild.publish.push import built_entries

    _, _, result = plan_from(kwargs)
    refs, notes = vetted_images(
        engine, store, [e.image for e in built_entries(engine, result.entries)]
    )
    for note in notes:
        click.echo(f"envbuild: {note}", err=True)
    if not refs:
        msg = "no vetted image of the selected entries is built here; run `envbuild build` with the same selectors first"
        raise BadInput(msg)
    return refs


@click.command()
@selectors
@click.argument("images", nargs=-1, metavar="[IMAGE]...")
@click.option(
    "--gpus",
    type=click.Choice(["auto", "all", "none"]),
    default="auto",
    show_default=True,
    help="GPUs to measure on (auto: all when the engine has the NVIDIA runtime).",
)
@click.option(
    "--budget",
    type=click.FloatRange(20, 3600),
    default=150,
    show_default=True,
    metavar="SECONDS",
    help="Time for each image's measurements; what does not fit is reported as skipped.",
)
@click.option(
    "--json", "json_file", type=click.Path(path_type=Path), help="Write every sample as JSON."
)
@click.option(
    "--html",
    "html_file",
    type=click.Path(path_type=Path),
    help="Write a self-contained HTML report with plots.",
)
@click.option(
    "--compare",
    metavar="FILE|last",
    help="Show each figure's change since a run (a --json file, or `last` on this host).",
)
@click.option(
    "--fail-on-regression", is_flag=True, help="Exit 1 when --compare finds a regression."
)
@reports_errors
def bench(
    images: tuple[str, ...], gpus: str, budget: float, json_file: Path | None,
    html_file: Path | None, compare: str | None, fail_on_regression: bool, **kwargs: Any,
) -> None:  # fmt: skip
    """Measure images on this host: throughput per precision, batch size, compiled against
    eager, data loading and all-reduce bandwidth; figures side by side, plots and advice.

    IMAGE references, or selectors (-m MATRIX ...) for every vetted image of the selection.
    Each image runs alone (the figures are this host's); results are recorded for --compare last.
    """
    from envbuild.bench.advice import advise
    from envbuild.bench.figures import compare_documents
    from envbuild.bench.run import bench_document, bench_image, host_facts, host_key, load_document
    from envbuild.bench.terminal import bench_lines
    from envbuild.core.errors import BadInput
    from envbuild.core.store import ResultStore
    from envbuild.engine.interface import connect
    from envbuild.report.documents import write_json, write_text

    picked = any(kwargs[k] for k in _SELECTOR_KEYS)
    if images and picked:
        msg = "give either IMAGE references or selectors (-m MATRIX, --framework ...), not both"
        raise BadInput(msg)
    if not images and not picked:
        msg = "nothing to bench: give IMAGE references, or -m MATRIX (every vetted image of it)"
        raise BadInput(msg)
    previous = None
    if compare is not None and compare != "last":
        previous = load_document(Path(compare))  # a bad file fails before minutes of work
    store = ResultStore.default()
    engine = connect()
    engine.remove_leftovers()
    refs = list(dict.fromkeys(images)) if images else _vetted_images(engine, store, kwargs)
    for ref in refs:
        if engine.image(ref) is None:
            msg = f"image {ref} is not in the local engine; build it (`envbuild build`) or pull it"
            raise BadInput(msg)
    host = host_facts(engine)
    key = host_key(host)
    runs = []
    for n, ref in enumerate(refs, 1):
        click.echo(f"bench [{n}/{len(refs)}] {ref}: measuring, up to {budget:g} s ...", err=True)
        run = bench_image(engine, ref, gpus=gpus, budget_s=budget)
        state = "done" if run.ok else f"{len(run.errors)} error(s)"
        click.echo(
            f"bench [{n}/{len(refs)}] {ref}: {state} in {run.seconds:.0f} s"
            + (f", {len(run.skipped)} item(s) skipped for time" if run.skipped else ""),
            err=True,
        )
        runs.append(run)
    doc = bench_document(runs, host, budget_s=budget)
    doc["advice"] = [a.as_dict() for a in advise(doc)]
    if compare == "last":
        found = [store.latest_bench(run.image, key) for run in runs]
        previous = {"images": [f for f in found if f is not None]}
    if previous is not None:
        doc["comparison"] = compare_documents(doc, previous, against=compare or "")
    for entry in doc["images"]:
        store.record_bench(key, entry)
    if json_file is not None:
        write_json(json_file, doc)
    if html_file is not None:
        from envbuild.bench.html import render_html

        write_text(html_file, render_html(doc))
    click.echo("\n".join(bench_lines(doc)))
    for path in (json_file, html_file):
        if path is not None:
            click.echo(f"envbuild: wrote {path}", err=True)
    failed = [run.image for run in runs if not run.ok]
    if failed:
        click.echo(f"envbuild: bench of {', '.join(failed)} reported errors (above)", err=True)
        sys.exit(EXIT_FAILED)
    regressions = [r for r in (doc.get("comparison") or {}).get("rows", []) if r.get("regression")]
    if regressions and fail_on_regression:
        click.echo(
            f"envbuild: {len(regressions)} figure(s) regressed beyond their spread", err=True
        )
        sys.exit(EXIT_FAILED)
