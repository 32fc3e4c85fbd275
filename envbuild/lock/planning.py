"""What plan, build and `envbuild lock` learn from the locks: each entry's lock state, the entries
the resolver cannot satisfy (exclusions in plan, refused by build), the locks a build installs
(`--locked`: only fresh ones), and the locks `envbuild lock` resolves and writes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from envbuild.core.errors import BadInput, EnvbuildError
from envbuild.core.models import BuildOptions, Entry, Exclusion, Knowledge, Lock, Plan
from envbuild.core.names import shown
from envbuild.core.places import CACHE_DIR_FIX, unwritable
from envbuild.lock import MAX_JOBS
from envbuild.lock.lockfile import (
    LockUpdate,
    inputs_digest,
    lock_command,
    lock_for,
    lock_inputs,
    lock_path,
    on_disk,
    unresolvable_reason,
    update_lock,
)
from envbuild.lock.reach import Reachability

_T = TypeVar("_T")


def plan_with_locks(
    plan: Plan, options: BuildOptions, matrix_path: Path | None, knowledge: Knowledge
) -> tuple[Plan, dict[str, str]]:
    """The plan with unresolvable entries moved to the exclusions (the resolver's reason), and
    each remaining entry's lock state (fresh, stale, missing)."""
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
        lines.append(f"  (run {lock_command(matrix_path)} to resolve them)")
    return lines


def locks_for(
    entries: tuple[Entry, ...],
    options: BuildOptions,
    matrix_path: Path | None,
    knowledge: Knowledge,
    *,
    locked: bool,
    note: Callable[[str], None],
) -> dict[str, Lock]:
    """Each entry's fresh lock, read, or resolved and written now (`note` says which) unless
    `locked`. Every entry is looked at before anything is refused: one line per entry whose lock
    is missing or stale under `locked`, or records no solution (BadInput, exit 2)."""

    reachability = Reachability()  # each index is asked once, not once per entry

    def one(entry: Entry) -> Lock:
        return lock_for(
            entry, options, matrix_path=matrix_path, locked=locked, knowledge=knowledge, note=note,
            reachability=reachability,
        )  # fmt: skip

    locks = each_or_all_failures(one, entries, jobs=MAX_JOBS)
    return {lock.entry_id: lock for lock in locks}


def update_locks(
    entries: tuple[Entry, ...],
    options: BuildOptions,
    knowledge: Knowledge,
    *,
    matrix_path: Path | None,
    upgrade: bool,
    write: bool,
    jobs: int,
    on_resolved: Callable[[LockUpdate], None],
) -> list[LockUpdate]:
    """`envbuild lock`: resolve every entry, `jobs` at a time, and write its lock (unless not
    `write`); every entry is tried before the failures are raised, all in one error."""

    if write:
        check_lock_folders(entries, options, knowledge, matrix_path)
    reachability = Reachability()

    def one(entry: Entry) -> LockUpdate:
        update = update_lock(
            entry, options, knowledge, matrix_path=matrix_path, upgrade=upgrade, write=write,
            reachability=reachability,
        )  # fmt: skip
        on_resolved(update)
        return update

    return each_or_all_failures(one, entries, jobs=jobs)


def check_lock_folders(
    entries: Iterable[Entry], options: BuildOptions, knowledge: Knowledge, matrix_path: Path | None
) -> None:
    """BadInput, before anything is resolved, when a folder the locks go to cannot take files."""
    digests = {e.id: inputs_digest(lock_inputs(e, options, knowledge)) for e in entries}
    folders = {lock_path(e, matrix_path, digests[e.id]).parent for e in entries}
    for folder in sorted(folders):
        problem = unwritable(folder)
        if problem is not None:
            fix = CACHE_DIR_FIX if matrix_path is None else "make it writable"
            msg = (
                f"{shown(str(folder))}: cannot write the locks there ({problem}); {fix}, or run "
                f"`{lock_command(matrix_path)} --check` to compare without writing"
            )
            raise BadInput(msg)


def each_or_all_failures(
    work: Callable[[Entry], _T], entries: Iterable[Entry], *, jobs: int
) -> list[_T]:
    """`work` of each entry, `jobs` at a time; when some fail, one error of the gravest kind
    holding every failure's line (so that one run shows everything to fix)."""

    def one(entry: Entry) -> _T | EnvbuildError:
        try:
            return work(entry)
        except EnvbuildError as exc:  # the others are still done
            return exc

    todo = list(entries)
    with ThreadPoolExecutor(max_workers=min(jobs, len(todo) or 1)) as pool:
        outcomes = list(pool.map(one, todo))
    failures = [o for o in outcomes if isinstance(o, EnvbuildError)]
    if failures:
        # One index out of reach fails every entry on it alike: the same line, said once.
        lines = dict.fromkeys(f.message for f in failures)
        raise max(failures, key=lambda e: e.exit_code).__class__("\n".join(lines))
    return [o for o in outcomes if not isinstance(o, EnvbuildError)]


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


def plan_locks_document(document: dict[str, Any], states: dict[str, str]) -> dict[str, Any]:
    """`plan --format json` with each entry's lock state."""
    entries = [{**item, "lock": states.get(item["id"])} for item in document["entries"]]
    return {**document, "entries": entries}
