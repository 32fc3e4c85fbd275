"""Command line: parse options, call the library, turn errors into exit codes.

Heavy modules (docker, jinja2, the knowledge base) are imported inside the commands so that
`envbuild --help` starts fast.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from envbuild import __version__
from envbuild.errors import EXIT_FAILED, EnvbuildError, SelectionError

if TYPE_CHECKING:
    from envbuild.matrix import Matrix
    from envbuild.models import Fleet, Knowledge, Plan, Selection

F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str, code: int) -> None:
    from envbuild.redact import redact

    for line in redact(message).splitlines():
        click.echo(f"envbuild: error: {line}", err=True)
    sys.exit(code)


def reports_errors(func: F) -> F:
    """Turn EnvbuildError into its message on stderr and its exit code; never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except EnvbuildError as exc:
            _fail(exc.message, exc.exit_code)
        except KeyboardInterrupt as exc:
            from envbuild.interrupt import exit_code, remove_scratch

            remove_scratch()
            code = exit_code(exc)
            click.echo(
                f"envbuild: error: {'terminated' if code == 143 else 'interrupted'}", err=True
            )
            sys.stdout.flush()
            sys.stderr.flush()
            # Not sys.exit: it would wait for worker threads still blocked on the engine.
            os._exit(code)
        return None

    return wrapper  # type: ignore[return-value]


def selectors(func: F) -> F:
    """The options every entry-picking command shares."""
    options = [
        click.option(
            "--repository",
            metavar="REPO",
            help=(
                "Image repository [HOST[:PORT]/]path, lowercase; may use the placeholder "
                "{framework} [default: the matrix's, envbuild/{framework}]."
            ),
        ),
        click.option(
            "-m",
            "--matrix",
            "matrix_file",
            type=click.Path(path_type=Path),
            help="Matrix file (default: every release in the knowledge base).",
        ),
        click.option("--os", "os_name", metavar="OS", help="OS base, e.g. bookworm."),
        click.option("--python", metavar="X.Y", help="Python version, e.g. 3.11."),
        click.option(
            "--cuda",
            metavar="VER",
            help="'cpu', a major ('12': every 12.x), '12.1', or a wheel tag ('cu121', 'cu12').",
        ),
        click.option(
            "--framework-version", metavar="PREFIX", help="Release or prefix: '2.1' matches 2.1.x."
        ),
        click.option("--framework", metavar="NAME", help="Framework, e.g. torch."),
    ]
    for option in options:
        func = option(func)
    return func


_SELECTOR_EXAMPLES = {
    "framework": "torch",
    "framework_version": "2.4 or 2.4.1",
    "python": "3.11",
    "os_name": "bookworm",
}


def _selection(kwargs: dict[str, Any]) -> Selection:
    """The selectors, each checked; also checks --repository, which _plan applies later."""
    import re

    from envbuild.compat import cuda_selector
    from envbuild.errors import BadInput
    from envbuild.knowledge import load_knowledge
    from envbuild.models import Selection
    from envbuild.references import repository_problem, shown

    for key, example in _SELECTOR_EXAMPLES.items():
        value = kwargs[key]
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}", value):
            flag = "--os" if key == "os_name" else "--" + key.replace("_", "-")
            msg = f"{flag} {shown(value)}: not a plain name or version; give e.g. {example}"
            raise BadInput(msg)
    repository = kwargs.get("repository")
    if repository is not None:
        problem = repository_problem(repository, load_knowledge().frameworks)
        if problem is not None:
            msg = (
                f"--repository {shown(repository)}: {problem}; "
                "give e.g. registry.example.com:5000/team/{framework}"
            )
            raise BadInput(msg)
    cuda = kwargs.pop("cuda")
    selected = None if cuda is None else cuda_selector(cuda)
    if cuda is not None and selected is None:
        msg = (
            f"--cuda {shown(cuda)}: not a CUDA selector; give cpu, a major (12), "
            "a version (12.1) or a wheel tag (cu121)"
        )
        raise BadInput(msg)
    return Selection(
        framework=kwargs.pop("framework"),
        framework_version=kwargs.pop("framework_version"),
        cuda=selected,
        python=kwargs.pop("python"),
        os=kwargs.pop("os_name"),
    )


