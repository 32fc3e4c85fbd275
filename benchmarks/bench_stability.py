"""Issue 13's targets for `envbuild bench`, measured: the wall time of one image's bench with the
default budget (target: under 3 minutes for the torch CPU image, every section measured), and
whether a second run's figures stay within the spreads the first reported.

    .venv/bin/python benchmarks/bench_stability.py IMAGE [--budget SECONDS] [--runs N]

It runs `envbuild bench IMAGE --compare last` N times (default 2) against a throwaway record, so
your own bench history is untouched, and prints per run: wall time, sections with figures, items
skipped, and against the run before: figures within the measured spreads, regressions and gains
beyond them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENVBUILD = [sys.executable, "-m", "envbuild"]
SECTIONS = ("throughput", "compile", "batch", "loader", "allreduce")


def measured_sections(run: dict[str, object]) -> list[str]:
    bench = run.get("bench")
    if not isinstance(bench, dict):
        return []
    found = []
    for name in SECTIONS:
        part = bench.get(name)
        items = []
        if isinstance(part, dict):
            for key in ("results", "sweeps", "points"):
                value = part.get(key)
                if isinstance(value, list):
                    items += value
        # a figure's median, a sweep's points, a compiled figure, an all-reduce point's busbw
        keys = ("median", "points", "compiled", "busbw")
        if any(isinstance(i, dict) and any(i.get(k) for k in keys) for i in items):
            found.append(name)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("image")
    parser.add_argument("--budget", default="150")
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-stability-") as scratch:
        env_dir = Path(scratch)
        print(
            f"{'run':>3}  {'wall s':>7}  {'sections':>8}  {'skipped':>7}  {'within spread':>13}  {'regressions':>11}  {'gains':>5}"
        )
        for n in range(1, args.runs + 1):
            out = env_dir / f"run{n}.json"
            start = time.monotonic()
            result = subprocess.run(
                [*ENVBUILD, "bench", args.image, "--budget", args.budget, "--compare", "last",
                 "--json", str(out)],
                env={**os.environ, "ENVBUILD_DATA_DIR": str(env_dir / "data")},
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            wall = time.monotonic() - start
            if result.returncode != 0:
                print(result.stderr[-2000:], file=sys.stderr)
                return result.returncode
            doc = json.loads(out.read_text())
            (run,) = doc["images"]
            rows = (doc.get("comparison") or {}).get("rows") or []
            within = sum(1 for r in rows if abs(r["change"]) <= r["spread"])
            regressions = sum(1 for r in rows if r["regression"])
            gains = len(rows) - within - regressions
            compared = f"{within}/{len(rows)}" if rows else "-"
            print(
                f"{n:>3}  {wall:>7.1f}  {len(measured_sections(run)):>6}/5  {len(run['skipped']):>7}  "
                f"{compared:>13}  {regressions if rows else '-':>11}  {gains if rows else '-':>5}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
