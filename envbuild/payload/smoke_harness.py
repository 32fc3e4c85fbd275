"""Shared harness of envbuild's smoke payloads; runs INSIDE the container, standard library only.

envbuild copies this file into the container beside one ``<framework>_smoke.py``
(same folder, so the payload's ``import smoke_harness`` finds it: a script's
folder is ``sys.path[0]``).  The payload then holds its framework's code alone.
Nothing here may import more than the standard library, and it must run on
every Python an image can bring (3.8 and later).

What every payload shares lives here:
  * stdout diversion -- while the payload runs, fd 1 points at stderr, so
    nothing a framework, NCCL or a child process prints can corrupt the
    report; the one JSON document goes to the original stdout at the end;
  * sections -- each runs in a worker thread under a deadline, within the
    payload's total budget; an exception becomes the error
    ``"<section>: <Type>: <text>"`` and the run goes on; a section past its
    deadline is interrupted where Python can interrupt it, otherwise
    abandoned, and is recorded either way; nothing it changes afterwards
    reaches the report;
  * the document -- versions, devices, train and allreduce in one shape for
    every framework, plus its checks and errors, cleaned into valid JSON;
  * shared measurements -- NCCL/cuDNN version parsing, the loss verdict,
    nccl-tests bandwidth, the ENVBUILD_SMOKE_STEPS knob.

The process exits 0 when every check passed and no error was recorded, 1
otherwise.  A payload is::

    import smoke_harness as harness

    def smoke(run):
        fw = run.load("framework")
        if fw is not None:
            run.section("train", 180, lambda doc: run_train(fw, doc["train"]))

    if __name__ == "__main__":
        harness.main("framework", smoke)
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import math
import os
import platform
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

# Version of the document's shape; the host reads the same keys from every framework.
PAYLOAD_VERSION = 1

# All sections together; the host runs the container under its own, longer, GNU timeout.
TOTAL_TIMEOUT_S = 480.0
# How long an interrupted section gets to unwind (its `finally` blocks) before it is abandoned.
STOP_GRACE_S = 2.0

DEFAULT_STEPS = 20
# The last loss must be at least this fraction below the first one, so that
# a no-op optimizer (constant loss, maybe with tiny numerical jitter) fails.
MIN_RELATIVE_DROP = 0.01

# All-reduce sizes: (bytes per rank, warm-up iterations, timed iterations).
GPU_ALLREDUCE = (16 * 1024 * 1024, 5, 20)
CPU_ALLREDUCE = (4 * 1024 * 1024, 2, 10)
# On a GPU-less host the all-reduce runs between this many CPU ranks/devices.
CPU_WORLD_SIZE = 2

# Each check is (name, part of the document, key in it): the check passes when the key is true.
STANDARD_CHECKS = (
    ("loss_fell", "train", "loss_fell"),
    ("allreduce_correct", "allreduce", "correct"),
)


class SectionDeadline(BaseException):
    """Raised inside a section's thread when its deadline has passed.

    A BaseException, like KeyboardInterrupt, so that the ``except Exception``
    of the framework code it lands in does not swallow it.
    """


# --------------------------------------------------------------------------
# small helpers


def log(msg: str) -> None:
    """One line on stderr, prefixed with the payload's name (``[torch_smoke] ...``)."""
    name = os.path.splitext(os.path.basename(sys.argv[0] if sys.argv else ""))[0] or "smoke"
    sys.stderr.write(f"[{name}] {msg}\n")
    sys.stderr.flush()


def describe_exc(exc: BaseException) -> str:
    """``Type: text`` on one line of at most ~500 characters (CUDA/NCCL/XLA messages run long)."""
    text = " ".join(str(exc).split())
    if len(text) > 500:
        text = text[:497] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def clean_json(obj: Any) -> Any:
    """A copy of ``obj`` that ``json.dumps(allow_nan=False)`` accepts.

    Non-finite floats become null; tuples and sets become lists; keys become
    strings; a framework scalar (numpy, torch, jax: anything with ``.item()``)
    becomes its Python value; any other object becomes its ``str``.  Containers
    are copied before they are walked, so a thread still writing to them
    cannot break the walk.
    """
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return float(obj) if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {(k if isinstance(k, str) else str(k)): clean_json(v) for k, v in list(obj.items())}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [clean_json(v) for v in list(obj)]
    item = getattr(obj, "item", None)
    if callable(item):
        try:
            value = item()
        except Exception:
            value = None
        if isinstance(value, (bool, int, float, str)):
            return clean_json(value)
    return str(obj)