def _plan(
    kwargs: dict[str, Any], *, fleet: Fleet | None = None, newest_only: bool = False
) -> tuple[Knowledge, Matrix, Plan]:
    from envbuild.knowledge import load_knowledge
    from envbuild.matrix import (
        default_matrix_path,
        knowledge_matrix,
        load_matrix,
        make_plan,
        require_entries,
    )

    knowledge = load_knowledge()
    selection = _selection(kwargs)
    matrix_file = kwargs.pop("matrix_file")
    if matrix_file is not None:
        matrix = load_matrix(matrix_file, knowledge)
    else:
        defaults = load_matrix(default_matrix_path(), knowledge)
        matrix = knowledge_matrix(knowledge, selection, defaults)
    repository = kwargs.pop("repository")
    if repository:
        matrix = dataclasses.replace(matrix, repository=repository)
    plan = make_plan(knowledge, matrix, selection, fleet=fleet, newest_only=newest_only)
    try:
        require_entries(plan, matrix, selection)
    except SelectionError as exc:
        if fleet is None:
            raise
        msg = f"{exc.message}; {_fleet_alternatives(knowledge, selection, fleet)}"
        raise SelectionError(msg) from exc
    return knowledge, matrix, plan


def _fleet_alternatives(knowledge: Knowledge, selection: Selection, fleet: Fleet) -> str:
    """What a fleet can run when a selection leaves it nothing: newest release per variant."""
    from envbuild.knowledge import cuda_tag, version_sort_key
    from envbuild.matrix import default_matrix_path, knowledge_matrix, load_matrix, make_plan

    relaxed = dataclasses.replace(selection, cuda=None, framework_version=None)
    defaults = load_matrix(default_matrix_path(), knowledge)
    plan = make_plan(
        knowledge, knowledge_matrix(knowledge, relaxed, defaults), relaxed, fleet=fleet
    )
    newest: dict[tuple[str, str], str] = {}
    for entry in plan.entries:  # releases come in ascending order
        newest[(entry.framework, entry.cuda)] = entry.framework_version
    if not newest:
        return "that fleet can run nothing in the knowledge base"
    # Newest releases first; among them the highest CUDA first, CPU last.
    ordered = sorted(
        newest.items(),
        key=lambda item: (
            version_sort_key(item[1]),
            item[0][1] != "cpu",
            version_sort_key(item[0][1]) if item[0][1] != "cpu" else version_sort_key("0"),
        ),
        reverse=True,
    )
    shown = [f"{fw} {version} {cuda_tag(cuda)}" for (fw, cuda), version in ordered[:5]]
    return "that fleet can run e.g. " + ", ".join(shown)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="envbuild")
@click.option("-v", "--verbose", is_flag=True, help="Show debug logging.")
def main(verbose: bool) -> None:
    """Build GPU training images from a compatibility matrix and prove they train."""
    from envbuild.interrupt import install_sigterm
    from envbuild.redact import RedactingFilter

    install_sigterm()

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="envbuild: %(levelname)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:  # every library's records, urllib3's included
        handler.addFilter(RedactingFilter())


@main.command()
@selectors
@click.option("--driver", metavar="VERSION", help="Drop entries this NVIDIA driver cannot run.")
@click.option(
    "--gpu",
    "gpus",
    multiple=True,
    metavar="GPU",
    help="Drop entries that cannot run on this GPU (H100, 'RTX 4090', sm_90, 9.0); repeatable.",
)
@click.option("--explain", is_flag=True, help="Show the facts behind each decision, with sources.")
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@reports_errors
def plan(driver: str | None, gpus: tuple[str, ...], explain: bool, fmt: str, **kwargs: Any) -> None:
    """Show what would be built, and what cannot be and why."""
    from envbuild.knowledge import load_knowledge
    from envbuild.report import plan_document, plan_table

    fleet = _fleet(load_knowledge(), driver, gpus)
    _, _, result = _plan(kwargs, fleet=fleet)
    if fmt == "json":
        click.echo(json.dumps(plan_document(result, explain=explain), indent=2))
    else:
        click.echo("\n".join(plan_table(result, explain=explain)))


@main.command("ci-matrix")
@selectors
@reports_errors
def ci_matrix(**kwargs: Any) -> None:
    """Print the entries as a GitHub Actions strategy.matrix: {"include": [...]} on one line."""
    from envbuild.ci_matrix import github_matrix

    matrix_file = kwargs["matrix_file"]
    _, _, result = _plan(kwargs)
    click.echo(
        json.dumps(github_matrix(result, matrix_file=str(matrix_file) if matrix_file else None))
    )


