"""`envbuild lock`, and what plan and build learn from the locks: each entry's lock state, the
entries the resolver cannot satisfy (exclusions in plan, refused by build), `--locked`.

Registered on the main group by cli; heavy modules are imported inside the functions.
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
from envbuild.core.errors import EXIT_FAILED, EnvbuildError

if TYPE_CHECKING:
    from envbuild.core.models import BuildOptions, Entry, Knowledge, Lock, Plan
    from envbuild.lock.lockfile import LockUpdate

MAX_JOBS = 8


def plan_with_locks(
    plan: Plan, options: BuildOptions, matrix_path: Path | None, knowledge: Knowledge
) -> tuple[Plan, dict[str, str]]:
    """The plan with unresolvable entries moved to the exclusions (the resolver's reason), and
    each remaining entry's lock state (fresh, stale, missing)."""
    from envbuild.core.models import Exclusion, Plan
    from envbuild.lock.lockfile import on_disk, unresolvable_reason

    entries: list[Entry] = []
    excluded = list(plan.excluded)
    states: dict[str, str] = {}
    for entry in plan.entries:
        found = on_disk(entry, options, matrix_path, knowledge)
        state = found.state
        if state == "unresolvable":
            reason = f"its packages cannot be installed: {unresolvable_reason(found.text or '')}"
            excluded.append(Exclusion(combination=entry.combination(), reason=reason))
            continue
        entries.append(entry)
        states[entry.id] = state
    return Plan(entries=tuple(entries), excluded=tuple(excluded)), states


def lock_summary(states: dict[str, str], matrix_path: Path | None) -> list[str]:
    """The lock states under a plan table: counts, then each entry whose lock is not fresh."""
    if not states:
        return []
    where = f"{matrix_path.stem}.lock/" if matrix_path else "the cache"
    counts = {s: sum(v == s for v in states.values()) for s in ("fresh", "stale", "missing")}
    lines = [f"locks in {where}: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n)]
    lines += [f"  {state:7}  {eid}" for eid, state in states.items() if state != "fresh"]
    if counts["stale"] or counts["missing"]:
        from envbuild.lock.lockfile import lock_command

        lines.append(f"  (run {lock_command(matrix_path)} to resolve them)")
    return lines


def locks_for(
    entries: tuple[Entry, ...],
    options: BuildOptions,
    matrix_path: Path | None,
    knowledge: Knowledge,
    *,
    locked: bool,
) -> dict[str, Lock]:
    """Each entry's fresh lock, read, or resolved and written now (stderr says which) unless
    `locked`. Every entry is looked at before anything is refused: one line per entry whose lock
    is missing or stale under `locked`, or records no solution (BadInput, exit 2)."""
    from concurrent.futures import ThreadPoolExecutor

    from envbuild.lock.lockfile import lock_for

    def note(line: str) -> None:
        click.echo(f"envbuild: {line}", err=True)

    def one(entry: Entry) -> Lock | EnvbuildError:
        try:
            return lock_for(
                entry, options, matrix_path=matrix_path, locked=locked, knowledge=knowledge,
                note=note,
            )  # fmt: skip
        except EnvbuildError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=min(MAX_JOBS, len(entries) or 1)) as pool:
        outcomes = list(pool.map(one, entries))
    failures = [o for o in outcomes if isinstance(o, EnvbuildError)]
    if failures:
        raise max(failures, key=lambda e: e.exit_code).__class__(
            "\n".join(f.message for f in failures)
        )
    return {lock.entry_id: lock for lock in outcomes if not isinstance(lock, EnvbuildError)}


def update_lines(update: LockUpdate) -> list[str]:
    """What `envbuild lock` prints for one entry: its changes, or 'unchanged'."""
    head = f"{update.entry.id}:"
    if update.unresolvable is not None:
        return [f"{head} unresolvable: {update.unresolvable}"]
    if not update.changed:
        return [f"{head} unchanged"]
    if not update.changes:
        return [f"{head} {update.path} rewritten (inputs changed, same pins)"]
    return [f"{head} {update.path}", *(f"  {line}" for line in update.changes)]


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
    from concurrent.futures import ThreadPoolExecutor

    from envbuild.lock.lockfile import lock_command, update_lock

    options = build_options_from(kwargs)
    matrix_path: Path | None = kwargs["matrix_file"]
    knowledge, _, plan = plan_from(kwargs)
    entries = plan.entries
    click.echo(f"locking {len(entries)} entries", err=True)

    def one(entry: Entry) -> LockUpdate | EnvbuildError:
        try:
            update = update_lock(
                entry, options, knowledge, matrix_path=matrix_path, upgrade=upgrade, write=not check
            )
        except EnvbuildError as exc:  # the others are still resolved and written
            return exc
        click.echo(f"  resolved {entry.id}", err=True)
        return update

    with ThreadPoolExecutor(max_workers=min(jobs, len(entries) or 1)) as pool:
        outcomes = list(pool.map(one, entries))
    updates = [u for u in outcomes if not isinstance(u, EnvbuildError)]
    for update in updates:
        click.echo("\n".join(update_lines(update)))
    failures = [u for u in outcomes if isinstance(u, EnvbuildError)]
    if failures:
        raise max(failures, key=lambda e: e.exit_code).__class__(
            "\n".join(f.message for f in failures)
        )
    changed = [u.entry.id for u in updates if u.changed]
    if check and changed:
        click.echo(
            f"envbuild: {len(changed)} of {len(updates)} locks would change; "
            f"run {lock_command(matrix_path)} and commit them",
            err=True,
        )
        sys.exit(EXIT_FAILED)


def plan_locks_document(document: dict[str, Any], states: dict[str, str]) -> dict[str, Any]:
    """`plan --format json` with each entry's lock state."""
    entries = [{**item, "lock": states.get(item["id"])} for item in document["entries"]]
    return {**document, "entries": entries}


locked_option = click.option(
    "--locked", is_flag=True, help="Use only fresh locks; exit 2 if one is missing or stale (CI)."
)
