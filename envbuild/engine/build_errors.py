"""One line for a failed build, from what the builder said last (classic or BuildKit)."""

from __future__ import annotations

import re

# The classic builder's word for a failed RUN, which repeats the whole (long) script.
_RUN_FAILED = re.compile(r"The command '.*' returned a non-zero code: (\d+)", re.DOTALL)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
# ENOSPC as the engine (`write /opt/venv/...: no space left on device`) or a tool in the step
# (uv: `failed to write to file `...`: No space left on device (os error 28)`) words it.
_NO_SPACE = re.compile(r"no space left on device", re.IGNORECASE)
_WHERE = re.compile(r"(?:write|to file) `?(/[^\s`:]+)")
DISK_FIX = (
    "free space where the engine keeps its data (`docker system df` shows what uses it; "
    "`docker image prune` and `docker builder prune` free it) and build again"
)


def build_error(message: str, last_lines: list[str]) -> str:
    """One line for a failed build: envbuild's own explanation from the failed step when it gave
    one (`envbuild: torch.compile needs g++ ...`), else the engine's message and the last output."""
    failed = _RUN_FAILED.fullmatch(message)
    if failed:
        message = f"a RUN step exited {failed.group(1)}"
    # A tool's colour codes (uv's, Docker's) must not hide envbuild's line from the search.
    plain = [_ANSI.sub("", line).strip() for line in last_lines]
    full = [line for line in [message, *plain] if _NO_SPACE.search(line)]
    if full:  # whatever a step then said about it, the cause is the disk
        where = _WHERE.search(full[0])
        writing = f" writing {where.group(1)}" if where else ""
        return f"the build ran out of disk space{writing}; {DISK_FIX}"
    said = [line for line in plain if line.startswith("envbuild")]
    if said:
        return f"{said[-1]} ({message})"
    tail = " | ".join(plain[-3:])
    return f"{message}" + (f" (last output: {tail})" if tail else "")
