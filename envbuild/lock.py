"""Locks: each entry's environment resolved on the host with uv, every distribution pinned with
its hashes, for the image's platform (its Python, x86_64, the glibc of its OS).

A lock file is a header of `#` lines (envbuild's version, the entry, a summary, each input and
`# inputs: sha256:<hex>` of them all), then `uv pip compile --generate-hashes` output. It is
*fresh* while its recorded inputs digest is the current one, *stale* otherwise, *missing* when
absent; a combination the resolver cannot satisfy gets a lock that says so (`# unresolvable:`)
and no requirements. A matrix `team.yaml` keeps its locks in `team.lock/<entry-id>.txt`;
builds without a matrix in the cache. No Docker here, and no jinja2.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from packaging.utils import canonicalize_name

from envbuild import __version__
from envbuild.atomic import write_atomically
from envbuild.errors import BadInput, EnvbuildError
from envbuild.models import BuildOptions, Entry, Knowledge, Lock
from envbuild.redact import redact
from envbuild.references import public_url, shown
from envbuild.wheelhouse import framework_index

State = Literal["fresh", "stale", "missing", "unresolvable"]
LOCK_FORMAT = 1
UV_TIMEOUT_S = 300
MAX_LOCK_BYTES = 16 << 20  # a lock with hashes of a large environment is well under 1 MiB
MAX_UV_MESSAGE_BYTES = 64 << 10
MAX_REASON_CHARS = 600

_DIGEST = re.compile(r"^# inputs: (sha256:[0-9a-f]{64})$", re.MULTILINE)
_INPUT = re.compile(r"^# input ([a-z_]+): (.*)$", re.MULTILINE)
_UNRESOLVABLE = re.compile(r"^# unresolvable: (.*)$", re.MULTILINE)
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)", re.MULTILINE)
_USERINFO = re.compile(r"(://)[^/\s@]*@")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def platform_tag(entry: Entry, knowledge: Knowledge) -> str:
    """uv's --python-platform for the entry's image: x86_64-manylinux_<glibc of its OS>."""
    base = knowledge.os_bases.get(entry.os)
    if base is None or base.glibc is None:
        msg = (
            f"matrices/knowledge/os.yaml: bases.{entry.os}.glibc: missing; add the glibc "
            "version of that OS (e.g. '2.36') with its glibc_source"
        )
        raise BadInput(msg)
    return "x86_64-manylinux_" + base.glibc.replace(".", "_")


def lock_inputs(entry: Entry, options: BuildOptions, knowledge: Knowledge) -> dict[str, Any]:
    """What a lock is resolved from: index URLs without credentials, the wheelhouse's mode only."""
    return {
        "format": LOCK_FORMAT,
        "framework": entry.install.requirement,
        "framework_index": public_url(entry.install.index_url),
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


def cache_dir() -> Path:
    """Where locks of builds without a matrix live ($XDG_CACHE_HOME/envbuild/locks)."""
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "envbuild" / "locks"


def lock_path(entry: Entry, matrix_path: Path | None, digest: str) -> Path:
    """`team.lock/<entry-id>.txt` beside a matrix; else the cache, named by the inputs digest."""
    if matrix_path is not None:
        return matrix_path.parent / f"{matrix_path.stem}.lock" / f"{entry.id}.txt"
    return cache_dir() / f"{entry.id}-{digest.removeprefix('sha256:')[:16]}.txt"


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
        mode = path.stat().st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        msg = f"{shown(str(path))}: cannot read the lock ({exc.strerror}); fix or remove it"
        raise BadInput(msg) from exc
    if not stat.S_ISREG(mode):
        msg = f"{shown(str(path))}: not a regular file; remove it and run envbuild lock"
        raise BadInput(msg)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_LOCK_BYTES + 1)
    except OSError as exc:
        msg = f"{shown(str(path))}: cannot read the lock ({exc.strerror}); fix or remove it"
        raise BadInput(msg) from exc
    if len(data) > MAX_LOCK_BYTES:
        return ""  # no envbuild lock is this large: stale, rewritten by `envbuild lock`
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


