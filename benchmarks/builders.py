"""Issue 23's figures: BuildKit beside the classic builder, BuildKit's kept cache, a remote engine.

Run on a host set up by scripts/host-setup.sh (engine, .venv, ./wheelhouse, a bookworm base):

    .venv/bin/python benchmarks/builders.py [--base-image envbuild/base:bookworm] [--no-dind]
                                            [--repeat N] [--cuda]

It builds the torch 2.13.0 CPU entry (torch from ./wheelhouse, the rest from PyPI through the CA
bundle, as the tests do) and prints one table:

- cold, `--no-cache`, with `--builder classic` and with `--builder buildkit` (BuildKit starts its
  cache mount afresh under --no-cache: measured here, so the BuildKit figure is truly cold),
  beside the hand-written pip Dockerfile with the same compiler (benchmarks/run.py's `pip+cc`,
  which installs torch and its dependencies; envbuild's entry installs numpy besides);
  `--repeat N` alternates the three N times and shows each one's median (single builds here
  vary by more than the 5% the target allows); `--cuda` does the same once for torch
  2.4.1+cu121 from PyPI (2.5 GB downloaded by each of the three);
- with BuildKit, the same entry with one small package of the team's (`six`) built warm, then
  rebuilt after that package is bumped in the lock (the framework unchanged), beside the cold
  build of the same entry;
- the cold BuildKit build on a docker:dind engine (tests/support/dind_engine.py: dockerd in a
  container, TLS on a loopback port), beside the same on the local engine.

Each figure is one build (say how many you ran when you quote one). The images it makes are
labelled or tagged under envbuild-bench/ and removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
import run as hand_written  # noqa: E402  (benchmarks/run.py: the hand-written Dockerfiles)

ENVBUILD = [sys.executable, "-m", "envbuild"]
REPOSITORY = "envbuild-bench/{framework}"
ENTRY = [
    "--framework",
    "torch",
    "--framework-version",
    "2.13.0",
    "--cuda",
    "cpu",
    "--python",
    "3.11",
]


def forget() -> None:
    """Remove the images this benchmark made: a build that finds its content hash built before
    builds nothing (a bogus 1 s "rebuild"). BuildKit's cache is not an image: it stays."""
    subprocess.run(
        ["sh", "-c", "docker images -q 'envbuild-bench/*' | sort -u | xargs -r docker rmi -f"],
        capture_output=True, check=False,
    )  # fmt: skip


def envbuild(args: list[str], env: dict[str, str] | None = None) -> float:
    """Seconds `envbuild ARGS` took, from no image of this benchmark's; exits with its output's
    tail when it fails."""
    if env is None:
        forget()
    start = time.perf_counter()
    result = subprocess.run(
        [*ENVBUILD, *args], capture_output=True, text=True, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    seconds = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"benchmark: envbuild {' '.join(args[:4])} ... failed:\n{result.stderr[-3000:]}")
    return seconds


CUDA_ENTRY = [
    "--framework", "torch", "--framework-version", "2.4.1", "--cuda", "12.1", "--python", "3.11",
]  # fmt: skip


def hand_pip(work: Path, base: str, ca: str, *, cuda: bool) -> float:
    """Seconds of a cold build of the hand-written pip Dockerfile with the compiler."""
    hands = hand_written.HANDS_CUDA if cuda else hand_written.HANDS_CPU
    hand = next(hand for hand in hands if hand.name == "pip+cc")
    wheels = None if cuda else REPO / "wheelhouse"
    return hand_written.hand_build(work, base, ca, hand, wheels).seconds


def side_by_side(
    repeat: int, work: Path, base: str, ca: str, entry: list[str], args: list[str], *, cuda: bool
) -> dict[str, list[float]]:
    """Cold builds of one entry with each builder and the hand-written pip Dockerfile,
    alternated `repeat` times so that a slow minute of the network falls on every side."""
    runs: dict[str, list[float]] = {"classic": [], "buildkit": [], "pip+cc": []}
    for _ in range(repeat):
        for builder in ("classic", "buildkit"):
            runs[builder].append(
                envbuild(["build", *entry, *args, "--no-cache", "--builder", builder])
            )
            forget()  # a CUDA image is 5 GB: not kept beside the next
        runs["pip+cc"].append(hand_pip(work, base, ca, cuda=cuda))
    return runs


Row = Callable[[str, str, str], None]


