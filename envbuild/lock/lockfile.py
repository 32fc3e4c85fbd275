"""Locks: each entry's environment resolved on the host with uv, every distribution pinned with
its hashes, for the image's platform (its Python, its machine (x86_64, aarch64), the glibc of its OS).

A lock file is a header of `#` lines (envbuild's version, the entry, a summary, each input and
`# inputs: sha256:<hex>` of them all), then `uv pip compile --generate-hashes` output. It is
*fresh* while its recorded inputs digest is the current one, *stale* otherwise, *missing* when
absent; a combination the resolver cannot satisfy gets a lock that says so (`# unresolvable:`)
and no requirements. A matrix `team.yaml` keeps its locks in `team.lock/<entry-id>.txt`;
builds without a matrix in the cache. No Docker here, and no jinja2.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from envbuild import __version__
from envbuild.core.atomic import write_atomically
from envbuild.core.errors import BadInput
from envbuild.core.files import FileTooLarge, NotRegularFile, read_small_file
from envbuild.core.models import BuildOptions, Entry, Knowledge, Lock
from envbuild.core.names import public_url, shown
from envbuild.core.places import CACHE_DIR_FIX, lock_cache_dir, unwritable
from envbuild.lock.reach import Reachability
from envbuild.lock.uv import MAX_LOCK_BYTES, platform_tag, resolve

State = Literal["fresh", "stale", "missing", "unresolvable"]
LOCK_FORMAT = 1

_DIGEST = re.compile(r"^# inputs: (sha256:[0-9a-f]{64})$", re.MULTILINE)
_INPUT = re.compile(r"^# input ([a-z_]+): (.*)$", re.MULTILINE)
_UNRESOLVABLE = re.compile(r"^# unresolvable: (.*)$", re.MULTILINE)
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)", re.MULTILINE)


def lock_inputs(entry: Entry, options: BuildOptions, knowledge: Knowledge) -> dict[str, Any]:
    """What a lock is resolved from: index URLs without credentials, the wheelhouse's mode only."""
    return {
        "format": LOCK_FORMAT,
        "framework": entry.install.requirement,
        "framework_index": public_url(options.framework_index or entry.install.index_url),
        "packages": list(entry.packages),
        "python": entry.python,
        "platform": platform_tag(entry, knowledge),
        "index_url": public_url(options.index_url),
        "extra_index_urls": [public_url(u) for u in options.extra_index_urls],
        "wheelhouse": options.wheelhouse is not None,
        "offline": options.offline,
    }


def inputs_digest(inputs: dict[str, Any]) -> str:
    """sha256 of the inputs' canonical JSON."""
    canonical = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def lock_path(entry: Entry, matrix_path: Path | None, digest: str) -> Path:
    """`team.lock/<entry-id>.txt` beside a matrix; else the cache, named by the inputs digest."""
    if matrix_path is not None:
        return matrix_path.parent / f"{matrix_path.stem}.lock" / f"{entry.id}.txt"
    return lock_cache_dir() / f"{entry.id}-{digest.removeprefix('sha256:')[:16]}.txt"


def header(entry: Entry, inputs: dict[str, Any], digest: str) -> str:
    """The `#` lines a lock starts with: who wrote it, what for, from what."""
    packages = ", ".join(entry.packages) or "no other packages"
    lines = [
        f"# envbuild {__version__} lock of {entry.id}; written by `envbuild lock`, do not edit",
        f"# {entry.install.requirement} with {packages} for CPython {entry.python} "
        f"on {inputs['platform']}",
        *(f"# input {key}: {json.dumps(inputs[key])}" for key in sorted(inputs)),
        f"# inputs: {digest}",
    ]
    return "\n".join(lines) + "\n"


def read_lock_text(path: Path) -> str | None:
    """A lock file's text (None when absent); bounded; undecodable bytes read as stale text."""
    try:
        data = read_small_file(path, MAX_LOCK_BYTES)
    except (FileNotFoundError, NotADirectoryError):  # ENOTDIR: a file where a folder would be
        return None
    except NotRegularFile as exc:
        msg = (
            f"{shown(str(path))}: not a regular file ({exc.kind}); remove it and run envbuild lock"
        )
        raise BadInput(msg) from exc
    except FileTooLarge:
        return ""  # no envbuild lock is this large: stale, rewritten by `envbuild lock`
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or "not a usable file name"
        msg = f"{shown(str(path))}: cannot read the lock ({reason}); fix or remove it"
        raise BadInput(msg) from exc
    return data.decode("utf-8", errors="replace")


def recorded_digest(text: str) -> str | None:
    """The inputs digest a lock's header records."""
    match = _DIGEST.search(text)
    return match.group(1) if match else None


def unresolvable_reason(text: str) -> str | None:
    """The reason a lock records for an entry the resolver cannot satisfy."""
    match = _UNRESOLVABLE.search(text)
    return match.group(1) if match else None


def pins(text: str) -> dict[str, str]:
    """Canonical package name -> pinned version, from a lock's requirement lines."""
    return {canonicalize_name(m.group(1)): m.group(2) for m in _PIN.finditer(text)}


