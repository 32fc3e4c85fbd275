"""`envbuild bench`: measure images on this host, side by side, with plots, advice and history.

Registered on the main group by cli; heavy modules are imported inside the command.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from envbuild.cli.options import gpus_option, picked, plan_from, reports_errors, selectors
from envbuild.core.errors import EXIT_FAILED


@click.command()
@selectors
@click.argument("images", nargs=-1, metavar="[IMAGE]...")
@gpus_option("GPUs to measure on (auto: all when the engine has the NVIDIA runtime).")
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
    from envbuild.bench.document import load_document
    from envbuild.bench.session import (
        LAST,
        bench_session,
        failed_images,
        regressions,
        vetted_refs,
        write_outputs,
    )
    from envbuild.bench.terminal import bench_lines
    from envbuild.core.errors import BadInput
    from envbuild.core.places import check_output_files
    from envbuild.core.store import ResultStore
    from envbuild.engine.interface import connect

    if images and picked(kwargs):
        msg = "give either IMAGE references or selectors (-m MATRIX, --framework ...), not both"
        raise BadInput(msg)
    if not images and not picked(kwargs):
        msg = "nothing to bench: give IMAGE references, or -m MATRIX (every vetted image of it)"
        raise BadInput(msg)
    check_output_files(("--json", json_file), ("--html", html_file))  # before minutes of work
    previous = None
    if compare is not None and compare != LAST:
        previous = load_document(Path(compare))  # a bad file fails before minutes of work
    store = ResultStore.default()
    engine = connect()
    engine.remove_leftovers()
    if images:
        refs = list(dict.fromkeys(images))
    else:
        note = lambda text: click.echo(f"envbuild: {text}", err=True)  # noqa: E731
        refs = vetted_refs(engine, store, plan_from(kwargs)[2].entries, note)
    doc = bench_session(
        engine, store, refs, gpus=gpus, budget_s=budget, compare=compare, previous=previous,
        on_progress=lambda line: click.echo(line, err=True),
    )  # fmt: skip
    written = write_outputs(doc, json_file=json_file, html_file=html_file)
    click.echo("\n".join(bench_lines(doc)))
    for path in written:
        click.echo(f"envbuild: wrote {path}", err=True)
    failed = failed_images(doc)
    if failed:
        click.echo(f"envbuild: bench of {', '.join(failed)} reported errors (above)", err=True)
        sys.exit(EXIT_FAILED)
    regressed = regressions(doc)
    if regressed and fail_on_regression:
        click.echo(f"envbuild: {len(regressed)} figure(s) regressed beyond their spread", err=True)
        sys.exit(EXIT_FAILED)
