"""Whether every package of the image's lock imports; runs INSIDE the container.

The packages section of the smoke payloads: each distribution the lock pins must be installed,
and each of its top-level modules must import, in a child interpreter (so that a module that
crashes or hangs the interpreter is recorded, never takes the payload down).  The modules come
from the installed metadata: top_level.txt where it is true to the RECORD, else the RECORD's
own roots.  Standard library and smoke_harness only, Python 3.8 and later.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import smoke_harness as harness

# Where envbuild's images keep the lock they were installed from.
LOCK_PATH = "/opt/venv/envbuild.lock"
# One module's import running longer than this is taken for a hang: the child is killed.
IMPORT_HANG_S = 60.0
# The packages section's deadline: every module of the lock, in one child or more.
PACKAGES_TIMEOUT_S = 180.0

# `name==version \` (an optional `[extras]`; a marker after `;`); --hash and comment lines follow.
_PIN = re.compile(
    r"^([A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)(?:\[[^\]]*\])?\s*==\s*([^\s;\\]+)"
)
_CODE_SUFFIXES = (".py", ".so", ".pyd")

# Runs in a child interpreter: imports each module named in argv[1] (a JSON list) and writes one
# JSON line before ({"start": m}) and after ({"module": m, ...}) each import on its own copy of
# stdout, so that the parent can tell which import crashed or hung the interpreter.
_IMPORT_CHILD = r"""
import importlib, json, os, sys
out = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr
for name in json.loads(sys.argv[1]):
    out.write(json.dumps({"start": name}) + "\n")
    out.flush()
    try:
        importlib.import_module(name)
        result = {"module": name, "error": None}
    except BaseException as exc:
        text = " ".join(str(exc).split())
        text = text[:297] + "..." if len(text) > 300 else text
        result = {"module": name, "error": type(exc).__name__ + (": " + text if text else "")}
    out.write(json.dumps(result) + "\n")
    out.flush()
"""


def lock_pins(text: str) -> list[tuple[str, str]]:
    """(name, version) of each requirement of a lock: `name==version \\` lines; the `--hash`
    continuation lines, comments and uv's `# via` annotations are skipped."""
    pins = []
    for line in text.splitlines():
        if not line or line[0].isspace() or line.startswith("#"):
            continue
        found = _PIN.match(line)
        if found:
            pins.append((found.group(1), found.group(2)))
    return pins


def find_distribution(name: str, path: list[str] | None = None) -> Any:
    """The installed distribution called ``name`` (any spelling: `-`, `_`, `.`, case), else None."""
    import importlib.metadata

    spellings = (name, name.replace("-", "_"), name.replace("_", "-"))
    where: dict[str, Any] = {} if path is None else {"path": path}
    for candidate in dict.fromkeys(s for n in spellings for s in (n, n.lower())):
        for dist in importlib.metadata.distributions(name=candidate, **where):
            return dist
    return None


def record_roots(dist: Any) -> set[str] | None:
    """Top-level modules and packages a distribution installed, from its RECORD (None without one).

    A root is a top-level `x.py` or extension module, or a folder holding code; dist-info/data
    folders, `__pycache__`, `.pth` files and scripts (`../../bin/...`) are not modules.
    """
    files = dist.files
    if files is None:
        return None
    roots = set()
    for file in files:
        parts = getattr(file, "parts", None) or tuple(str(file).split("/"))
        first = parts[0] if parts else ""
        if not first or first.startswith("..") or first == "__pycache__":
            continue
        if first.endswith((".dist-info", ".data", ".egg-info")):
            continue
        if len(parts) == 1:
            if first.endswith(".py"):
                name = first[: -len(".py")]
            elif first.endswith((".so", ".pyd")):
                name = first.split(".")[0]
            else:  # .pth files and other data
                continue
        elif parts[-1].endswith(_CODE_SUFFIXES):
            name = first
        else:
            continue
        if name.isidentifier():
            roots.add(name)
    return roots


def top_level_modules(dist: Any) -> list[str]:
    """The modules a distribution provides: its top_level.txt (names it really installed, when its
    RECORD says), else its RECORD's roots; private `_x` names only when there is nothing else."""
    roots = record_roots(dist)
    names: list[str] = []
    text = dist.read_text("top_level.txt")
    if text:
        for line in text.splitlines():
            name = line.strip().replace("/", ".").split(".")[0]
            if name.isidentifier() and (roots is None or name in roots):
                names.append(name)
    if not names and roots:
        names = list(roots)
    unique = sorted(set(names))
    public = [name for name in unique if not name.startswith("_")]
    return public or unique