def _fleet(knowledge: Knowledge, driver: str | None, gpus: tuple[str, ...]) -> Fleet | None:
    import difflib
    import re

    from envbuild.compat import find_gpu, looks_like_cc
    from envbuild.errors import BadInput
    from envbuild.models import Fleet
    from envbuild.references import shown

    if driver is None and not gpus:
        return None
    # ASCII digits, bounded: `\d` takes other scripts' digits, and 5,000 digits overflow int().
    if driver is not None and not re.fullmatch(r"[0-9]{1,6}(?:\.[0-9]{1,6}){0,2}", driver):
        msg = (
            f"--driver {shown(driver)} is not a driver version; give up to three dot-separated "
            "numbers of at most 6 digits (e.g. 535.104.05)"
        )
        raise BadInput(msg)
    found = []
    for text in gpus:
        gpu = find_gpu(knowledge, text) if text.isprintable() and len(text) <= 100 else None
        if gpu is None and looks_like_cc(text):
            msg = (
                f"--gpu {shown(text)} is not a compute capability; give sm_XY or X.Y with "
                "major X 1-20 and minor Y 0-9 in ASCII digits (e.g. sm_90, 9.0), or a GPU name"
            )
            raise BadInput(msg)
        if gpu is None:
            close = (
                difflib.get_close_matches(text, list(knowledge.gpus), n=3, cutoff=0.4)
                if text.isprintable() and len(text) <= 100
                else []
            )
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            msg = (
                f"--gpu {shown(text)} is not a GPU envbuild knows{hint} "
                "(or give its compute capability: sm_90 or 9.0)"
            )
            raise BadInput(msg)
        found.append(gpu)
    return Fleet(driver=driver, gpus=tuple(found))


def _build_options(kwargs: dict[str, Any]) -> Any:
    """The fetch options, checked (each error names its option) and with links resolved."""
    from envbuild.models import BuildOptions
    from envbuild.redact import register_url
    from envbuild.render import check_options

    options = BuildOptions(
        base_image=kwargs.pop("base_image", None),
        ca_bundle=kwargs.pop("ca_bundle", None),
        wheelhouse=kwargs.pop("wheelhouse", None),
        index_url=kwargs.pop("index_url", None),
        extra_index_urls=tuple(kwargs.pop("extra_index_url", ()) or ()),
        offline=kwargs.pop("offline", False),
    )
    for url in (options.index_url, *options.extra_index_urls):
        register_url(url)  # before any message could show it
    return check_options(options)


def fetch_options(func: F) -> F:
    """Options that say where a build fetches packages from."""
    options = [
        click.option(
            "--offline", is_flag=True, help="Install only from --wheelhouse; use no index."
        ),
        click.option(
            "--extra-index-url", multiple=True, metavar="URL", help="Extra pip index (repeatable)."
        ),
        click.option(
            "--index-url", metavar="URL", help="pip index to use instead of PyPI (a mirror)."
        ),
        click.option(
            "--wheelhouse", type=click.Path(path_type=Path), help="Folder of wheels pip may use."
        ),
        click.option(
            "--ca-bundle",
            type=click.Path(path_type=Path),
            help="CA bundle for a TLS-intercepting proxy or private index.",
        ),
        click.option(
            "--base-image", metavar="REF", help="Base image instead of the entry's default."
        ),
    ]
    for option in options:
        func = option(func)
    return func


@main.command()
@selectors
@fetch_options
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    required=True,
    help="Folder to write one build context per entry into.",
)
@reports_errors
def render(output: Path, **kwargs: Any) -> None:
    """Write each entry's Dockerfile and build context for review (no Docker needed).

    Files are copies (editing them changes no original); links found under the output folder
    are replaced, never followed.
    """
    from envbuild.errors import BadInput
    from envbuild.references import shown
    from envbuild.render import render_entry, write_context

    options = _build_options(kwargs)
    _, _, result = _plan(kwargs, newest_only=False)
    where = f"-o {shown(str(output))}"
    try:
        if output.exists() and not output.is_dir():
            msg = f"{where}: not a folder; pass a folder to write the build contexts into"
            raise BadInput(msg)
        output.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        msg = f"{where}: cannot make the folder ({reason}); pass a writable folder"
        raise BadInput(msg) from exc
    for entry in result.entries:
        context = render_entry(entry, options)
        try:
            directory = write_context(context, output, entry.id)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            if exc.filename is not None:
                reason += f": {shown(str(exc.filename))}"
            msg = f"{where}: cannot write {entry.id} ({reason}); pass a writable folder"
            raise BadInput(msg) from exc
        click.echo(f"{entry.id}: {directory / 'Dockerfile'}")