def cold_rows(name: str, runs: dict[str, list[float]], row: Row) -> float:
    """The rows of one entry's cold builds; returns BuildKit's median."""
    median = {side: statistics.median(seconds) for side, seconds in runs.items()}
    each = "/".join(f"{s:.1f}" for s in runs["classic"])
    row(f"cold {name}, classic builder", f"{median['classic']:.1f} s", f"reference (runs {each})")
    kit, classic, pip = median["buildkit"], median["classic"], median["pip+cc"]
    each = "/".join(f"{s:.1f}" for s in runs["buildkit"])
    row(f"cold {name}, BuildKit", f"{kit:.1f} s",
        f"{kit / classic:.2f}x classic (target <= 1.05x; runs {each})")  # fmt: skip
    each = "/".join(f"{s:.1f}" for s in runs["pip+cc"])
    row(f"cold {name}, hand-written pip+cc", f"{pip:.1f} s",
        f"BuildKit {kit / pip:.2f}x, classic {classic / pip:.2f}x (target <= 0.7x; runs {each})")  # fmt: skip
    return kit


def common(base: str, ca: str) -> list[str]:
    return [
        "--base-image", base, "--wheelhouse", str(REPO / "wheelhouse"), "--ca-bundle", ca,
        "--repository", REPOSITORY, "--no-smoke",
    ]  # fmt: skip


def matrix(folder: Path, six: str) -> Path:
    """The torch CPU entry with the team's one small package, `six==VERSION`."""
    path = folder / f"six-{six}.yaml"
    document = {
        "defaults": {"python": "3.11", "os": "bookworm", "packages": [f"six=={six}"]},
        "include": [{"framework": "torch", "framework_version": "2.13.0", "cuda": "cpu"}],
    }
    path.write_text(json.dumps(document))  # JSON is YAML
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="envbuild/base:bookworm")
    parser.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    parser.add_argument("--no-dind", action="store_true", help="Skip the docker:dind figure.")
    parser.add_argument(
        "--only-rebuild", action="store_true", help="Only the rebuild after a small bump."
    )
    parser.add_argument("--repeat", type=int, default=1, help="Cold builds of each kind (median).")
    parser.add_argument("--cuda", action="store_true", help="Also torch 2.4.1+cu121 from PyPI.")
    options = parser.parse_args()
    base, ca = options.base_image, options.ca_bundle
    args = common(base, ca)

    def row(name: str, figure: str, against: str) -> None:
        print(f"{name:<52}  {figure:>9}  {against}", flush=True)

    kit = 0.0
    if not options.only_rebuild:
        with tempfile.TemporaryDirectory(prefix="envbuild-bench-hand-") as tmp:
            work = Path(tmp)
            runs = side_by_side(options.repeat, work, base, ca, ENTRY, args, cuda=False)
            kit = cold_rows("torch CPU", runs, row)
            if options.cuda:
                # From PyPI: the wheelhouse holds the CPU wheel only.
                cuda_args = [
                    a for a in args if a != "--wheelhouse" and a != str(REPO / "wheelhouse")
                ]
                envbuild(["lock", *CUDA_ENTRY, *cuda_args[:4]])  # resolved before the clock
                runs = side_by_side(1, work, base, ca, CUDA_ENTRY, cuda_args, cuda=True)
                cold_rows("torch 2.4.1+cu121", runs, row)

    with tempfile.TemporaryDirectory(prefix="envbuild-bench-") as tmp:
        folder = Path(tmp)
        old, new = matrix(folder, "1.16.0"), matrix(folder, "1.17.0")
        for path in (old, new):
            envbuild(["lock", "-m", str(path), *args[:6]])
        # BuildKit's whole cache dropped first (this engine's, other users' too): the bumped
        # lock's install step must be new to it, as a real bump is, not cached by an earlier run.
        subprocess.run(["docker", "builder", "prune", "-af"], capture_output=True, check=False)
        kit_args = [*args, "--builder", "buildkit", "--locked"]
        cold = envbuild(["build", "-m", str(old), *kit_args])
        bumped = envbuild(["build", "-m", str(new), *kit_args])
    row("cold torch CPU + six 1.16.0, BuildKit", f"{cold:.1f} s", "reference")
    row("rebuild after six 1.16.0 -> 1.17.0, BuildKit cache", f"{bumped:.1f} s",
        f"{bumped / cold:.2f}x cold (target <= 0.3x)")  # fmt: skip

    if not options.no_dind and not options.only_rebuild:
        # The tests' docker:dind engine, which is started through docker-py as the tests do.
        import docker  # noqa: TID251

        from tests.support.dind_engine import dind_engine

        host = docker.from_env()
        with (
            tempfile.TemporaryDirectory(prefix="envbuild-bench-dind-") as tmp,
            dind_engine(host, options.base_image, Path(tmp)) as dind,
        ):
            remote = envbuild(
                ["build", *ENTRY, *args, "--no-cache", "--builder", "buildkit"], env=dind.env
            )
        row("cold torch CPU on docker:dind, BuildKit", f"{remote:.1f} s",
            f"{remote / kit:.2f}x local (target <= 1.3x)")  # fmt: skip

    forget()


if __name__ == "__main__":
    main()
