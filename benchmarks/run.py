"""envbuild's speed and size figures, side by side with the plain-Docker way of doing the same.

Run on a host set up by scripts/host-setup.sh (engine, .venv, ./wheelhouse, a bookworm base):

    .venv/bin/python benchmarks/run.py [--base-image envbuild/base:bookworm] [--ca-bundle FILE]

It builds real images (a few minutes cold) and prints one table. Images it makes are labelled
org.envbuild.benchmark and removed at the end; the envbuild images stay as the build cache.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
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
PIP = "/opt/venv/bin/pip install --no-cache-dir --cert /tmp/ca.crt --find-links /tmp/wheelhouse torch==2.13.0+cpu"
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


def big_matrix(path: Path) -> int:
    """A torch matrix of every release x 12 CUDA x 7 Python x 5 OS (12,180 combinations)."""
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
        "os": ["bullseye", "bookworm", "trixie", "ubuntu22.04", "ubuntu24.04"],
    }
    path.write_text(json.dumps({"axes": axes}))  # JSON is YAML
    count = 1
    for values in axes.values():
        count *= len(values)
    return count


def write_contexts(directory: Path, base_image: str, ca_bundle: Path, wheels: Path) -> list[Path]:
    """Render the CPU matrix's build contexts exactly as `envbuild build` does."""
    from envbuild.build import prepare
    from envbuild.engine import connect
    from envbuild.knowledge import load_knowledge
    from envbuild.matrix import load_matrix, make_plan
    from envbuild.models import BuildOptions, Selection
    from envbuild.render import write_context

    knowledge = load_knowledge()
    plan = make_plan(knowledge, load_matrix(CPU_MATRIX, knowledge), Selection())
    options = BuildOptions(base_image=base_image, ca_bundle=ca_bundle, wheelhouse=wheels)
    engine = connect()
    return [
        write_context(prepare(engine, knowledge, entry, options), directory / entry.id)
        / "Dockerfile"
        for entry in plan.entries
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-image", default="envbuild/base:bookworm")
    parser.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    parser.add_argument("--wheelhouse", default=str(REPO / "wheelhouse"))
    args = parser.parse_args()
    rows: list[tuple[str, str, str]] = []

    with tempfile.TemporaryDirectory(prefix="envbuild-bench-") as tmp:
        work = Path(tmp)
        wheels = work / "wheelhouse"  # the torch wheel only: its dependencies come from PyPI
        wheels.mkdir()
        for wheel in Path(args.wheelhouse).glob("torch-2.13.0+cpu-*.whl"):
            shutil.copy(wheel, wheels / wheel.name)
        fetch = [
            "--base-image",
            args.base_image,
            "--ca-bundle",
            args.ca_bundle,
            "--wheelhouse",
            str(wheels),
        ]

        # 1. cold build of the torch CPU image: envbuild vs a hand-written Dockerfile (pip, uv).
        cold = timed(lambda: run([*ENVBUILD, "build", *TORCH, *fetch, "--no-cache", "--no-smoke"]))
        ours = "envbuild/torch:2.13.0-cpu-py3.11-bookworm"
        hand = work / "hand"
        (hand / "wheelhouse").mkdir(parents=True)
        shutil.copy(args.ca_bundle, hand / "ca.crt")
        for wheel in wheels.iterdir():
            shutil.copy(wheel, hand / "wheelhouse" / wheel.name)
        figures = {}
        for name, install in (("pip", PIP), ("uv", UV)):
            (hand / "Dockerfile").write_text(
                HAND_WRITTEN.format(base=args.base_image, install=install)
            )
            tag = f"envbuild-bench/hand-{name}:1"
            figures[name] = (
                timed(
                    lambda tag=tag: run(
                        ["docker", "build", "--no-cache", "-q", "-t", tag, str(hand)]
                    )
                ),
                image_size(tag),
            )
        rows.append(
            (
                "torch CPU cold build",
                f"envbuild {cold:.1f} s",
                f"hand-written pip {figures['pip'][0]:.1f} s, uv {figures['uv'][0]:.1f} s",
            )
        )
        rows.append(("torch CPU image size", f"envbuild {image_size(ours) / 1e9:.2f} GB",
                     f"hand-written pip {figures['pip'][1] / 1e9:.2f} GB, uv {figures['uv'][1] / 1e9:.2f} GB"))  # fmt: skip

        # 2. smoke test vs a bare import.
        smoke = timed(lambda: run([*ENVBUILD, "smoke", ours]), repeat=3)
        bare = timed(
            lambda: run(["docker", "run", "--rm", ours, "python3", "-c", "import torch"]), repeat=3
        )
        rows.append(
            (
                "smoke test wall time",
                f"envbuild smoke {smoke:.1f} s",
                f"docker run python -c 'import torch' {bare:.1f} s",
            )
        )

        # 3. a no-op rebuild of an already built 3-entry matrix vs fully cached docker builds.
        matrix = ["-m", str(CPU_MATRIX), "--jobs", "2", *fetch]
        run([*ENVBUILD, "build", *matrix])  # builds what is missing and vets it
        noop = timed(lambda: run([*ENVBUILD, "build", *matrix]), repeat=3)
        # The very contexts envbuild built (base probed, as build does), for plain docker build.
        contexts = work / "contexts"
        dockerfiles = write_contexts(contexts, args.base_image, Path(args.ca_bundle), wheels)
        cached = timed(
            lambda: [run(["docker", "build", "-q", str(p.parent)]) for p in dockerfiles], repeat=3
        )
        help_time = timed(lambda: run([*ENVBUILD, "--help"]), repeat=5)
        rows.append((f"no-op rebuild, {len(dockerfiles)} entries", f"envbuild {noop:.2f} s",
                     f"cached docker build loop {cached:.2f} s + start-up {help_time:.2f} s = {cached + help_time:.2f} s"))  # fmt: skip

        # 4. plan of a 10,000+ combination matrix; 5. start-up.
        big = work / "big.yaml"
        combos = big_matrix(big)
        plan = timed(lambda: run([*ENVBUILD, "plan", "-m", str(big), "--format", "json"]), repeat=3)
        rows.append((f"plan, {combos} combinations", f"{plan:.2f} s", "target < 1 s"))
        rows.append(("envbuild --help start-up", f"{help_time:.3f} s", "target < 0.3 s"))

    for image in run(["docker", "images", "-q", "--filter", f"label={LABEL}"]).stdout.split():
        run(["docker", "rmi", "-f", image], check=False)
    width = max(len(r[0]) for r in rows)
    print(f"{'measure'.ljust(width)}  {'envbuild':<22}  reference")
    for name, ours_text, reference in rows:
        print(f"{name.ljust(width)}  {ours_text:<22}  {reference}")


if __name__ == "__main__":
    main()