_VIA_ONE = re.compile(r"^\s+# via ([A-Za-z0-9][A-Za-z0-9._-]*)\s*$")
_VIA_MORE = re.compile(r"^\s+#   ([A-Za-z0-9][A-Za-z0-9._-]*)\s*$")


def framework_part(text: str) -> str:
    """The lock's framework part: the requirement blocks (pin, hashes, annotations), in the
    lock's order, of the framework its header names and of everything that pulls in, by the
    lock's `# via` annotations; the whole lock when every pin is the framework's. "" when there
    is no part to tell: no framework named, or no annotations.

    This part is the entry's framework image (templates/framework.j2), which the image is built
    FROM, so that a change to the team's packages leaves its layers as they were, and entries
    with the same part (the same framework image key) share them."""
    recorded = dict(_INPUT.findall(text))
    try:
        root = canonicalize_name(Requirement(json.loads(recorded["framework"])).name)
    except (KeyError, ValueError, TypeError, InvalidRequirement):
        return ""
    blocks: dict[str, list[str]] = {}
    parents: dict[str, set[str]] = {}
    current: list[str] | None = None
    name = ""
    for line in text.splitlines(keepends=True):
        match = _PIN.match(line)
        if match:
            name = canonicalize_name(match.group(1))
            current = blocks.setdefault(name, [])
            parents.setdefault(name, set())
        elif current is None or not line[:1].isspace():
            current = None
            continue
        current.append(line)
        via = _VIA_ONE.match(line) or _VIA_MORE.match(line)
        if via and not match:
            parents[name].add(canonicalize_name(via.group(1)))
    if root not in blocks or not any(parents.values()):
        return ""
    part: set[str] = {root}
    grown = True
    while grown:
        grown = False
        for child, of in parents.items():
            if child not in part and of & part:
                part.add(child)
                grown = True
    return "".join(line for child, lines in blocks.items() if child in part for line in lines)


CUDA_PART_HEADER = (
    "# The CUDA libraries of an envbuild lock, installed below the framework: every lock that\n"
    "# pins the same ones has this same file, and so the same layer.\n"
)


def cuda_part(text: str, pattern: str) -> str:
    """The pins of `text` whose canonical names match `pattern` (fnmatch), each with its hash
    lines and nothing else (no annotations, no header of the lock's): the same bytes for every
    lock that pins the same ones, whatever else it pins. "" when it pins none.

    The image installs it first, from a COPY of its own (partials/install.j2), so that torch
    releases pinning the same CUDA libraries (the nvidia-* wheels, most of a CUDA image's bytes)
    share that layer: a node reuses a layer only when every layer below it is the same too."""
    kept: list[str] = []
    keep = continued = False
    for line in text.splitlines(keepends=True):
        if not continued:
            match = _PIN.match(line)
            keep = match is not None and fnmatch.fnmatchcase(
                canonicalize_name(match.group(1)), pattern
            )
        if keep:
            kept.append(line if line.endswith("\n") else line + "\n")
        continued = line.rstrip("\n").endswith("\\")
    return CUDA_PART_HEADER + "".join(kept) if kept else ""


def pin_changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """The pins that differ: `numpy 2.1.0 → 2.2.1`, `+ pkg 1.0`, `- pkg`."""
    lines = []
    for name in sorted(old.keys() | new.keys()):
        if name not in new:
            lines.append(f"- {name}")
        elif name not in old:
            lines.append(f"+ {name} {new[name]}")
        elif old[name] != new[name]:
            lines.append(f"{name} {old[name]} → {new[name]}")
    return lines


def why_stale(text: str, inputs: dict[str, Any]) -> str:
    """Which recorded inputs differ from the current ones, as words."""
    recorded = dict(_INPUT.findall(text))
    changed = [key for key in sorted(inputs) if recorded.get(key) != json.dumps(inputs[key])]
    return f"{', '.join(changed)} changed" if changed and recorded else "not an envbuild lock"


def state_of(text: str | None, digest: str) -> State:
    """fresh / stale / missing / unresolvable (fresh, but recording no solution)."""
    if text is None:
        return "missing"
    if recorded_digest(text) != digest:
        return "stale"
    return "unresolvable" if unresolvable_reason(text) is not None else "fresh"


@dataclass(frozen=True, kw_only=True)
class OnDisk:
    """An entry's lock as it stands: what it must be resolved from, where it lives, its text."""

    inputs: dict[str, Any]
    digest: str
    path: Path
    text: str | None

    @property
    def state(self) -> State:
        return state_of(self.text, self.digest)


def on_disk(
    entry: Entry, options: BuildOptions, matrix_path: Path | None, knowledge: Knowledge
) -> OnDisk:
    """Read the entry's lock where its inputs place it."""
    inputs = lock_inputs(entry, options, knowledge)
    digest = inputs_digest(inputs)
    path = lock_path(entry, matrix_path, digest)
    return OnDisk(inputs=inputs, digest=digest, path=path, text=read_lock_text(path))


def lock_state(
    entry: Entry, options: BuildOptions, matrix_path: Path | None, knowledge: Knowledge
) -> State:
    """The state of the entry's lock, as `plan` shows it."""
    return on_disk(entry, options, matrix_path, knowledge).state


