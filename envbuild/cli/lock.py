"""`envbuild lock`: resolve the selected entries with their packages and write their locks.

Registered on the main group by cli.main; heavy modules are imported inside the command.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from envbuild.cli.options import (
    build_options_from,
    fetch_options,
    package_options,
    plan_from,
    proxy_option,
    reports_errors,
    selectors,
)
from envbuild.core.errors import EXIT_FAILED
from envbuild.lock import MAX_JOBS

if TYPE_CHECKING:
    from envbuild.core.models import BuildOptions, Entry, Knowledge, Lock


def note(line: str) -> None:
    """A line about the locks, on stderr."""
    click.echo(f"envbuild: {line}", err=True)


def locks_for(
    entries: tuple[Entry, ...],
    options: BuildOptions,
    matrix_path: Path | None,
    knowledge: Knowledge,
    *,
    locked: bool,
) -> dict[str, Lock]:
    """Each entry's lock (see envbuild.lock.planning.locks_for), each note on stderr."""
    from envbuild.lock import planning

    return planning.locks_for(entries, options, matrix_path, knowledge, locked=locked, note=note)


@click.command("lock")
@selectors
@package_options
@fetch_options
@click.option("--upgrade", is_flag=True, help="Take newer versions; default: keep the old pins.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if any lock would change (CI).")
@click.option(
    "-j",
    "--jobs",
    type=click.IntRange(1, 32),
    default=MAX_JOBS,
    show_default=True,
    help="Entries resolved at the same time.",
)
@reports_errors
@proxy_option
def lock(upgrade: bool, check: bool, jobs: int, **kwargs: Any) -> None:
    """Resolve every selected entry with its packages (uv, hashes) and write its lock.

    A matrix team.yaml keeps its locks in team.lock/<entry-id>.txt, to be committed; each
    entry's pinned-version changes are printed, or 'unchanged'.
    """
    from envbuild.lock.lockfile import lock_command
    from envbuild.lock.planning import update_lines, update_locks

    options = build_options_from(kwargs)
    matrix_path: Path | None = kwargs["matrix_file"]
    knowledge, _, plan = plan_from(kwargs)
    click.echo(f"locking {len(plan.entries)} entries", err=True)
    updates = update_locks(
        plan.entries, options, knowledge, matrix_path=matrix_path, upgrade=upgrade,
        write=not check, jobs=jobs,
        on_resolved=lambda update: click.echo(f"  resolved {update.entry.id}", err=True),
    )  # fmt: skip
    for update in updates:
        click.echo("\n".join(update_lines(update)))
    changed = [u.entry.id for u in updates if u.changed]
    if check and changed:
        click.echo(
            f"envbuild: {len(changed)} of {len(updates)} locks would change; "
            f"run {lock_command(matrix_path)} and commit them",
            err=True,
        )
        sys.exit(EXIT_FAILED)


locked_option = click.option(
    "--locked", is_flag=True, help="Use only fresh locks; exit 2 if one is missing or stale (CI)."
)