def import_modules(
    modules: list[str],
    *,
    deadline_s: float,
    hang_s: float = IMPORT_HANG_S,
    python: str | None = None,
    path: list[str] | None = None,
) -> dict[str, str | None]:
    """Import each module in a child interpreter: module -> None if it imported, else why not.

    One child imports them all, in order; when one crashes the interpreter (os._exit, a signal)
    or hangs past ``hang_s``, it is recorded and a new child goes on with the rest, so that no
    module can take the payload down. Whatever is left at ``deadline_s`` is recorded as not tried.
    ``path``: folders searched before the interpreter's own (PYTHONPATH).
    """
    results: dict[str, str | None] = {}
    pending = list(dict.fromkeys(modules))
    end = time.monotonic() + deadline_s
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join([*path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    while pending and time.monotonic() < end:
        proc, lines = _start_import_child(pending, python or sys.executable, env)
        progressed = _follow_import_child(proc, lines, pending, results, end=end, hang_s=hang_s)
        if proc.stdout is not None:
            proc.stdout.close()
        if not progressed:
            break
    for name in pending:
        results.setdefault(
            name, f"not tried: no time left ({harness.seconds_text(deadline_s)} s for all)"
        )
    return results


def _start_import_child(
    modules: list[str], python: str, env: dict[str, str]
) -> tuple[subprocess.Popen[bytes], queue.Queue[bytes | None]]:
    """A child interpreter importing ``modules`` in order, and the queue of the lines it writes
    (None when it closed its output), read by a thread of its own."""
    proc = subprocess.Popen(
        [python, "-c", _IMPORT_CHILD, json.dumps(modules)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,  # so that what an import started is killed with it
    )
    lines: queue.Queue[bytes | None] = queue.Queue()

    def read(stream: Any = proc.stdout) -> None:
        for line in iter(stream.readline, b""):
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, name="import-child", daemon=True).start()
    return proc, lines


def _follow_import_child(
    proc: subprocess.Popen[bytes],
    lines: queue.Queue[bytes | None],
    pending: list[str],
    results: dict[str, str | None],
    *,
    end: float,
    hang_s: float,
) -> bool:
    """Record in ``results`` (and take out of ``pending``) what one import child settles, until
    it ends, spends more than ``hang_s`` on one module or reaches ``end`` (monotonic); whether
    it settled any module."""
    current: str | None = None
    since = time.monotonic()
    progressed = False
    while True:
        hang_at = since + hang_s
        try:
            line = lines.get(timeout=max(0.0, min(end, hang_at) - time.monotonic()))
        except queue.Empty:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            if current is None or time.monotonic() < hang_at:
                return progressed
            results[current] = f"no result within {harness.seconds_text(hang_s)} s (hung?), killed"
            pending.remove(current)
            return True
        if line is None:
            return _import_child_ended(proc.wait(10), current, pending, results) or progressed
        message = _child_message(line)
        if "start" in message:
            current, since = str(message["start"]), time.monotonic()
        elif message.get("module") in pending:
            name = str(message["module"])
            error = message.get("error")
            results[name] = None if error is None else str(error)
            pending.remove(name)
            current, progressed = None, True


def _child_message(line: bytes) -> dict[str, Any]:
    """One JSON line of the import child as a dict; {} for anything else an import printed."""
    try:
        message = json.loads(line)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


def _import_child_ended(
    code: int, current: str | None, pending: list[str], results: dict[str, str | None]
) -> bool:
    """Record why an import child that exited with ``code`` left modules unimported: the one it
    was importing, or (when it ended between two) every pending one, since another child would
    not do better; whether it settled the one it was importing."""
    if current is not None:
        results[current] = f"the interpreter died importing it (exit code {code})"
        pending.remove(current)
        return True
    for name in pending:
        results[name] = f"the import child exited {code} before trying it"
    pending.clear()
    return False


def packages_part() -> dict[str, Any]:
    """The `packages` part of the report before anything ran."""
    return {
        "lock": LOCK_PATH,
        "skipped": None,
        "distributions": 0,
        "modules": 0,
        "imported": 0,
        "failures": [],
        "without_modules": [],
        "ok": False,
        "seconds": None,
    }


def check_packages(
    part: dict[str, Any],
    *,
    deadline_s: float,
    lock_path: str = LOCK_PATH,
    path: list[str] | None = None,
) -> None:
    """Fill ``part``: every top-level module of every distribution in the lock imports (in a
    child interpreter); raise naming each failure as ``dist: module: Type: text``."""
    t0 = time.perf_counter()
    part["lock"] = lock_path
    try:
        with open(lock_path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        part["skipped"] = f"no lock at {lock_path} (not an envbuild image)"
        part["ok"] = True
        part["seconds"] = time.perf_counter() - t0
        return
    failures: list[str] = []
    owners: dict[str, list[str]] = {}
    pins = lock_pins(text)
    for name, _version in pins:
        try:
            dist = find_distribution(name, path)
            modules = [] if dist is None else top_level_modules(dist)
        except Exception as exc:  # a damaged RECORD or top_level.txt
            failures.append(
                f"{name}: its installed metadata cannot be read: {harness.describe_exc(exc)}"
            )
            continue
        if dist is None:
            failures.append(f"{name}: not installed (the lock pins it)")
            continue
        if not modules:
            part["without_modules"].append(name)
        for module in modules:
            owners.setdefault(module, []).append(name)
    part["distributions"] = len(pins)
    part["modules"] = len(owners)
    left = max(1.0, deadline_s - (time.perf_counter() - t0))
    results = import_modules(list(owners), deadline_s=left, path=path)
    part["imported"] = sum(1 for error in results.values() if error is None)
    for module, error in results.items():
        if error is not None:
            failures.extend(f"{dist}: {module}: {error}" for dist in owners[module])
    part["failures"] = failures
    part["ok"] = not failures
    part["seconds"] = time.perf_counter() - t0
    if failures:
        raise RuntimeError(f"{len(failures)} failed: " + "; ".join(failures))


def packages_section(run: harness.Run) -> None:
    """The packages section: every top-level module of every locked distribution imports."""
    run.section(
        "packages",
        PACKAGES_TIMEOUT_S,
        lambda doc: check_packages(doc["packages"], deadline_s=run.time_left() - 5.0),
    )