def lock_command(matrix_path: Path | None) -> str:
    """The command that resolves the locks again."""
    return f"envbuild lock -m {matrix_path}" if matrix_path else "envbuild lock"


@dataclass(frozen=True, kw_only=True)
class LockUpdate:
    """One entry's lock before and after `envbuild lock`."""

    entry: Entry
    path: Path
    before: State
    text: str  # the lock as written (or as it would be, with write=False)
    changes: tuple[str, ...]  # pinned-version differences
    changed: bool  # the file's text differs from what was there

    @property
    def unresolvable(self) -> str | None:
        """The resolver's reason when the entry cannot be satisfied."""
        return unresolvable_reason(self.text)


def update_lock(
    entry: Entry,
    options: BuildOptions,
    knowledge: Knowledge,
    *,
    matrix_path: Path | None,
    upgrade: bool = False,
    write: bool = True,
    found: OnDisk | None = None,
    reachability: Reachability | None = None,
) -> LockUpdate:
    """Resolve the entry (keeping the old pins unless `upgrade`) and write its lock atomically,
    where `found` (default: where the entry's inputs place it) says."""
    found = found or on_disk(entry, options, matrix_path, knowledge)
    inputs, digest, path, old = found.inputs, found.digest, found.path, found.text
    before = found.state
    previous = old if old is not None and unresolvable_reason(old) is None else None
    resolution = resolve(
        entry, options, knowledge, previous=previous, upgrade=upgrade, reachability=reachability
    )
    text = header(entry, inputs, digest)
    if resolution.unresolvable is not None:
        text += f"# unresolvable: {resolution.unresolvable}\n"
    else:
        text += resolution.body
    # The version line alone does not make a lock change.
    changed = old is None or old.split("\n", 1)[-1] != text.split("\n", 1)[-1]
    if write and changed:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(path, text, keep_mode=path.exists())
        except OSError as exc:
            msg = f"{shown(str(path))}: cannot write the lock ({exc.strerror}); make the folder writable"
            raise BadInput(msg) from exc
    return LockUpdate(
        entry=entry,
        path=path,
        before=before,
        text=text if changed else old or text,
        changes=tuple(pin_changes(pins(old or ""), pins(text))),
        changed=changed,
    )


def _writable(path: Path) -> bool:
    """Whether a lock can be written at `path`: its folder takes new files, or can be made so.
    Tried, not read from permission bits, which root passes on a read-only mount."""
    return unwritable(path.parent) is None and not path.is_dir()


def refusal(entry: Entry, reason: str) -> str:
    """The one line an unresolvable entry is refused with."""
    return (
        f"{entry.id}: its packages cannot be installed with {entry.install.requirement}: {reason}"
    )


def lock_for(
    entry: Entry,
    options: BuildOptions,
    *,
    matrix_path: Path | None,
    locked: bool,
    knowledge: Knowledge,
    note: Callable[[str], None] | None = None,
    reachability: Reachability | None = None,
) -> Lock:
    """The entry's fresh lock: read it, or (unless `locked`) resolve and write it now, as cargo
    updates Cargo.lock; BadInput (one line) for a missing or stale lock under `locked`, and for
    an entry the resolver cannot satisfy. `note` hears of a lock written now (the CLI: stderr)."""
    found = on_disk(entry, options, matrix_path, knowledge)
    text, state = found.text, found.state
    if state in ("missing", "stale") and locked:
        why = "missing" if text is None else f"stale ({why_stale(text, found.inputs)})"
        msg = f"{found.path} is {why}; run {lock_command(matrix_path)}"
        raise BadInput(msg)
    kept: Path | None = found.path  # None: resolved for this run, kept nowhere
    if state in ("missing", "stale"):
        said = f"{entry.id}: lock {'written' if text is None else 'updated'}: {found.path}"
        if matrix_path is not None and not _writable(found.path):
            # A matrix in a read-only folder still builds: its lock goes to the cache, named by
            # the entry's inputs like the lock of a build without a matrix, and is reused there.
            cached = lock_path(entry, None, found.digest)
            said = f"{entry.id}: {found.path.parent} cannot be written; lock kept in {cached}"
            found = dataclasses.replace(found, path=cached, text=read_lock_text(cached))
            kept = cached
        if found.state in ("fresh", "unresolvable"):  # the cache held it already
            text = found.text
        else:
            if not _writable(found.path):  # a cache is no state: the command still works
                kept = None
                said = (
                    f"{entry.id}: {found.path.parent} cannot be written; lock resolved for this "
                    f"run only ({CACHE_DIR_FIX} to keep it)"
                )
            update = update_lock(
                entry, options, knowledge, matrix_path=matrix_path, found=found,
                write=kept is not None, reachability=reachability,
            )  # fmt: skip
            text = update.text
        if note is not None:
            note(said)
        else:
            logging.getLogger(__name__).warning("%s", said)
    assert text is not None
    reason = unresolvable_reason(text)
    if reason is not None:
        raise BadInput(refusal(entry, reason))
    return Lock(entry_id=entry.id, text=text, path=kept)
