"""envbuild's speed and size figures, side by side with the plain-Docker way of doing the same.

Run on a host set up by scripts/host-setup.sh (engine, .venv, ./wheelhouse, a bookworm base):

    .venv/bin/python benchmarks/run.py [--base-image envbuild/base:bookworm] [--ca-bundle FILE]
                                       [--cuda] [--repeat N]

It builds real images (a few minutes cold; `--cuda` adds torch 2.4.1+cu121 from PyPI, about
2.5 GB downloaded twice; `--repeat N` alternates the cold CPU builds N times and shows the
median) and prints one table. The cold builds compare the same package set on both sides. Peak disk is sampled under Docker's data root
while each cold build runs. Images it makes are labelled org.envbuild.benchmark and removed at
the end; the envbuild images stay as the build cache.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENVBUILD = [sys.executable, "-m", "envbuild"]
sys.path.insert(0, str(REPO))
LABEL = "org.envbuild.benchmark=1"
CPU_MATRIX = REPO / "matrices" / "examples" / "cpu.yaml"
TORCH = [
    "--framework",
    "torch",
    "--framework-version",
    "2.13.0",
    "--cuda",
    "cpu",
    "--python",
    "3.11",
]

HAND_WRITTEN = """FROM {base}
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \\
 && rm -rf /var/lib/apt/lists/*
COPY ca.crt /tmp/ca.crt
COPY wheelhouse/ /tmp/wheelhouse/
RUN python3 -m venv /opt/venv && {install} && rm -rf /tmp/wheelhouse /tmp/ca.crt
ENV PATH=/opt/venv/bin:$PATH
LABEL org.envbuild.benchmark=1
"""
# envbuild's side of a cold-build comparison: the hand-written Dockerfiles' packages, no more.
SAME_AS_HAND = """defaults: {{python: "3.11", os: bookworm, numpy: false}}
axes: {{framework: [torch], framework_version: ["{version}"], cuda: ["{cuda}"]}}
"""
PIP = "/opt/venv/bin/pip install --no-cache-dir --cert /tmp/ca.crt --find-links /tmp/wheelhouse torch==2.13.0+cpu"
PIP_CUDA = "/opt/venv/bin/pip install --no-cache-dir --cert /tmp/ca.crt torch==2.4.1"
UV = (
    "/opt/venv/bin/pip install --no-cache-dir --cert /tmp/ca.crt uv "
    "&& SSL_CERT_FILE=/tmp/ca.crt /opt/venv/bin/uv pip install --no-cache --python /opt/venv/bin/python "
    "--find-links /tmp/wheelhouse torch==2.13.0+cpu && /opt/venv/bin/pip uninstall -y uv"
)


def run(command: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        sys.exit(f"benchmark: {' '.join(command[:6])} ... failed:\n{result.stderr[-2000:]}")
    return result


def timed(action: Callable[[], object], repeat: int = 1) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def image_size(ref: str) -> int:
    return int(run(["docker", "image", "inspect", ref, "--format", "{{.Size}}"]).stdout.strip())


DATA_ROOT = "/var/lib/docker"


def with_peak_disk(action: Callable[[], object]) -> tuple[float, int]:
    """Run `action`; its seconds and the peak of extra bytes used on Docker's data root's file
    system while it ran (sampled every 0.2 s)."""
    start_used = shutil.disk_usage(DATA_ROOT).used
    peak = [start_used]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.2):
            peak[0] = max(peak[0], shutil.disk_usage(DATA_ROOT).used)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    try:
        action()
    finally:
        seconds = time.perf_counter() - started
        done.set()
        sampler.join()
    return seconds, max(peak[0], shutil.disk_usage(DATA_ROOT).used) - start_used


def hand_written(work: Path, base: str, ca_bundle: str, install: str, wheels: Path | None) -> Path:
    """A context for the plain Dockerfile a user would write (CA bundle and wheels copied in)."""
    hand = work / f"hand-{abs(hash(install)) % 10_000}"
    (hand / "wheelhouse").mkdir(parents=True, exist_ok=True)
    shutil.copy(ca_bundle, hand / "ca.crt")
    for wheel in wheels.iterdir() if wheels else ():
        shutil.copy(wheel, hand / "wheelhouse" / wheel.name)
    (hand / "Dockerfile").write_text(HAND_WRITTEN.format(base=base, install=install))
    return hand


def forget(ref: str) -> None:
    """Remove an image, if there, and the layers only it held."""
    run(["docker", "rmi", "-f", ref], check=False)
    run(["docker", "image", "prune", "-f"], check=False)


def median_of(runs: list[tuple[float, int, int]]) -> tuple[float, int, int]:
    """The run of median seconds (its disk and size with it)."""
    return sorted(runs)[len(runs) // 2]


def gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB"


def big_matrix(path: Path) -> int:
    """A torch matrix of every release x 12 CUDA x 7 Python x 4 OS (9,744 combinations: a matrix
    file may multiply to at most 10,000)."""
    releases = ["latest", *(f"2.{minor}.0" for minor in range(16)), "2.1.1", "2.1.2", "2.2.1", "2.2.2",
                "2.3.1", "2.4.1", "2.5.1", "2.7.1", "2.9.1", "2.12.1", "2.14.1", "2.0.1"]  # fmt: skip
    axes = {
        "framework": ["torch"],
        "framework_version": releases,
        "cuda": [
            "cpu",
            "11.7",
            "11.8",
            "12.1",
            "12.4",
            "12.6",
            "12.8",
            "12.9",
            "13.0",
            "13.2",
            "12",
            "13",
        ],
        "python": ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13", "3.14"],
        "os": ["bullseye", "bookworm", "trixie", "ubuntu24.04"],
    }
    path.write_text(json.dumps({"axes": axes}))  # JSON is YAML
    count = 1
    for values in axes.values():
        count *= len(values)
    return count


class Rows(list[tuple[str, str, str]]):
    """The table's rows; each is also printed (stderr) as soon as it is measured."""

    def append(self, row: tuple[str, str, str]) -> None:
        super().append(row)
        print(" | ".join(row), file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="envbuild/base:bookworm")
    parser.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    parser.add_argument("--wheelhouse", default=str(REPO / "wheelhouse"))
    parser.add_argument("--cuda", action="store_true", help="Also torch 2.4.1+cu121 from PyPI.")
    parser.add_argument(
        "--repeat", type=int, default=1, help="Cold CPU builds of each kind (median shown)."
    )
    args = parser.parse_args()
    rows = Rows()

    with tempfile.TemporaryDirectory(prefix="envbuild-bench-") as tmp:
        work = Path(tmp)
        wheels = work / "wheelhouse"  # the torch wheel only: its dependencies come from PyPI
        wheels.mkdir()
        for wheel in Path(args.wheelhouse).glob("torch-2.13.0+cpu-*.whl"):
            shutil.copy(wheel, wheels / wheel.name)
        fetch = ["--base-image", args.base_image, "--ca-bundle", args.ca_bundle]
        ours = "envbuild/torch:2.13.0-cpu-py3.11-bookworm"

        # 1. cold build of the torch CPU image, with peak disk: envbuild vs hand-written pip, uv.
        # The same packages on both sides: torch and its dependencies (numpy, which envbuild
        # adds by default, left out by the matrix), so the figures compare the ways of building.
        cpu_matrix_file = work / "torch-cpu.yaml"
        cpu_matrix_file.write_text(SAME_AS_HAND.format(version="2.13.0", cuda="cpu"))
        cpu = [*ENVBUILD, "build", "-m", str(cpu_matrix_file), *fetch, "--wheelhouse", str(wheels),
               "--no-smoke"]  # fmt: skip
        run(cpu)  # its lock resolved (about a second; measured below), built once
        samples: dict[str, list[tuple[float, int, int]]] = {"envbuild": [], "pip": [], "uv": []}
        for _ in range(args.repeat):  # interleaved, so that a slow minute of the network or
            forget(ours)  # the disk falls on every side; else identical layers are reused
            seconds, disk = with_peak_disk(lambda: run([*cpu, "--no-cache"]))
            samples["envbuild"].append((seconds, disk, image_size(ours)))
            for name, install in (("pip", PIP), ("uv", UV)):
                hand = hand_written(work, args.base_image, args.ca_bundle, install, wheels)
                tag = f"envbuild-bench/hand-{name}:1"
                forget(tag)
                seconds, disk = with_peak_disk(
                    lambda tag=tag, hand=hand: run(
                        ["docker", "build", "--no-cache", "-q", "-t", tag, str(hand)]
                    )
                )
                samples[name].append((seconds, disk, image_size(tag)))
        cold, cold_disk, size = median_of(samples["envbuild"])
        pip_s, pip_disk, pip_size = median_of(samples["pip"])
        uv_s, _, uv_size = median_of(samples["uv"])
        each = "; runs: " + ", ".join(
            f"{name} " + "/".join(f"{t:.1f}" for t, _, _ in runs) for name, runs in samples.items()
        )
        rows.append(("torch CPU cold build (--no-cache)", f"{cold:.1f} s ({cold / pip_s:.2f}x pip)",
                     f"hand-written pip {pip_s:.1f} s, uv {uv_s:.1f} s; target <= 0.7x pip"
                     f"{each if args.repeat > 1 else ''}"))  # fmt: skip
        rows.append(("torch CPU image size", gb(size),
                     f"hand-written pip {gb(pip_size)}, uv {gb(uv_size)}"))  # fmt: skip
        rows.append(("torch CPU peak extra disk", f"{gb(cold_disk)} ({cold_disk / size:.2f}x image)",
                     f"hand-written pip {gb(pip_disk)} ({pip_disk / pip_size:.2f}x image)"))  # fmt: skip

        # 2. torch 2.4.1+cu121 from PyPI (its plain wheel is the cu121 build), both cold, the same
        # packages on both sides (no numpy).
        if args.cuda:
            cuda_matrix = work / "torch-cu121.yaml"
            cuda_matrix.write_text(SAME_AS_HAND.format(version="2.4.1", cuda="12.1"))
            cuda = [*ENVBUILD, "build", "-m", str(cuda_matrix), *fetch, "--no-smoke"]
            run([*ENVBUILD, "lock", "-m", str(cuda_matrix)])  # resolved before the clock
            cu_ref = "envbuild/torch:2.4.1-cu121-py3.11-bookworm"
            forget(cu_ref)
            cu_s, cu_disk = with_peak_disk(lambda: run([*cuda, "--no-cache"]))
            cu_size = image_size(cu_ref)
            forget(cu_ref)  # 5 GB: not kept for the rest
            hand = hand_written(work, args.base_image, args.ca_bundle, PIP_CUDA, None)
            tag = "envbuild-bench/hand-cu121:1"
            hand_s, hand_disk = with_peak_disk(
                lambda: run(["docker", "build", "--no-cache", "-q", "-t", tag, str(hand)])
            )
            hand_size = image_size(tag)
            forget(tag)
            rows.append(("torch 2.4.1+cu121 cold build", f"{cu_s:.1f} s ({cu_s / hand_s:.2f}x pip)",
                         f"hand-written pip {hand_s:.1f} s; target <= 0.7x"))  # fmt: skip
            rows.append(
                ("torch 2.4.1+cu121 image size", gb(cu_size), f"hand-written pip {gb(hand_size)}")
            )
            rows.append(("torch 2.4.1+cu121 peak extra disk",
                         f"{gb(cu_disk)} ({cu_disk / cu_size:.2f}x image)",
                         f"hand-written pip {gb(hand_disk)} ({hand_disk / hand_size:.2f}x image)"))  # fmt: skip
        run(cpu)  # the CPU image again (numpy-free), for the smoke timing below

        # 3. smoke test vs a bare import.
        smoke = timed(lambda: run([*ENVBUILD, "smoke", ours]), repeat=3)
        bare = timed(
            lambda: run(["docker", "run", "--rm", ours, "python3", "-c", "import torch"]), repeat=3
        )
        rows.append(("smoke test wall time", f"envbuild smoke {smoke:.1f} s",
                     f"docker run python -c 'import torch' {bare:.1f} s"))  # fmt: skip

        # 4. a no-op rebuild of an already built 3-entry matrix vs a loop of fully cached
        # `docker build`s (the hand-written Dockerfile, once per entry).
        cpu_matrix = work / "cpu.yaml"  # a copy: its locks go beside it, not into the tree
        shutil.copy(CPU_MATRIX, cpu_matrix)
        matrix = ["-m", str(cpu_matrix), "--jobs", "2", *fetch, "--wheelhouse", str(wheels)]
        run([*ENVBUILD, "build", *matrix])  # builds what is missing and vets it
        noop = timed(lambda: run([*ENVBUILD, "build", *matrix]), repeat=3)
        hand = hand_written(work, args.base_image, args.ca_bundle, PIP, wheels)
        cached = timed(
            lambda: [run(["docker", "build", "-q", str(hand)]) for _ in range(3)], repeat=3
        )
        help_time = timed(lambda: run([*ENVBUILD, "--help"]), repeat=5)
        rows.append(("no-op rebuild, 3 entries", f"envbuild {noop:.2f} s",
                     f"cached docker build loop {cached:.2f} s + start-up {help_time:.2f} s = {cached + help_time:.2f} s"))  # fmt: skip

        # 5. lock of the default matrix (9 entries), warm (uv's cache filled by a first run).
        default = work / "default.yaml"
        shutil.copy(REPO / "matrices" / "default.yaml", default)
        lock = [*ENVBUILD, "lock", "-m", str(default), "--wheelhouse", str(wheels),
                "--ca-bundle", args.ca_bundle]  # fmt: skip
        first = run(lock, check=False)
        warm = timed(lambda: run(lock, check=False), repeat=3)
        failed = [line for line in first.stderr.splitlines() if "could not resolve" in line]
        note = f"; {len(failed)} entries unresolved here: {failed[0][:120]}" if failed else ""
        rows.append(
            ("lock, default matrix (9 entries), warm", f"{warm:.2f} s", f"target <= 10 s{note}")
        )

        # 6. plan of a 10,000+ combination matrix; 7. start-up.
        big = work / "big.yaml"
        combos = big_matrix(big)
        plan = timed(lambda: run([*ENVBUILD, "plan", "-m", str(big), "--format", "json"]), repeat=3)
        rows.append((f"plan, {combos} combinations", f"{plan:.2f} s", "target < 1 s"))
        rows.append(("envbuild --help start-up", f"{help_time:.3f} s", "target < 0.3 s"))

    for image in run(["docker", "images", "-q", "--filter", f"label={LABEL}"]).stdout.split():
        run(["docker", "rmi", "-f", image], check=False)
    width = max(len(r[0]) for r in rows)
    print(f"{'measure'.ljust(width)}  {'envbuild':<28}  reference")
    for name, ours_text, reference in rows:
        print(f"{name.ljust(width)}  {ours_text:<28}  {reference}")


if __name__ == "__main__":
    main()
