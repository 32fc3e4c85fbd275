"""Maintenance commands: `envbuild knowledge refresh` and `envbuild base bootstrap`.

Registered on the main group by cli; heavy modules are imported inside the commands.
"""

from __future__ import annotations

import sys

import click

from envbuild.cli.options import proxy_option, reports_errors
from envbuild.core.errors import EXIT_FAILED


@click.group()
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
@proxy_option
def knowledge_refresh(frameworks: tuple[str, ...], check: bool) -> None:
    """Read what a plain `pip install` of each release pulls from PyPI; update the facts, show the diff."""
    from envbuild.knowledge.refresh import FRAMEWORK_PACKAGES, refresh

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


@click.group()
def base() -> None:
    """Local base images for hosts that cannot pull."""


@base.command("bootstrap")
@click.option("--suite", default="bookworm", show_default=True, help="Debian suite.")
@click.option("--tag", metavar="REF", help="Image reference [default: envbuild/base:SUITE].")
@click.option("--mirror", default="http://deb.debian.org/debian", show_default=True)
@click.option(
    "--with-python", is_flag=True, help="Include the suite's python3 and venv (for offline builds)."
)
@click.option(
    "--platform",
    "platform_text",
    metavar="PLATFORMS",
    help=(
        "linux/amd64, linux/arm64 or both comma-separated (default: this host's); another "
        "platform's base is tagged REF-arm64, which `build --base-image REF` finds."
    ),
)
@click.option("--force", is_flag=True, help="Rebuild even if the tag exists.")
@reports_errors
def base_bootstrap(
    suite: str, tag: str | None, mirror: str, with_python: bool, platform_text: str | None,
    force: bool,
) -> None:  # fmt: skip
    """Make a minimal Debian base image with debootstrap, one per platform."""
    from envbuild.build.bootstrap import bootstrap_base, default_tag
    from envbuild.cli.options import platforms_from
    from envbuild.core.platforms import MACHINE, host_platform, platform_ref
    from envbuild.engine.interface import connect

    platforms = (platforms_from(platform_text) or host_platform()).split(",")
    engine = connect()
    ref = tag or default_tag(suite)
    for platform in platforms:
        target = platform_ref(ref, platform)
        if force or engine.image(target) is None:
            emulated = MACHINE[platform] != MACHINE[host_platform()]
            took = "a few minutes, under emulation" if emulated else "about 30 s"
            click.echo(f"bootstrapping {target} ({platform}) from {mirror} ({took})", err=True)
        target, image_id, created = bootstrap_base(
            engine, suite=suite, tag=ref, mirror=mirror, with_python=with_python, force=force,
            platform=platform,
        )  # fmt: skip
        state = "created" if created else "already present"
        click.echo(f"{target} {state}: {image_id}")