@main.command()
@selectors
@fetch_options
@click.option("--no-smoke", is_flag=True, help="Build only; skip the smoke test.")
@click.option(
    "--gpus",
    type=click.Choice(["auto", "all", "none"]),
    default="auto",
    show_default=True,
    help="GPUs for the smoke test.",
)
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Entries built at the same time.",
)
@click.option(
    "--keep-going", is_flag=True, help="Build every entry even after one failed (default: stop)."
)
@click.option(
    "--report", "report_file", type=click.Path(path_type=Path), help="Write a JSON report here."
)
@click.option(
    "--junit", "junit_file", type=click.Path(path_type=Path), help="Write a JUnit XML report here."
)
@click.option("--no-cache", is_flag=True, help="Rebuild every layer, even of an image that exists.")
@click.option(
    "--push",
    "push_registry",
    metavar="REGISTRY",
    help="Publish what passed to this registry (host[/prefix]) in the same run.",
)
@reports_errors
def build(
    no_smoke: bool, gpus: str, jobs: int, keep_going: bool, report_file: Path | None,
    junit_file: Path | None, push_registry: str | None, no_cache: bool, **kwargs: Any,
) -> None:  # fmt: skip
    """Build images for the selected entries, then smoke-test them.

    Without -m, the newest release that fits the selectors is built (a --framework-version
    prefix such as 0.10 builds the newest 0.10.x); a matrix file builds all its entries.
    """
    import os

    from envbuild.pipeline import RunOptions, run_entries
    from envbuild.progress import ProgressView
    from envbuild.report import (
        build_document,
        junit_xml,
        markdown_summary,
        write_json,
        write_text,
    )
    from envbuild.store import ResultStore

    options = _build_options(kwargs)
    knowledge, _, result = _plan(kwargs, newest_only=True)
    run = RunOptions(
        jobs=jobs, keep_going=keep_going, smoke=not no_smoke, gpus=gpus, no_cache=no_cache
    )
    with ProgressView([e.id for e in result.entries]) as view:
        results = run_entries(
            knowledge,
            result.entries,
            options,
            run,
            store=ResultStore.default(),
            on_event=view.event,
        )
    click.echo("\n".join(view.summary(results)), err=True)
    if report_file is not None:
        write_json(report_file, build_document(results))
    if junit_file is not None:
        write_text(junit_file, junit_xml(results))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        from envbuild.redact import redact

        try:
            with Path(summary).open("a", encoding="utf-8") as handle:
                handle.write(redact(markdown_summary(results)))
        except OSError as exc:
            click.echo(f"envbuild: cannot append to $GITHUB_STEP_SUMMARY: {exc.strerror}", err=True)
    if push_registry is not None:
        if no_smoke:
            click.echo(
                "envbuild: --push publishes only smoke-tested images; nothing pushed (--no-smoke)",
                err=True,
            )
        else:
            _publish_entries(
                [r.entry for r in results if r.passed], push_registry, report_file=None
            )
    if not all(r.passed for r in results):
        sys.exit(EXIT_FAILED)


def _publish_entries(entries: list[Any], registry: str, *, report_file: Path | None) -> None:
    from envbuild.engine import connect
    from envbuild.publish import candidate, moving_tags
    from envbuild.store import ResultStore

    engine = connect()
    store = ResultStore.default()
    tags = moving_tags(entries)
    items = [candidate(engine, store, e.image, moving=tags[e.id]) for e in entries]
    _publish_items(engine, store, items, registry, report_file)


