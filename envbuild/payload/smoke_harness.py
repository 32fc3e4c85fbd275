"""The run machinery of envbuild's payloads; runs INSIDE the container, standard library only.

envbuild copies the payload folder into the container, and a payload such as
``<framework>_smoke.py`` imports this file by its bare name (a script's folder is
``sys.path[0]``).  Nothing here may import more than the standard library, and it must run on
every Python an image can bring (3.8 and later); the host imports it too (the checks below).

What every payload runs under:
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
    every framework, plus its checks and errors, cleaned into valid JSON.

What the smoke sections measure and how they are judged is smoke_verdicts.py; the versions
libraries report, payload_versions.py; the import check of the lock's packages,
package_imports.py.

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

import ctypes
import importlib
import json
import math
import os
import platform
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

# The train part's optimizer steps unless ENVBUILD_SMOKE_STEPS says otherwise.
DEFAULT_STEPS = 20
# The training sections every framework runs alike: steps of the compiled step and of each half
# of the checkpoint round trip.
COMPILE_STEPS = 10
CHECKPOINT_STEPS = 10

# Each check is (name, part of the document, key in it): the check passes when the key is true.
STANDARD_CHECKS = (
    ("loss_fell", "train", "loss_fell"),
    ("allreduce_correct", "allreduce", "correct"),
)
# The verdicts of the training sections, beside the standard ones: a compiled step, an input
# pipeline, a checkpoint, numpy, the lock's packages.  Here, not beside the parts they read
# (smoke_verdicts.training_parts), because the host reads them (envbuild/smoke/checks.py) and
# imports only this file of the payloads.
TRAINING_CHECKS = (
    *STANDARD_CHECKS,
    ("compiled_step", "compile", "loss_fell"),
    ("data_loader", "loader", "loss_fell"),
    ("checkpoint_resumed", "checkpoint", "continued"),
    ("numpy_interop", "numpy", "ok"),
    ("packages_import", "packages", "ok"),
)


class SectionDeadline(BaseException):
    """Raised inside a section's thread when its deadline has passed.

    A BaseException, like KeyboardInterrupt, so that the ``except Exception``
    of the framework code it lands in does not swallow it.
    """


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


def seconds_text(value: float) -> str:
    """A duration for a message: whole seconds from 1 s up, two significant digits below."""
    return f"{value:.0f}" if value >= 1 else f"{value:.2g}"


def snapshot(doc: dict[str, Any]) -> dict[str, Any]:
    """A deep, JSON-clean copy of ``doc`` that a thread holding the original can no longer change."""
    for _ in range(5):
        try:
            copy: dict[str, Any] = clean_json(doc)
            return copy
        except RuntimeError:  # changed under our feet by the other thread: retry
            time.sleep(0.01)
    return dict(doc)


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


def timed(part_name: str, fn: Callable[[dict[str, Any]], Any]) -> Callable[[dict[str, Any]], None]:
    """A section body that fills ``doc[part_name]`` with ``fn`` and records its seconds."""

    def body(doc: dict[str, Any]) -> None:
        t0 = time.perf_counter()
        try:
            fn(doc[part_name])
        finally:
            doc[part_name]["seconds"] = time.perf_counter() - t0

    return body


def interrupt(thread: threading.Thread) -> bool:
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
        # Every deadline stretches by the host's measure of how much slower this machine runs
        # the payload (an emulated platform: ENVBUILD_SLOWDOWN=10), never shrinks.
        self.slowdown = slowdown()
        if self.slowdown != 1.0:
            self.extra["slowdown"] = self.slowdown
        total_s *= self.slowdown
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
        limit = min(float(deadline_s) * self.slowdown, remaining)
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
            if interrupt(thread):
                thread.join(STOP_GRACE_S)
            if thread.is_alive():
                self.abandoned.append(thread)
                # The abandoned thread may still write: report a copy it cannot reach.
                self.doc = snapshot(doc)
                self.errors.append(
                    f"{name}: no result within {seconds_text(limit)} s (hung?), abandoned"
                )
            else:
                self.errors.append(f"{name}: no result within {seconds_text(limit)} s, stopped")
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


MAX_SLOWDOWN = 50.0


def slowdown() -> float:
    """ENVBUILD_SLOWDOWN as a factor in [1, MAX_SLOWDOWN]; 1 when unset or not a number."""
    try:
        factor = float(os.environ.get("ENVBUILD_SLOWDOWN", "1"))
    except ValueError:
        return 1.0
    if factor != factor:  # NaN
        return 1.0
    return min(max(factor, 1.0), MAX_SLOWDOWN)


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