def snapshot(doc: dict[str, Any]) -> dict[str, Any]:
    """A deep, JSON-clean copy of ``doc`` that a thread holding the original can no longer change."""
    for _ in range(5):
        try:
            copy: dict[str, Any] = clean_json(doc)
            return copy
        except RuntimeError:  # changed under our feet by the other thread: retry
            time.sleep(0.01)
    return dict(doc)


# --------------------------------------------------------------------------
# versions


def nccl_version_from(value: Any) -> str | None:
    """NCCL's version as 'x.y.z' from the forms frameworks give it, else None.

    ``21803`` / ``"21803"`` (2.9 and later: major*10000 + minor*100 + patch),
    ``2708`` (older: major*1000 + minor*100 + patch), ``(2, 18, 3)`` or
    ``(2, 18, 3, "suffix")``, and ``"2.18.3"`` (kept as it is).
    """
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (tuple, list)):
        return ".".join(str(int(x)) for x in value[:3]) or None
    if isinstance(value, str):
        text = value.strip()
        if not text.isdigit():
            return text or None
        value = int(text)
    number = int(value)
    if number <= 0:
        return None
    if number >= 10000:
        major, rest = divmod(number, 10000)
    else:
        major, rest = divmod(number, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def cudnn_version_from(value: Any) -> str | None:
    """cuDNN's version as 'x.y.z': 90100 -> '9.1.0' (9 and later), 8902 -> '8.9.2' (8 and earlier)."""
    if value is None:
        return None
    number = int(value)
    if number >= 90000:  # major*10000 + minor*100 + patch
        major, rest = divmod(number, 10000)
    else:  # major*1000 + minor*100 + patch
        major, rest = divmod(number, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def loaded_nccl_version() -> str | None:
    """ncclGetVersion() of the libnccl this process has mapped, else None.

    Only a library that is already loaded (seen in /proc/self/maps) is asked,
    so a stray libnccl elsewhere on the system cannot be reported by mistake;
    a statically linked NCCL is not found and gives None.
    """
    try:
        with open("/proc/self/maps") as fh:
            paths = sorted(
                {
                    line.split(None, 5)[5].strip()
                    for line in fh
                    if "libnccl" in line and len(line.split(None, 5)) == 6
                }
            )
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            version = ctypes.c_int(0)
            if lib.ncclGetVersion(ctypes.byref(version)) == 0 and version.value > 0:
                return nccl_version_from(version.value)
        except Exception:
            continue
    return None


# --------------------------------------------------------------------------
# the training step and the all-reduce: what every framework measures alike


def steps_from_env(errors: list[str]) -> int:
    """Optimizer steps from ENVBUILD_SMOKE_STEPS (default 20, at least 2); a bad value is an error."""
    raw = os.environ.get("ENVBUILD_SMOKE_STEPS", "").strip()
    if not raw:
        return DEFAULT_STEPS
    try:
        steps = int(raw)
        if steps < 2:
            raise ValueError("must be >= 2")
        return steps
    except ValueError as exc:
        errors.append(
            f"train: ValueError: bad ENVBUILD_SMOKE_STEPS={raw!r} ({exc}); using {DEFAULT_STEPS}"
        )
        return DEFAULT_STEPS


def judge_losses(train: dict[str, Any], losses: list[float]) -> None:
    """Record the first and last loss in ``train``; raise unless the loss fell far enough."""
    train["losses"] = losses
    if len(losses) < 2:
        raise RuntimeError(f"expected {train.get('steps')} per-step losses, got {len(losses)}")
    first, last = losses[0], losses[-1]
    train["loss_first"] = first
    train["loss_last"] = last
    fell = (
        math.isfinite(first)
        and math.isfinite(last)
        and last < first
        and (first - last) > MIN_RELATIVE_DROP * abs(first)
    )
    train["loss_fell"] = bool(fell)
    if not fell:
        raise RuntimeError(
            f"loss did not fall over {len(losses)} steps: first={first!r} last={last!r}"
        )


def plan_allreduce(ar: dict[str, Any], backend: str, *, gpu: bool) -> tuple[int, int, int]:
    """Record the backend and sizes in ``ar``; return (float32 elements per rank, warm-up, iterations)."""
    nbytes, warmup, iters = GPU_ALLREDUCE if gpu else CPU_ALLREDUCE
    elements = nbytes // 4
    ar.update(backend=backend, elements=elements, bytes=elements * 4, iterations=iters)
    return elements, warmup, iters


def allreduce_world(ar: dict[str, Any], world: int) -> float:
    """Record the number of ranks; return the expected SUM of (rank+1) over them."""
    expected = world * (world + 1) / 2.0
    ar.update(world_size=world, expected=expected)
    return expected


def record_bandwidth(ar: dict[str, Any], seconds: float) -> None:
    """Seconds per all-reduce, and algbw/busbw in GB/s as nccl-tests defines them."""
    ar["seconds"] = seconds
    if seconds > 0:
        world = int(ar.get("world_size") or 0)
        algbw = ar["bytes"] / seconds / 1e9
        ar["algbw_gbps"] = algbw
        ar["busbw_gbps"] = algbw * 2.0 * (world - 1) / world if world > 1 else 0.0


def record_allreduce(ar: dict[str, Any], errors: list[str], *, correct: bool, got: Any) -> None:
    """Record the all-reduce verdict; a wrong sum is an error naming what came back."""
    ar["correct"] = bool(correct)
    ar["got"] = got
    if not correct:
        errors.append(
            f"allreduce: wrong result: expected {ar.get('expected')!r} everywhere, got {got!r}"
        )


def finish_allreduce(
    ar: dict[str, Any],
    errors: list[str],
    versions: dict[str, Any],
    *,
    backend: str,
    seconds: float,
    first: tuple[bool, Any],
    last: tuple[bool, Any],
) -> None:
    """Close an all-reduce section: bandwidth, NCCL's version from the loaded library when the
    framework did not say, and the verdict of the first and the repeated sums (the first wrong
    one is what is shown)."""
    record_bandwidth(ar, seconds)
    if backend == "nccl" and versions.get("nccl") is None:
        versions["nccl"] = loaded_nccl_version()
    (correct1, got1), (correct2, got2) = first, last
    record_allreduce(ar, errors, correct=correct1 and correct2, got=got2 if correct1 else got1)


# --------------------------------------------------------------------------
# the environment's packages: every top-level module of every locked distribution imports

# Where envbuild's images keep the lock they were installed from.
LOCK_PATH = "/opt/venv/envbuild.lock"
# One module's import running longer than this is taken for a hang: the child is killed.
IMPORT_HANG_S = 60.0

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
    import queue
    import signal
    import subprocess

    results: dict[str, str | None] = {}
    pending = list(dict.fromkeys(modules))
    end = time.monotonic() + deadline_s
    env = dict(os.environ)
    if path:
        env["PYTHONPATH"] = os.pathsep.join([*path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    while pending:
        if time.monotonic() >= end:
            break
        proc = subprocess.Popen(
            [python or sys.executable, "-c", _IMPORT_CHILD, json.dumps(pending)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # so that what an import started is killed with it
        )
        lines: queue.Queue[bytes | None] = queue.Queue()

        def read(stream: Any = proc.stdout, lines: queue.Queue[bytes | None] = lines) -> None:
            for line in iter(stream.readline, b""):
                lines.put(line)
            lines.put(None)

        threading.Thread(target=read, name="import-child", daemon=True).start()
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
                if current is not None and time.monotonic() >= hang_at:
                    results[current] = f"no result within {_seconds(hang_s)} s (hung?), killed"
                    pending.remove(current)
                    progressed = True
                break
            if line is None:  # the child ended
                code = proc.wait(10)
                if current is not None:
                    results[current] = f"the interpreter died importing it (exit code {code})"
                    pending.remove(current)
                    progressed = True
                elif pending:  # ended before it started the next one: it will not do better
                    for name in pending:
                        results[name] = f"the import child exited {code} before trying it"
                    pending.clear()
                break
            try:
                message = json.loads(line)
            except ValueError:
                continue
            if not isinstance(message, dict):
                continue
            if "start" in message:
                current, since = str(message["start"]), time.monotonic()
            elif message.get("module") in pending:
                name = str(message["module"])
                error = message.get("error")
                results[name] = None if error is None else str(error)
                pending.remove(name)
                current, progressed = None, True
        if proc.stdout is not None:
            proc.stdout.close()
        if not progressed:
            break
    for name in pending:
        results.setdefault(name, f"not tried: no time left ({_seconds(deadline_s)} s for all)")
    return results


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
            failures.append(f"{name}: its installed metadata cannot be read: {describe_exc(exc)}")
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


# --------------------------------------------------------------------------
# what training really does: the sections every framework's payload runs alike

# The verdicts of the training sections, beside the standard ones (envbuild/smoke/runner.py reads the
# same names): a compiled step, an input pipeline, a checkpoint, numpy, the lock's packages.
TRAINING_CHECKS = (
    *STANDARD_CHECKS,
    ("compiled_step", "compile", "loss_fell"),
    ("data_loader", "loader", "loss_fell"),
    ("checkpoint_resumed", "checkpoint", "continued"),
    ("numpy_interop", "numpy", "ok"),
    ("packages_import", "packages", "ok"),
)
PACKAGES_TIMEOUT_S = 180.0


def training_parts() -> dict[str, Any]:
    """The standard parts and the training sections' before anything ran; a payload adds the
    fields of its own (``parts["loader"]["workers"] = 2``)."""
    parts = standard_parts()
    losses = {"losses": [], "loss_first": None, "loss_last": None, "loss_fell": False}
    parts["compile"] = {
        "device": None, "backend": None, **losses, "compile_seconds": None, "step_ms": None,
        "seconds": None,
    }  # fmt: skip
    parts["loader"] = {"batches": 0, "batch_bytes": None, "batches_per_s": None, **losses, "seconds": None}  # fmt: skip
    parts["checkpoint"] = {
        "bytes": None, "loss_before_save": None, "loss_after_resume": None,
        "loss_uninterrupted": None, "continued": False, "loss_fell": False, "seconds": None,
    }  # fmt: skip
    parts["numpy"] = {"skipped": None, "version": None, "ok": False, "seconds": None}
    parts["packages"] = packages_part()
    return parts


def judge_checkpoint(
    part: dict[str, Any],
    before: list[float],
    uninterrupted: list[float],
    resumed: list[float],
    *,
    tolerance: float = 1e-4,
) -> None:
    """Record a checkpoint round trip: ``before`` the save, the ``uninterrupted`` run on from
    it, the run ``resumed`` from the loaded state; raise unless the resumed run gives the
    uninterrupted one's loss (relative ``tolerance``) and the loss keeps falling."""
    part.update(
        loss_before_save=before[-1],
        loss_after_resume=resumed[0],
        loss_uninterrupted=uninterrupted[0],
        losses_before=before,
        losses_resumed=resumed,
    )
    allowed = tolerance * max(1.0, abs(uninterrupted[0]))
    part["continued"] = bool(
        abs(resumed[0] - uninterrupted[0]) <= allowed and resumed[0] <= before[-1] + allowed
    )
    if not part["continued"]:
        raise RuntimeError(
            f"the resumed loss {resumed[0]!r} does not continue from {before[-1]!r} "
            f"(the uninterrupted run gives {uninterrupted[0]!r}): the checkpoint lost state"
        )
    judge_losses(part, resumed)


def judge_round_trip(part: dict[str, Any], checks: dict[str, bool]) -> None:
    """Record the numpy interop checks; raise naming those that failed."""
    part.update(checks)
    part["ok"] = all(checks.values())
    if not part["ok"]:
        bad = ", ".join(name for name, good in checks.items() if not good)
        raise RuntimeError(f"numpy interop is broken: {bad}")


def timed(part_name: str, fn: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
    """A section body that fills ``doc[part_name]`` with ``fn`` and records its seconds."""

    def body(doc: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        try:
            fn(doc[part_name])
        finally:
            doc[part_name]["seconds"] = time.perf_counter() - t0

    return body


def packages_section(run: Run) -> None:
    """The packages section: every top-level module of every locked distribution imports."""
    run.section(
        "packages",
        PACKAGES_TIMEOUT_S,
        lambda doc: check_packages(doc["packages"], deadline_s=run.time_left() - 5.0),
    )


# --------------------------------------------------------------------------
# the document and the run


def standard_parts() -> dict[str, Any]:
    """The parts of the report every payload fills, with their values before anything ran."""
    return {
        "versions": {
            "python": platform.python_version(),
            "framework": None,
            "cuda": None,
            "cudnn": None,
            "nccl": None,
        },
        "devices": [],
        "train": {
            "device": None,
            "dtype": None,
            "autocast": False,
            "steps": DEFAULT_STEPS,
            "losses": [],
            "loss_first": None,
            "loss_last": None,
            "loss_fell": False,
            "seconds": None,
        },
        "allreduce": {
            "backend": None,
            "world_size": None,
            "elements": None,
            "bytes": None,
            "dtype": "float32",
            "iterations": None,
            "seconds": None,
            "algbw_gbps": None,
            "busbw_gbps": None,
            "correct": False,
            "expected": None,
            "got": None,
        },
    }


def _seconds(value: float) -> str:
    return f"{value:.0f}" if value >= 1 else f"{value:.2g}"


def _interrupt(thread: threading.Thread) -> bool:
    """Raise SectionDeadline in ``thread`` at its next Python instruction; False if that is impossible."""
    ident = thread.ident
    if ident is None:
        return False
    try:
        set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
        set_async_exc.argtypes = (ctypes.c_ulong, ctypes.py_object)
        return int(set_async_exc(ident, SectionDeadline)) == 1
    except Exception:  # not CPython, or no such thread any more
        return False


class Run:
    """One payload run: the document being filled, the sections run so far, their deadlines.

    ``doc`` holds every part of the report plus ``errors``.  Sections get the
    document as their argument and write only into it: when a section hangs,
    ``doc`` is swapped for a copy, so the abandoned thread keeps writing into
    an object that is no longer reported.
    """

    def __init__(
        self,
        payload: str,
        *,
        parts: dict[str, Any] | None = None,
        checks: tuple[tuple[str, str, str], ...] = STANDARD_CHECKS,
        extra: dict[str, Any] | None = None,
        total_s: float = TOTAL_TIMEOUT_S,
    ) -> None:
        self.payload = payload
        self.doc: dict[str, Any] = standard_parts() if parts is None else parts
        self.doc.setdefault("errors", [])
        self.checks_spec = checks
        self.extra = dict(extra or {})
        self.total_s = total_s
        self.deadline = time.monotonic() + total_s
        self.section_deadline = self.deadline
        self.abandoned: list[threading.Thread] = []

    @property
    def errors(self) -> list[str]:
        """The errors recorded so far (a list in the current document)."""
        errors: list[str] = self.doc["errors"]
        return errors

    def time_left(self) -> float:
        """Seconds until the running section's deadline (or the payload's, outside a section)."""
        return max(0.0, min(self.section_deadline, self.deadline) - time.monotonic())

    def load(self, module: str) -> Any:
        """Import the framework; None, with the error recorded, when it is missing or broken."""
        try:
            return importlib.import_module(module)
        except BaseException as exc:  # a broken framework may raise anything
            self.errors.append("import: " + describe_exc(exc))
            traceback.print_exc(file=sys.stderr)
            return None

    def section(self, name: str, deadline_s: float, fn: Callable[[dict[str, Any]], Any]) -> bool:
        """Run ``fn(doc)`` in a worker thread for at most ``deadline_s`` seconds; True if it succeeded.

        An exception is recorded as ``"<name>: <Type>: <text>"``.  A section
        still running at its deadline is interrupted (SectionDeadline raised at
        its next Python instruction, so its ``finally`` blocks run); one stuck
        in native code cannot be, and is abandoned.  Either way it is recorded
        as an error and the run goes on with the next section.
        """
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            self.errors.append(f"{name}: skipped, the payload's {self.total_s:g} s are used up")
            return False
        limit = min(float(deadline_s), remaining)
        self.section_deadline = time.monotonic() + limit
        log(f"section {name} ...")
        t0 = time.perf_counter()
        doc = self.doc
        outcome: dict[str, BaseException] = {}

        def target() -> None:
            try:
                fn(doc)
            except BaseException as exc:  # report everything, even SystemExit
                outcome["exc"] = exc
                if not isinstance(exc, SectionDeadline):
                    traceback.print_exc(file=sys.stderr)

        thread = threading.Thread(target=target, name=f"section-{name}", daemon=True)
        thread.start()
        thread.join(limit)
        succeeded = False
        if thread.is_alive():
            if _interrupt(thread):
                thread.join(STOP_GRACE_S)
            if thread.is_alive():
                self.abandoned.append(thread)
                # The abandoned thread may still write: report a copy it cannot reach.
                self.doc = snapshot(doc)
                self.errors.append(
                    f"{name}: no result within {_seconds(limit)} s (hung?), abandoned"
                )
            else:
                self.errors.append(f"{name}: no result within {_seconds(limit)} s, stopped")
        elif "exc" in outcome:
            self.errors.append(f"{name}: {describe_exc(outcome['exc'])}")
        else:
            succeeded = True
        self.section_deadline = self.deadline
        log(f"section {name} done in {time.perf_counter() - t0:.2f} s")
        return succeeded

    def checks(self) -> dict[str, bool]:
        """Each check's verdict from the document as it stands."""
        verdicts = {}
        for name, part, key in self.checks_spec:
            value = self.doc.get(part)
            verdicts[name] = bool(value.get(key)) if isinstance(value, dict) else False
        return verdicts

    def document(self) -> dict[str, Any]:
        """The report: payload, extra keys, ok, every part, checks and errors."""
        checks = self.checks()
        errors = list(self.errors)
        doc: dict[str, Any] = {"payload": self.payload, "payload_version": PAYLOAD_VERSION}
        doc.update(self.extra)
        doc["ok"] = bool(all(checks.values()) and not errors)
        for key, value in list(self.doc.items()):
            if key != "errors":
                doc[key] = value
        doc["checks"] = checks
        doc["errors"] = errors
        return doc

    def render(self) -> tuple[str, bool]:
        """The report as JSON text, and whether it says ok."""
        doc = self.document()
        try:
            return json.dumps(clean_json(doc), indent=2, allow_nan=False), bool(doc["ok"])
        except Exception as exc:  # should not happen; still emit valid JSON
            fallback: dict[str, Any] = {"payload": self.payload, "payload_version": PAYLOAD_VERSION}
            fallback["ok"] = False
            for key, value in list(self.doc.items()):
                if key != "errors":
                    fallback[key] = [] if isinstance(value, list) else {}
            fallback["checks"] = {name: False for name, _, _ in self.checks_spec}
            fallback["errors"] = [str(e) for e in doc["errors"]] + ["json: " + describe_exc(exc)]
            return json.dumps(fallback, indent=2), False


def divert_stdout() -> int:
    """Point fd 1 (and sys.stdout) at stderr; return a private fd for the report."""
    sys.stdout.flush()
    json_fd = os.dup(1)  # not inherited by child processes (PEP 446)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return json_fd


def main(
    payload: str,
    body: Callable[[Run], Any],
    *,
    parts: dict[str, Any] | None = None,
    checks: tuple[tuple[str, str, str], ...] = STANDARD_CHECKS,
    extra: dict[str, Any] | None = None,
    total_s: float = TOTAL_TIMEOUT_S,
) -> None:
    """Run a payload: divert stdout, call ``body(run)``, print the report, exit 0 if ok else 1."""
    json_fd = divert_stdout()
    t0 = time.perf_counter()
    run = Run(payload, parts=parts, checks=checks, extra=extra, total_s=total_s)
    try:
        body(run)
    except BaseException as exc:  # a bug in the payload still ends in a report
        run.errors.append("payload: " + describe_exc(exc))
        traceback.print_exc(file=sys.stderr)
    text, ok = run.render()
    hung = " (a section hung)" if run.abandoned else ""
    log(f"total {time.perf_counter() - t0:.2f} s, ok={ok}{hung}")
    code = 0 if ok else 1
    try:
        with os.fdopen(json_fd, "w") as out:
            out.write(text + "\n")
            out.flush()
    except OSError as exc:
        log(f"cannot write the report: {describe_exc(exc)}")
        code = 1
    sys.stderr.flush()
    # Leave without interpreter teardown: an abandoned section thread, or the
    # framework's own shutdown, must neither block the exit nor change its
    # status after the report went out.
    os._exit(code)
