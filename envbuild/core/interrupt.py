"""Ctrl-C and SIGTERM end a run cleanly: what this process made is found again and removed.

Everything a run leaves on the host while it works is marked with this process's run id:
smoke containers carry it as a label, temporary build contexts and files (the combined CA
bundle) as a name prefix. On an
interrupt the main thread removes them (worker threads may still be blocked on the engine),
then the process exits at once with 130 (SIGINT) or 143 (SIGTERM); closing its connections
makes the engine abandon a build in progress, and the classic builder then removes its
intermediate container itself.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import tempfile
from pathlib import Path
from types import FrameType

RUN_LABEL = "org.envbuild.run"
# Where a run's pid means something (`run_place`), so that a later run can tell a dead run's
# containers from those of a run still working beside it.
RUN_PLACE_LABEL = "org.envbuild.run.place"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt."""


def exit_code(exc: KeyboardInterrupt) -> int:
    """The shell's convention: 128 + the signal number."""
    return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)


def install_sigterm() -> None:
    """Turn SIGTERM into Terminated so that cleanup runs as it does for Ctrl-C."""

    def raise_terminated(signum: int, frame: FrameType | None) -> None:
        raise Terminated

    signal.signal(signal.SIGTERM, raise_terminated)


@functools.cache
def run_id() -> str:
    """This process's id on the host: pid plus a random part (pids are reused)."""
    return f"{os.getpid()}-{secrets.token_hex(4)}"


@functools.cache
def run_place() -> str:
    """The kernel (its boot id) and the pid namespace this process runs in: a run id's pid names
    a process only there ("" when either cannot be read)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
        namespace = Path("/proc/self/ns/pid").stat().st_ino
    except (OSError, UnicodeDecodeError):
        return ""
    return f"{boot}/{namespace}" if boot else ""


def run_alive(run: str, place: str) -> bool | None:
    """Whether the run with id `run`, made at `place`, still runs; None when this process cannot
    tell (another host, container or pid namespace, or an id it does not recognise)."""
    here = run_place()
    pid = run.split("-", 1)[0]
    if not here or place != here or not pid.isdigit():
        return None
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    except (OverflowError, ValueError):
        return None
    return True


def scratch_prefix(kind: str) -> str:
    """Prefix for a temporary folder of this run, found again by `remove_scratch`."""
    return f"envbuild-{run_id()}-{kind}-"


def remove_scratch() -> int:
    """Remove this run's temporary folders and files; return how many there were."""
    removed = 0
    for path in Path(tempfile.gettempdir()).glob(f"envbuild-{run_id()}-*"):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                path.unlink()
        removed += 1
    return removed
