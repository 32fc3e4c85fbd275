"""One line for a failed build, from what the builder said last (classic or BuildKit)."""

from __future__ import annotations

import re

# The classic builder's word for a failed RUN, which repeats the whole (long) script.
_RUN_FAILED = re.compile(r"The command '.*' returned a non-zero code: (\d+)", re.DOTALL)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def build_error(message: str, last_lines: list[str]) -> str:
    """One line for a failed build: envbuild's own explanation from the failed step when it gave
    one (`envbuild: torch.compile needs g++ ...`), else the engine's message and the last output."""
    failed = _RUN_FAILED.fullmatch(message)
    if failed:
        message = f"a RUN step exited {failed.group(1)}"
    # A tool's colour codes (uv's, Docker's) must not hide envbuild's line from the search.
    plain = [_ANSI.sub("", line).strip() for line in last_lines]
    said = [line for line in plain if line.startswith("envbuild")]
    if said:
        return f"{said[-1]} ({message})"
    tail = " | ".join(plain[-3:])
    return f"{message}" + (f" (last output: {tail})" if tail else "")