def lock_state(
    entry: Entry, options: BuildOptions, matrix_path: Path | None, knowledge: Knowledge
) -> State:
    """The state of the entry's lock, as `plan` shows it."""
    digest = inputs_digest(lock_inputs(entry, options, knowledge))
    return state_of(read_lock_text(lock_path(entry, matrix_path, digest)), digest)


def clean(text: str) -> str:
    """uv's text with secrets and URL user-info taken out."""
    return _USERINFO.sub(r"\1***@", redact(_ANSI.sub("", text)))


def one_line_reason(message: str) -> tuple[bool, str]:
    """(the resolver found no solution, uv's reason in one line) from uv's stderr.

    A conflict keeps the resolver's own explanation ("Because transformers==4.50.0 depends on
    torch>=2.6 and you require torch==2.4.1, ..."); any other failure its first line and the
    innermost cause (e.g. the DNS error behind a failed fetch).
    """
    lines = [line.strip() for line in clean(message).splitlines() if line.strip()]
    unsatisfiable = any("No solution found" in line for line in lines)
    causes: list[list[str]] = []
    for line in lines:
        if line.startswith(("hint:", "help:")):
            break
        if line.startswith(("cause:", "╰─▶")):
            causes.append([line.removeprefix("cause:").removeprefix("╰─▶")])
        elif causes:
            causes[-1].append(line)
    first = lines[0].removeprefix("error:").strip() if lines else "uv failed without a message"
    if unsatisfiable and causes:
        picked = causes[0]
    elif causes:  # what failed, what it was doing, and the innermost cause
        outer = causes[0] if len(causes) > 1 else []
        picked = [first + ":", *outer, *([":"] if outer else []), *causes[-1]]
    else:
        picked = [first]
    reason = re.sub(r"\s+", " ", " ".join(picked)).strip(" :")
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[: MAX_REASON_CHARS - 3] + "..."
    return unsatisfiable, reason


_uv_lock = threading.Lock()
_UV_KEPT = frozenset(
    [
        "UV_CACHE_DIR",
        "UV_HTTP_TIMEOUT",
        "UV_HTTP_RETRIES",
        "UV_NATIVE_TLS",
        "UV_CONCURRENT_DOWNLOADS",
        "UV_NO_CACHE",
    ]
)


def uv_binary() -> str:
    """uv's executable, found under a lock: sysconfig's first use is not thread-safe."""
    import uv

    with _uv_lock:
        return str(uv.find_uv_bin())


def _uv_command(
    entry: Entry, options: BuildOptions, knowledge: Knowledge, output: Path
) -> list[str]:
    command = [
        uv_binary(), "pip", "compile", "-", "--generate-hashes", "--no-header",
        "--no-config", "--quiet", "--color", "never",
        "--python-version", entry.python,
        "--python-platform", platform_tag(entry, knowledge),
        "--output-file", str(output),
    ]  # fmt: skip
    if framework_index(entry, options) is not None or options.extra_index_urls:
        # As pip does at build time: the best version across all indexes. uv's default takes a
        # package only from the first index that has it, and torch's own index also serves
        # (older) numpy, jinja2 and the like.
        command += ["--index-strategy", "unsafe-best-match"]
    if options.wheelhouse is not None:
        command += ["--find-links", str(options.wheelhouse)]
    if options.offline:
        command += ["--offline", "--no-index"]
    return command


def _uv_environment(entry: Entry, options: BuildOptions) -> dict[str, str]:
    # Index URLs travel in the environment: a command line is visible to `ps`. The user's own
    # UV_* settings are left out, bar a few that cannot change the result, so that the lock
    # depends on envbuild's inputs alone.
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in _UV_KEPT}
    env["NO_COLOR"] = "1"
    if options.index_url is not None:
        env["UV_INDEX_URL"] = options.index_url
    extra = [*options.extra_index_urls]
    own = framework_index(entry, options)
    if own is not None:
        extra.append(own)
    if extra:
        env["UV_EXTRA_INDEX_URL"] = " ".join(extra)
    if options.ca_bundle is not None:
        env["SSL_CERT_FILE"] = str(options.ca_bundle)
    return env


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """What uv made of an entry: the pinned requirements, or why there are none."""

    body: str  # uv's requirements with hashes; empty when unresolvable
    unresolvable: str | None


