"""Command line: parse options, call the library, turn errors into exit codes.

Heavy modules (docker, jinja2, the knowledge base) are imported inside the commands so that
`envbuild --help` starts fast.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from envbuild import __version__
from envbuild.cli.bench import bench
from envbuild.cli.lock import lock, locked_option, locks_for
from envbuild.cli.maintenance import base, knowledge
from envbuild.cli.options import (
    build_options_from,
    builder_option,
    ca_bundle_option,
    entry_options,
    fleet_from,
    fleet_option,
    gpus_option,
    picked,
    plan_from,
    proxy_option,
    reports_errors,
    selectors,
    sign_option,
    signing_key_from,
)
from envbuild.cli.signing import keys, policy
from envbuild.core.errors import EXIT_FAILED, EnvbuildError
from envbuild.net.trust import trusting

if TYPE_CHECKING:
    from envbuild.publish.keys import SigningKey
    from envbuild.publish.platform_index import IndexPublished
    from envbuild.publish.push import Candidate, Published, PublishLines


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="envbuild")
@click.option("-v", "--verbose", is_flag=True, help="Show debug logging.")
def main(verbose: bool) -> None:
    """Build GPU training images from a compatibility matrix and prove they train."""
    from envbuild.core.interrupt import install_sigterm
    from envbuild.core.redact import RedactingFilter

    install_sigterm()

    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="envbuild: %(levelname)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:  # every library's records, urllib3's included
        handler.addFilter(RedactingFilter())


@main.command()
@entry_options
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
    "--frameworks",
    is_flag=True,
    help=(
        "Ask the engine for each entry's framework image: its key (from the entry's fresh lock "
        "and the base image) and whether the engine has it."
    ),
)
@click.option(
    "--registry",
    metavar="REGISTRY",
    help="With --frameworks: also whether this registry (host[/prefix], as for --push) holds it.",
)
@builder_option
@click.option(
    "--format", "fmt", type=click.Choice(["table", "json"]), default="table", show_default=True
)
@reports_errors
def plan(
    driver: str | None, gpus: tuple[str, ...], explain: bool, frameworks: bool,
    registry: str | None, fmt: str, **kwargs: Any,
) -> None:  # fmt: skip
    """Show what would be built, and what cannot be and why; and each entry's lock state.

    With --frameworks, also each entry's framework image (the layers it stands on, shared by
    every entry with its key): its key, whether the engine has it, and with --registry whether
    the registry holds it. Nothing is built, pulled or pushed.
    """
    from envbuild.core.errors import BadInput
    from envbuild.knowledge.load import load_knowledge
    from envbuild.lock.planning import lock_summary, plan_locks_document, plan_with_locks
    from envbuild.report.documents import plan_document, plan_table

    if registry is not None and not frameworks:
        msg = "--registry says where plan looks for framework images; add --frameworks"
        raise BadInput(msg)
    fleet = fleet_from(load_knowledge(), driver, gpus)
    options, matrix_path = build_options_from(kwargs), kwargs["matrix_file"]
    known, _, result = plan_from(kwargs, fleet=fleet)
    result, states = plan_with_locks(result, options, matrix_path, known)
    if frameworks:
        from envbuild.core.store import ResultStore
        from envbuild.engine.interface import connect
        from envbuild.pipeline.frameworks import (
            framework_lines,
            framework_states,
            plan_frameworks_document,
        )

        with trusting(options.ca_bundle):
            builder, images = framework_states(
                known, result.entries, options, states, matrix_path=matrix_path,
                registry=registry, store=ResultStore.default(), connect=connect,
            )  # fmt: skip
    if fmt == "json":
        document = plan_locks_document(plan_document(result, explain=explain), states)
        if frameworks:
            document = plan_frameworks_document(document, images)
        click.echo(json.dumps(document, indent=2))
    else:
        lines = [*plan_table(result, explain=explain), *lock_summary(states, matrix_path)]
        if frameworks:
            lines += framework_lines(builder, registry, images)
        click.echo("\n".join(lines))


@main.command("ci-matrix")
@selectors
@reports_errors
def ci_matrix(**kwargs: Any) -> None:
    """Print the entries as a GitHub Actions strategy.matrix: {"include": [...]} on one line."""
    from envbuild.plan.ci_matrix import github_matrix

    matrix_file = kwargs["matrix_file"]
    _, _, result = plan_from(kwargs)
    click.echo(
        json.dumps(github_matrix(result, matrix_file=str(matrix_file) if matrix_file else None))
    )


@main.command()
@entry_options
@locked_option
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    required=True,
    help="Folder to write one build context per entry into.",
)
@builder_option
@reports_errors
def render(output: Path, locked: bool, **kwargs: Any) -> None:
    """Write each entry's Dockerfile and build context for review (no Docker needed).

    Files are copies (editing them changes no original); links found under the output folder
    are replaced, never followed.
    """
    from envbuild.build.render import render_entry, write_context
    from envbuild.core.errors import BadInput
    from envbuild.core.models import AUTO, BUILDKIT, CLASSIC
    from envbuild.core.names import shown
    from envbuild.core.places import check_output_folder

    check_output_folder(output, "-o")  # before the locks, which may take the network
    options, matrix_path = build_options_from(kwargs), kwargs["matrix_file"]
    if options.builder == AUTO:  # no engine to ask: as `build` would choose for DOCKER_HOST
        local = os.environ.get("DOCKER_HOST", "unix://").startswith("unix://")
        options = dataclasses.replace(options, builder=CLASSIC if local else BUILDKIT)
    known, _, result = plan_from(kwargs, newest_only=False)
    locks = locks_for(result.entries, options, matrix_path, known, locked=locked)
    where = f"-o {shown(str(output))}"
    try:
        output.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        msg = f"{where}: cannot make the folder ({reason}); pass a writable folder"
        raise BadInput(msg) from exc
    for entry in result.entries:
        context = render_entry(entry, options, None, locks[entry.id])
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
@entry_options
@locked_option
@click.option("--no-smoke", is_flag=True, help="Build only; skip the smoke test.")
@gpus_option("GPUs for the smoke test.")
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
@sign_option
@fleet_option
@builder_option
@reports_errors
@proxy_option
def build(
    no_smoke: bool, gpus: str, jobs: int, keep_going: bool, report_file: Path | None,
    junit_file: Path | None, push_registry: str | None, sign: bool, no_cache: bool, locked: bool,
    fleet_gpus: tuple[str, ...], **kwargs: Any,
) -> None:  # fmt: skip
    """Build images for the selected entries, then smoke-test them.

    Without -m, the newest release that fits the selectors is built (a --framework-version
    prefix such as 0.10 builds the newest 0.10.x); a matrix file builds all its entries.
    """

    from envbuild.cli.progress import ProgressView
    from envbuild.core.places import check_output_files
    from envbuild.core.store import ResultStore
    from envbuild.pipeline.entries import RunOptions, run_entries
    from envbuild.pipeline.runs import push_passed, record_run
    from envbuild.report.documents import write_build_reports

    check_output_files(("--report", report_file), ("--junit", junit_file))  # before the builds
    key = signing_key_from(sign, push_registry, "--push")
    options, matrix_path = build_options_from(kwargs), kwargs["matrix_file"]
    with trusting(options.ca_bundle):  # the registry of --push is checked against it too
        knowledge, _, result = plan_from(kwargs, newest_only=True)
        fleet = fleet_from(knowledge, None, fleet_gpus)
        run = RunOptions(
            jobs=jobs, keep_going=keep_going, smoke=not no_smoke, gpus=gpus, no_cache=no_cache,
            push_registry=None if no_smoke else push_registry, fleet=fleet.gpus if fleet else (),
            signed_by=key.public if key else None,
        )  # fmt: skip
        with ProgressView([e.id for e in result.entries]) as view:
            results = run_entries(
                knowledge, result.entries, options, run, store=ResultStore.default(),
                on_event=view.event,
                locks=lambda: locks_for(result.entries, options, matrix_path, knowledge, locked=locked),
            )  # fmt: skip
        click.echo("\n".join(view.summary(results)), err=True)
        summary = os.environ.get("GITHUB_STEP_SUMMARY")
        for problem in record_run(
            results, json_file=report_file, junit_file=junit_file,
            step_summary=Path(summary) if summary else None,
        ):  # fmt: skip
            click.echo(f"envbuild: {problem}", err=True)
        if push_registry is not None and no_smoke:
            click.echo(
                "envbuild: --push publishes only smoke-tested images; nothing pushed (--no-smoke)",
                err=True,
            )
        elif push_registry is not None:
            pushed: dict[str, str] = {}
            lines = _publish_lines(push_registry)

            def done(item: Candidate, published: Published) -> None:
                lines["on_published"](item, published)
                if published.kind == "immutable":
                    pushed[item.source] = f"{published.reference}@{published.digest}"

            try:
                push_passed(
                    results, push_registry, signing_key=key, on_index=_index_line,
                    on_start=lines["on_start"], on_published=done,
                )  # fmt: skip
            finally:  # the report names what reached the registry, also when a push failed
                if report_file is not None and pushed:
                    results = [
                        dataclasses.replace(r, pushed=pushed.get(r.entry.image)) for r in results
                    ]
                    write_build_reports(results, json_file=report_file, junit_file=None)
        if not all(r.passed for r in results):
            sys.exit(EXIT_FAILED)


def _merge_platforms(
    registry: str,
    reports: tuple[Path, ...],
    kwargs: dict[str, Any],
    *,
    images: tuple[str, ...],
    signing_key: SigningKey | None,
) -> None:
    """`publish --merge`: the index over each planned entry's platforms, from what the reports
    of CI's per-platform jobs say they published; no engine involved."""
    from envbuild.core.errors import BadInput
    from envbuild.publish.merge import published_hashes
    from envbuild.publish.platform_index import platform_groups
    from envbuild.publish.push import publish_platform_indexes
    from envbuild.publish.verify import split_registry

    if images:
        msg = "--merge takes the selectors (or -m) of the build jobs, not IMAGE references"
        raise BadInput(msg)
    split_registry(registry)  # a registry without a host is refused before the reports are read
    hashes = published_hashes(reports)
    _, _, result = plan_from(kwargs)
    # The entries the reports speak of, with their other platforms: one missing there blocks
    # its index; an entry no job reported (not in this run's matrix jobs) is left alone.
    groups = [
        members
        for members in platform_groups(list(result.entries)).values()
        if any(entry.id in hashes for entry in members)
    ]
    if not groups:
        msg = (
            "--merge: the reports name no selected entry that is planned for more than one "
            "platform; give the selectors (or -m) of the build jobs, with both platforms"
        )
        raise BadInput(msg)
    members = [(entry, hashes.get(entry.id)) for group in groups for entry in group]
    publish_platform_indexes(registry, members, on_published=_index_line, signing_key=signing_key)


