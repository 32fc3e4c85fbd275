"""The live view of a build run: one line per entry (a live table on a terminal, plain lines in logs)."""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType

from rich.console import Console
from rich.live import Live
from rich.table import Table

from envbuild.core.results import EntryResult
from envbuild.pipeline.entries import Event

_STYLE = {
    "passed": "green",
    "published": "green",
    "failed": "bold red",
    "skipped": "yellow",
    "smoke": "cyan",
    "building": "blue",
    "step": "blue",
}


class ProgressView:
    """Collects pipeline events; redraws a table on a TTY, prints state changes otherwise."""

    def __init__(self, entry_ids: list[str]) -> None:
        self._console = Console(stderr=True)
        self._live_mode = sys.stderr.isatty()
        self._lock = threading.Lock()
        self._state = {entry_id: ("queued", "") for entry_id in entry_ids}
        self._started: dict[str, float] = {}
        self._finished: dict[str, float] = {}
        self._live: Live | None = None

    def __enter__(self) -> ProgressView:
        if self._live_mode:
            self._live = Live(
                self._table(), console=self._console, refresh_per_second=4, transient=False
            )
            self._live.__enter__()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._live.update(self._table())
            self._live.__exit__(kind, value, tb)

    def event(self, event: Event) -> None:
        """Record an event (called from worker threads)."""
        with self._lock:
            previous = self._state.get(event.entry_id, ("", ""))[0]
            if event.state in ("building", "step") and event.entry_id not in self._started:
                self._started[event.entry_id] = time.monotonic()
            if event.state in ("passed", "failed", "skipped"):
                self._finished[event.entry_id] = time.monotonic()
            shown = "building" if event.state == "step" else event.state
            detail = f"step {event.detail}" if event.state == "step" else event.detail
            self._state[event.entry_id] = (shown, detail)
            if self._live is not None:
                self._live.update(self._table())
            elif event.state != "step" and (event.state != previous or event.detail):
                stamp = f"{self._elapsed(event.entry_id):6.1f}s"
                print(
                    f"[{stamp}] {event.entry_id}: {shown}{': ' + detail if detail else ''}",
                    file=sys.stderr,
                    flush=True,
                )

    def _elapsed(self, entry_id: str) -> float:
        start = self._started.get(entry_id)
        if start is None:
            return 0.0
        return self._finished.get(entry_id, time.monotonic()) - start

    def _table(self) -> Table:
        table = Table(show_header=True, header_style="bold", box=None)
        for column in ("entry", "state", "detail", "time"):
            table.add_column(column)
        for entry_id, (state, detail) in self._state.items():
            table.add_row(
                entry_id,
                f"[{_STYLE.get(state, 'white')}]{state}[/]",
                detail[:80],
                f"{self._elapsed(entry_id):.0f}s",
            )
        return table

    def summary(self, results: list[EntryResult]) -> list[str]:
        """A fixed-width summary table of the run, then one line per failure."""
        rows = [("ENTRY", "RESULT", "IMAGE", "SMOKE", "TIME")]
        for r in results:
            image = (
                "published already"
                if r.published is not None
                else "-"
                if r.image is None
                else f"{r.image.id[7:19]} {'built' if r.image.built else 'found'}"
            )
            if r.smoke is None:
                smoke = "-"
            else:
                smoke = ("passed" if r.smoke.passed else "FAILED") + (
                    " (vetted before)" if r.smoke_reused else ""
                )
            rows.append(
                (r.entry.id, "ok" if r.passed else "FAILED", image, smoke, f"{r.seconds:.1f}s")
            )
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        lines = [
            "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
        ]
        for r in results:
            if not r.passed:
                lines.append(f"FAILED {r.entry.id}: {r.failure_reason}")
        lines.append(f"{sum(r.passed for r in results)}/{len(results)} entries passed")
        return lines