def resolve(
    entry: Entry,
    options: BuildOptions,
    knowledge: Knowledge,
    *,
    previous: str | None = None,
    upgrade: bool = False,
) -> Resolution:
    """Resolve the entry with uv, keeping `previous`'s pins where they still fit (unless
    `upgrade`); EnvbuildError (one line) when uv fails for any reason but the requirements."""
    requirements = "\n".join([entry.install.requirement, *entry.packages]) + "\n"
    try:
        with tempfile.TemporaryDirectory(prefix="envbuild-lock-") as scratch:
            output = Path(scratch) / "lock.txt"
            if previous and not upgrade:
                output.write_text(previous, encoding="utf-8")  # uv prefers its pins
            errors = Path(scratch) / "uv.err"
            with errors.open("wb") as err:
                done = subprocess.run(
                    _uv_command(entry, options, knowledge, output),
                    input=requirements.encode(),
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=_uv_environment(entry, options),
                    timeout=UV_TIMEOUT_S,
                    check=False,
                )
            with errors.open("rb") as handle:
                message = handle.read(MAX_UV_MESSAGE_BYTES).decode("utf-8", errors="replace")
            if done.returncode != 0:
                unsatisfiable, reason = one_line_reason(message)
                if unsatisfiable:
                    return Resolution(body="", unresolvable=reason)
                msg = f"{entry.id}: uv could not resolve its lock: {reason}"
                raise EnvbuildError(msg)
            if output.stat().st_size > MAX_LOCK_BYTES:
                msg = f"{entry.id}: uv wrote a lock over {MAX_LOCK_BYTES >> 20} MiB; list fewer packages"
                raise EnvbuildError(msg)
            body = output.read_text(encoding="utf-8", errors="replace")
    except subprocess.TimeoutExpired as exc:
        msg = (
            f"{entry.id}: uv did not finish resolving within {UV_TIMEOUT_S} s; "
            "check that the index is reachable (--index-url, --ca-bundle, --offline)"
        )
        raise EnvbuildError(msg) from exc
    except (OSError, ModuleNotFoundError) as exc:
        msg = f"{entry.id}: cannot run uv ({getattr(exc, 'strerror', None) or exc}); pip install 'uv>=0.5'"
        raise EnvbuildError(msg) from exc
    return Resolution(body=clean(body), unresolvable=None)


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
) -> LockUpdate:
    """Resolve the entry (keeping the old pins unless `upgrade`) and write its lock atomically."""
    inputs = lock_inputs(entry, options, knowledge)
    digest = inputs_digest(inputs)
    path = lock_path(entry, matrix_path, digest)
    old = read_lock_text(path)
    before = state_of(old, digest)
    previous = old if old is not None and unresolvable_reason(old) is None else None
    resolution = resolve(entry, options, knowledge, previous=previous, upgrade=upgrade)
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
) -> Lock:
    """The entry's fresh lock: read it, or (unless `locked`) resolve and write it now, as cargo
    updates Cargo.lock; BadInput (one line) for a missing or stale lock under `locked`, and for
    an entry the resolver cannot satisfy. `note` hears of a lock written now (the CLI: stderr)."""
    inputs = lock_inputs(entry, options, knowledge)
    digest = inputs_digest(inputs)
    path = lock_path(entry, matrix_path, digest)
    text = read_lock_text(path)
    state = state_of(text, digest)
    if state in ("missing", "stale") and locked:
        why = "missing" if text is None else f"stale ({why_stale(text, inputs)})"
        command = f"envbuild lock -m {matrix_path}" if matrix_path else "envbuild lock"
        msg = f"{path} is {why}; run {command}"
        raise BadInput(msg)
    if state in ("missing", "stale"):
        update = update_lock(entry, options, knowledge, matrix_path=matrix_path)
        said = f"{entry.id}: lock {'written' if text is None else 'updated'}: {path}"
        if note is not None:
            note(said)
        else:
            logging.getLogger(__name__).warning("%s", said)
        text = update.text
    assert text is not None
    reason = unresolvable_reason(text)
    if reason is not None:
        raise BadInput(refusal(entry, reason))
    return Lock(entry_id=entry.id, text=text, path=path)