def _publish_items(
    engine: Any, store: Any, items: list[Any], registry: str, report_file: Path | None
) -> None:
    from envbuild.publish import publish_image
    from envbuild.report import write_json

    published: list[dict[str, Any]] = []
    try:
        for item in items:
            click.echo(f"publishing {item.source} to {registry}", err=True)
            for done in publish_image(engine, store, item, registry, on_line=lambda line: None):
                click.echo(f"  {done.kind:9} {done.reference} {done.digest}")
                published.append(
                    {"image": item.source, "image_id": item.image_id, **done.as_dict()}
                )
    finally:
        if report_file is not None:
            write_json(report_file, {"registry": registry, "published": published})


@main.command()
@selectors
@click.argument("images", nargs=-1, metavar="[IMAGE]...")
@click.option(
    "--registry",
    required=True,
    metavar="HOST[/PREFIX]",
    help="Where to publish, e.g. 127.0.0.1:5000/team.",
)
@click.option(
    "--report",
    "report_file",
    type=click.Path(path_type=Path),
    help="Write the pushed references as JSON.",
)
@reports_errors
def publish(
    images: tuple[str, ...], registry: str, report_file: Path | None, **kwargs: Any
) -> None:
    """Push vetted images (by selectors, or IMAGE references) and verify what the registry holds.

    Only an image whose smoke test passed for its exact image id is pushed. The immutable tag
    (tag-<content hash>) is pushed and verified first; the smoke report and package list are
    attached to its digest; then the moving tags (torch2.13-cpu-py3.11, latest) follow.
    """
    from envbuild.engine import connect
    from envbuild.errors import BadInput
    from envbuild.publish import candidate
    from envbuild.store import ResultStore

    picked = any(
        kwargs[k]
        for k in ("framework", "framework_version", "cuda", "python", "os_name", "matrix_file")
    )
    if images and picked:
        msg = "give either IMAGE references or selectors, not both"
        raise BadInput(msg)
    if images:
        engine = connect()
        store = ResultStore.default()
        items = [candidate(engine, store, ref) for ref in images]
        _publish_items(engine, store, items, registry, report_file)
        return
    _, _, result = _plan(kwargs)
    engine = connect()
    built = [e for e in result.entries if engine.image(e.image) is not None]
    if not built:
        msg = (
            f"none of the {len(result.entries)} selected entries is built here; "
            "run `envbuild build` with the same selectors first"
        )
        raise BadInput(msg)
    _publish_entries(built, registry, report_file=report_file)


@main.command()
@click.argument("reference")
@click.option("--json", "as_json", is_flag=True, help="Print what was found as JSON.")
@reports_errors
def verify(reference: str, as_json: bool) -> None:
    """Fetch the smoke report published next to REFERENCE and check it belongs to that image.

    ENVBUILD_REGISTRY_TIMEOUT bounds the whole check (seconds, default 120).
    """
    from envbuild.http_limits import printable
    from envbuild.publish import verify_reference

    found = verify_reference(reference)
    packages = [line for line in found.packages.splitlines() if line and not line.startswith("#")]
    if as_json:  # json.dumps escapes every control character the registry's strings may hold
        document = {
            "reference": found.reference,
            "digest": found.digest,
            "passed": found.passed,
            "smoke": found.report,
            "packages": packages,
        }
        click.echo(json.dumps(document, indent=2))
    else:
        train = found.report.get("train")
        train = train if isinstance(train, dict) else {}
        verdict = "passed" if found.passed else "FAILED"
        first, last = printable(train.get("loss_first"), 40), printable(train.get("loss_last"), 40)
        click.echo(f"{printable(reference)}: {found.digest}")
        click.echo(f"  smoke report of image {found.image_id}: {verdict}")
        click.echo(f"  loss {first} -> {last}; {len(packages)} packages listed")
    if not found.passed:
        msg = (
            f"{printable(reference)}: the smoke report attached to {found.digest} did not pass; "
            f"do not use this image, rebuild and publish it again"
        )
        raise EnvbuildError(msg)


@main.command()
@click.argument("image")
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON.")
@click.option(
    "--gpus", type=click.Choice(["auto", "all", "none"]), default="auto", show_default=True
)
@click.option(
    "--timeout",
    type=click.IntRange(10, 7200),
    default=600,
    show_default=True,
    help="Seconds before the payload is killed.",
)
@reports_errors
def smoke(image: str, as_json: bool, gpus: str, timeout: int) -> None:
    """Prove IMAGE trains and all-reduces: run the smoke payload inside it."""
    from envbuild.engine import connect
    from envbuild.report import smoke_lines
    from envbuild.smoke import smoke_image
    from envbuild.store import ResultStore

    store = ResultStore.default()  # an unusable record fails before minutes of work
    engine = connect()
    engine.remove_leftovers()
    result = smoke_image(engine, image, gpus=gpus, timeout=timeout)
    store.record_smoke(result)  # publish trusts only recorded results
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
    else:
        click.echo("\n".join(smoke_lines(result)))
    if not result.passed:
        failed = ", ".join(c.detail for c in result.checks if not c.passed)
        click.echo(f"envbuild: smoke test of {image} failed: {failed}", err=True)
        sys.exit(EXIT_FAILED)