def _index_line(index: IndexPublished) -> None:
    """What publishing an index shows: its reference and digest, then each tag that names it."""
    platforms = ", ".join(child.platform for child in index.children)
    click.echo(f"  {'index':9} {index.reference} {index.digest} ({platforms})")
    host_repository = f"{index.host}/{index.repository}"
    for tag in index.tags:
        click.echo(f"  {'moving':9} {host_repository}:{tag} {index.digest}")
    if index.signature:
        click.echo(f"  {'signature':9} {host_repository}@{index.signature} {index.signature}")
        click.echo(f"  {'attests':9} {host_repository}@{index.attestations} {index.attestations}")


def _publish_lines(registry: str) -> PublishLines:
    """What publishing shows: each image as it starts (stderr), each reference pushed (stdout)."""

    def start(item: Candidate) -> None:
        click.echo(f"publishing {item.source} to {registry}", err=True)

    def done(item: Candidate, pushed: Published) -> None:
        click.echo(f"  {pushed.kind:9} {pushed.reference} {pushed.digest}")

    return {"on_start": start, "on_published": done}


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
@click.option(
    "--merge",
    "merge_reports",
    multiple=True,
    type=click.Path(path_type=Path),
    metavar="REPORT",
    help=(
        "Publish only the index over each entry's platforms, from the --report of each "
        "platform's build job (repeatable); the selectors or -m plan the same entries."
    ),
)
@sign_option
@fleet_option
@reports_errors
@proxy_option
@ca_bundle_option
def publish(
    images: tuple[str, ...], registry: str, report_file: Path | None, sign: bool,
    fleet_gpus: tuple[str, ...], merge_reports: tuple[Path, ...], **kwargs: Any,
) -> None:  # fmt: skip
    """Push vetted images (by selectors, or IMAGE references) and verify what the registry holds.

    Only an image whose smoke test passed for its exact image id is pushed. The immutable tag
    (tag-<content hash>) is pushed and verified first; the smoke report and package list are
    attached to its digest (with --sign, a signature and signed attestations too); then the
    moving tags (torch2.13-cpu-py3.11, latest) follow.
    """
    from envbuild.core.errors import BadInput
    from envbuild.core.places import check_output_files
    from envbuild.core.store import ResultStore
    from envbuild.engine.interface import connect
    from envbuild.knowledge.load import load_knowledge
    from envbuild.publish.push import (
        built_entries,
        candidate,
        entry_candidates,
        publish_platform_indexes,
        publish_reported,
    )

    if images and picked(kwargs):
        msg = "give either IMAGE references or selectors, not both"
        raise BadInput(msg)
    check_output_files(("--report", report_file))  # before any push
    key = signing_key_from(sign, registry, "--registry")
    if merge_reports:
        _merge_platforms(registry, merge_reports, kwargs, images=images, signing_key=key)
        return
    fleet = fleet_from(load_knowledge(), None, fleet_gpus)
    gpus = fleet.gpus if fleet else ()
    if images:
        engine, store = connect(), ResultStore.default()
        items = [candidate(engine, store, ref) for ref in images]
    else:
        _, _, result = plan_from(kwargs)
        engine = connect()
        built = built_entries(engine, result.entries)
        store = ResultStore.default()
        items = entry_candidates(engine, store, built)
    publish_reported(
        engine, store, items, registry, report_file=report_file, fleet=gpus, signing_key=key,
        **_publish_lines(registry),
    )  # fmt: skip
    if not images:  # entries built for several platforms: one tag over their images
        members = [
            (item_entry, item.content_hash) for item_entry, item in zip(built, items, strict=True)
        ]
        publish_platform_indexes(registry, members, on_published=_index_line)


@main.command()
@click.argument("reference")
@click.option("--json", "as_json", is_flag=True, help="Print what was found as JSON.")
@click.option(
    "--key",
    "key_path",
    type=click.Path(path_type=Path),
    metavar="PUB",
    help="Also check the image's signature and signed attestations with this public key.",
)
@reports_errors
@proxy_option
@ca_bundle_option
def verify(reference: str, as_json: bool, key_path: Path | None) -> None:
    """Fetch the smoke report published next to REFERENCE and check it belongs to that image;
    with --key, its signature, its signed attestations and their PASSED verdict too.

    ENVBUILD_REGISTRY_TIMEOUT bounds the whole check (seconds, default 120).
    """
    from envbuild.net.bounded import printable
    from envbuild.publish.keys import load_public_key
    from envbuild.publish.verify import verify_reference

    key = load_public_key(key_path) if key_path is not None else None  # before the network
    found = verify_reference(reference, key)
    packages = [line for line in found.packages.splitlines() if line and not line.startswith("#")]
    if as_json:  # json.dumps escapes every control character the registry's strings may hold
        document = {
            "reference": found.reference,
            "digest": found.digest,
            "passed": found.passed,
            "smoke": found.report,
            "packages": packages,
            "sbom": found.sbom,
            "signed": list(found.signed) if key is not None else None,
        }
        if found.platforms:
            document["platforms"] = [
                {"platform": name, "digest": image.digest, "image_id": image.image_id,
                 "passed": image.passed, "smoke": image.report}
                for name, image in found.platforms
            ]  # fmt: skip
        click.echo(json.dumps(document, indent=2))
    elif found.platforms:
        click.echo(
            f"{printable(reference)}: {found.digest} (an index of {len(found.platforms)} platforms)"
        )
        for name, image in found.platforms:
            verdict = "passed" if image.passed else "FAILED"
            click.echo(
                f"  {printable(name, 40)}: {image.digest}, smoke report of image "
                f"{image.image_id}: {verdict}"
            )
        for line in found.signed:
            click.echo(f"  {printable(line, 300)}")
    else:
        train = found.report.get("train")
        train = train if isinstance(train, dict) else {}
        verdict = "passed" if found.passed else "FAILED"
        first, last = printable(train.get("loss_first"), 40), printable(train.get("loss_last"), 40)
        click.echo(f"{printable(reference)}: {found.digest}")
        click.echo(f"  smoke report of image {found.image_id}: {verdict}")
        click.echo(f"  loss {first} -> {last}; {len(packages)} packages listed")
        if found.sbom is not None:
            sbom = found.sbom
            click.echo(
                f"  SBOM ({printable(sbom['format'], 40)}): {sbom['pypi']} Python and "
                f"{sbom['deb']} OS packages"
            )
        for line in found.signed:
            click.echo(f"  {printable(line, 300)}")
    if not found.passed:
        msg = (
            f"{printable(reference)}: the smoke report attached to {found.digest} did not pass; "
            f"do not use this image, rebuild and publish it again"
        )
        raise EnvbuildError(msg)