@main.command()
@click.option(
    "-m",
    "--matrix",
    "matrix_file",
    type=click.Path(path_type=Path),
    help="Matrix to check against [default: matrices/default.yaml].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@reports_errors
def doctor(matrix_file: Path | None, as_json: bool) -> None:
    """What this host has (engine, driver, GPUs, shm, disk) and which images it can run."""
    from envbuild.doctor import examine_host, report_lines
    from envbuild.errors import EXIT_NO_ENGINE
    from envbuild.knowledge import load_knowledge
    from envbuild.matrix import default_matrix_path, load_matrix
    from envbuild.models import Selection

    knowledge = load_knowledge()
    matrix = load_matrix(matrix_file or default_matrix_path(), knowledge)
    report = examine_host(knowledge, matrix, Selection())
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo("\n".join(report_lines(report)))
    if not report.engine["reachable"]:
        sys.exit(EXIT_NO_ENGINE)


@main.group()
def knowledge() -> None:
    """The compatibility knowledge base under matrices/knowledge/."""


@knowledge.command("refresh")
@click.option(
    "--framework",
    "frameworks",
    multiple=True,
    metavar="NAME",
    help="Framework to refresh (repeatable) [default: every one PyPI can refresh].",
)
@click.option(
    "--check", is_flag=True, help="Change nothing; exit 1 if the shipped facts disagree with PyPI."
)
@reports_errors
def knowledge_refresh(frameworks: tuple[str, ...], check: bool) -> None:
    """Read what a plain `pip install` of each release pulls from PyPI; update the facts, show the diff."""
    from envbuild.refresh import FRAMEWORK_PACKAGES, refresh

    disagree = []
    for framework in frameworks or tuple(sorted(FRAMEWORK_PACKAGES)):
        click.echo(f"{framework}: reading PyPI ...", err=True)
        result = refresh(framework, check=check)
        for note in result.notes:
            click.echo(f"{framework}: note: {note}", err=True)
        if not result.changed:
            click.echo(f"{framework}: {result.path} agrees with PyPI")
            continue
        click.echo("\n".join(result.diff))
        if check:
            disagree.append(framework)
        else:
            click.echo(f"{framework}: updated {result.path}")
    if disagree:
        click.echo(
            f"envbuild: {', '.join(disagree)}: the shipped knowledge disagrees with PyPI; "
            "run `envbuild knowledge refresh` to update it",
            err=True,
        )
        sys.exit(EXIT_FAILED)


@main.group()
def base() -> None:
    """Local base images for hosts that cannot pull."""


@base.command("bootstrap")
@click.option("--suite", default="bookworm", show_default=True, help="Debian suite.")
@click.option("--tag", metavar="REF", help="Image reference [default: envbuild/base:SUITE].")
@click.option("--mirror", default="http://deb.debian.org/debian", show_default=True)
@click.option(
    "--with-python", is_flag=True, help="Include the suite's python3 and venv (for offline builds)."
)
@click.option("--force", is_flag=True, help="Rebuild even if the tag exists.")
@reports_errors
def base_bootstrap(
    suite: str, tag: str | None, mirror: str, with_python: bool, force: bool
) -> None:
    """Make a minimal Debian base image with debootstrap and docker import."""
    from envbuild.base import bootstrap_base, default_tag
    from envbuild.engine import connect

    engine = connect()
    ref = tag or default_tag(suite)
    if force or engine.image(ref) is None:
        click.echo(f"bootstrapping {ref} from {mirror} (about 30 s)", err=True)
    image_id, created = bootstrap_base(
        engine, suite=suite, tag=ref, mirror=mirror, with_python=with_python, force=force
    )
    state = "created" if created else "already present"
    click.echo(f"{ref} {state}: {image_id}")