@main.command()
@click.argument("image")
@click.option("--json", "as_json", is_flag=True, help="Print the full result as JSON.")
@gpus_option("GPUs for the smoke test.")
@click.option(
    "--timeout",
    type=click.IntRange(10, 7200),
    default=600,
    show_default=True,
    help="Seconds before the payload is killed.",
)
@fleet_option
@reports_errors
def smoke(image: str, as_json: bool, gpus: str, timeout: int, fleet_gpus: tuple[str, ...]) -> None:
    """Prove IMAGE trains and all-reduces: run the smoke payload inside it."""
    from envbuild.core.store import ResultStore
    from envbuild.engine.interface import connect
    from envbuild.knowledge.load import load_knowledge
    from envbuild.report.documents import smoke_lines
    from envbuild.smoke.static import fleet_refusal
    from envbuild.smoke.vet import smoke_image

    knowledge = load_knowledge()
    fleet = fleet_from(knowledge, None, fleet_gpus)  # a bad --gpu fails before any work
    store = ResultStore.default()  # an unusable record fails before minutes of work
    engine = connect()
    engine.remove_leftovers()
    result = smoke_image(engine, image, knowledge=knowledge, gpus=gpus, timeout=timeout)
    store.record_smoke(result)  # publish trusts only recorded results
    if as_json:
        click.echo(json.dumps(result.as_dict(), indent=2))
    else:
        click.echo("\n".join(smoke_lines(result)))
    if not result.passed:
        failed = ", ".join(c.detail for c in result.checks if not c.passed)
        click.echo(f"envbuild: smoke test of {image} failed: {failed}", err=True)
        sys.exit(EXIT_FAILED)
    found = engine.image(image)
    refusal = fleet and found and fleet_refusal(result.payload, found.labels, fleet.gpus)
    if refusal:
        click.echo(f"envbuild: {image} passed, but not for --gpu: {refusal}", err=True)
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
    from envbuild.core.errors import EXIT_NO_ENGINE
    from envbuild.core.models import Selection
    from envbuild.host.doctor import examine_host, report_lines
    from envbuild.knowledge.load import load_knowledge
    from envbuild.plan.matrix_file import default_matrix_path, load_matrix

    knowledge = load_knowledge()
    matrix = load_matrix(matrix_file or default_matrix_path(), knowledge)
    report = examine_host(knowledge, matrix, Selection())
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        click.echo("\n".join(report_lines(report)))
    if not report.engine["reachable"]:
        sys.exit(EXIT_NO_ENGINE)


main.add_command(bench)
main.add_command(knowledge)
main.add_command(base)
main.add_command(lock)
main.add_command(keys)
main.add_command(policy)
