"""envbuild's speed and size figures, side by side with the plain-Docker way of doing the same.

Run on a host set up by scripts/host-setup.sh (engine, .venv, ./wheelhouse, a bookworm base):

    .venv/bin/python benchmarks/run.py [--base-image envbuild/base:bookworm] [--ca-bundle FILE]
                                       [--cuda] [--repeat N]

It builds real images (a few minutes cold; `--cuda` adds torch 2.4.1+cu121 from PyPI, about
2.5 GB downloaded twice; `--repeat N` alternates the cold CPU builds N times and shows the
median) and prints one table. The cold builds compare the same package set on both sides: the
hand-written Dockerfiles `+cc` install the compiler envbuild's torch images carry (g++ and
Python's headers, the packages of templates/partials/python.j2's apt line); those without it
are the older reference. envbuild is built as it is by default, which byte-compiles (as pip
and `+pyc` do), and with the matrix's `bytecode: false` (as uv does): each is held to the
hand-written build that does the same work. Every build's output is stamped as it comes, so
the table says where each cold build's seconds went (each Dockerfile step, the install step's
own phases, the layer commit). Peak disk is sampled on Docker's data root while each cold
build runs, from a floor settled after the previous build's images were removed; each cold
build starts with the kernel's caches dropped (as root), so that none inherits the memory the
one before it left.
Images it makes are labelled org.envbuild.benchmark and removed at the end; the envbuild images
stay as the build cache.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENVBUILD = [sys.executable, "-m", "envbuild"]
sys.path.insert(0, str(REPO))
from envbuild.core.places import log_dir  # noqa: E402

LABEL = "org.envbuild.benchmark=1"
CPU_MATRIX = REPO / "matrices" / "examples" / "cpu.yaml"
DATA_ROOT = "/var/lib/docker"
# Both sides build with the classic builder: envbuild drives the engine's API, which has no
# BuildKit; a docker client that defaults to BuildKit would compare two builders.
CLASSIC = {**os.environ, "DOCKER_BUILDKIT": "0", "ENVBUILD_BUILDER": "classic"}

# What a user writes by hand. The OS packages' RUN without the compiler is the older reference;
# with it, the packages and clean-up of templates/partials/python.j2's line, as a user writes it
# (without dpkg's --force-unsafe-io and the documentation envbuild leaves out).
APT = {
    False: "apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \\\n"
    " && rm -rf /var/lib/apt/lists/*",
    True: "apt-get update \\\n"
    " && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 "
    "python3-venv g++ libpython3-dev \\\n && apt-get clean \\\n && rm -rf /var/lib/apt/lists/*",
}
HAND_WRITTEN = """FROM {base}
RUN {apt}
COPY ca.crt /tmp/ca.crt
COPY wheelhouse/ /tmp/wheelhouse/
RUN python3 -m venv /opt/venv && {install} && rm -rf /tmp/wheelhouse /tmp/ca.crt
ENV PATH=/opt/venv/bin:$PATH
LABEL org.envbuild.benchmark=1
"""
# envbuild's side of a cold-build comparison: the hand-written Dockerfiles' packages, no more.
SAME_AS_HAND = """defaults: {{python: "3.11", os: bookworm, numpy: false, bytecode: {bytecode}}}
axes: {{framework: [torch], framework_version: ["{version}"], cuda: ["{cuda}"]}}
"""
# The two envbuild sides of the CPU builds: the default, which byte-compiles (as uv+cc+pyc and
# pip+cc do), and `bytecode: false` (as uv+cc does not).
COMPILED, NOT_COMPILED = "envbuild", "envbuild, bytecode: false"
PIP = "/opt/venv/bin/pip install --no-cache-dir --cert /tmp/ca.crt --find-links /tmp/wheelhouse torch==2.13.0+cpu"
PIP_CUDA = "/opt/venv/bin/pip install --no-cache-dir --cert /tmp/ca.crt torch==2.4.1"
UV = (
    "/opt/venv/bin/pip install --no-cache-dir --cert /tmp/ca.crt uv "
    "&& SSL_CERT_FILE=/tmp/ca.crt /opt/venv/bin/uv pip install --no-cache --python /opt/venv/bin/python "
    "--find-links /tmp/wheelhouse torch==2.13.0+cpu && /opt/venv/bin/pip uninstall -y uv"
)
# The same with bytecode compiled, as envbuild's and pip's installs do: the same image's bytes.
UV_PYC = UV.replace("uv pip install --no-cache", "uv pip install --no-cache --compile-bytecode")


@dataclass(frozen=True)
class Hand:
    """One hand-written Dockerfile: its name in the table, its install command, its compiler."""

    name: str
    install: str
    compiler: bool


HANDS_CPU = (
    Hand(name="uv+cc", install=UV, compiler=True),
    Hand(name="uv+cc+pyc", install=UV_PYC, compiler=True),
    Hand(name="pip+cc", install=PIP, compiler=True),
    Hand(name="uv", install=UV, compiler=False),
    Hand(name="pip", install=PIP, compiler=False),
)
HANDS_CUDA = (
    Hand(name="pip+cc", install=PIP_CUDA, compiler=True),
    Hand(name="pip", install=PIP_CUDA, compiler=False),
)


@dataclass(frozen=True)
class Build:
    """One cold build: its seconds, peak extra disk, image size and stamped output."""

    seconds: float
    disk: int
    size: int
    lines: tuple[tuple[float, str], ...]


def run(command: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=CLASSIC)
    if check and result.returncode != 0:
        sys.exit(f"benchmark: {' '.join(command[:6])} ... failed:\n{result.stderr[-2000:]}")
    return result


def run_stamped(command: list[str], into: list[tuple[float, str]], started: float) -> None:
    """Run `command`, each line of its output kept with the seconds since `started`."""
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=CLASSIC
    ) as process:
        assert process.stdout is not None
        for line in process.stdout:
            into.append((time.perf_counter() - started, line.rstrip("\n")))
    if process.returncode != 0:
        tail = "\n".join(line for _, line in into[-30:])
        sys.exit(f"benchmark: {' '.join(command[:6])} ... failed:\n{tail}")


def follow(
    path: Path, into: list[tuple[float, str]], started: float, done: threading.Event
) -> None:
    """Stamp the lines written to `path` (envbuild's build log, line-buffered) until `done`."""
    while not path.exists() and not done.wait(0.02):
        pass
    if not path.exists():
        return
    with path.open(encoding="utf-8", errors="replace") as handle:
        pending = ""
        while True:
            chunk = handle.read()
            if chunk:
                now = time.perf_counter() - started
                *complete, pending = (pending + chunk).split("\n")
                into.extend((now, line) for line in complete)
            elif done.is_set():
                break
            else:
                time.sleep(0.02)


def timed(action: Callable[[], object], repeat: int = 1) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def image_size(ref: str) -> int:
    return int(run(["docker", "image", "inspect", ref, "--format", "{{.Size}}"]).stdout.strip())


def drop_caches() -> bool:
    """Write the dirty pages out and drop the kernel's clean page, dentry and inode caches, so
    that every cold build starts from the same memory (root only: False where it cannot).
    Without it the same build drifts within a run: envbuild's torch CPU entry took 36.4, 39.5
    and 40.1 s one after the other here, then 32.8 s right after the caches were dropped and
    37.5 s after that; dropped before each, three took 33.6, 33.3 and 33.0 s."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n", encoding="ascii")
    except OSError:
        return False
    return True


def settle() -> None:
    """Wait until the data root's usage holds still (a removed image's blocks are freed while
    the next build would already be measured), so that a peak is counted from a steady floor;
    then drop the caches (drop_caches)."""
    os.sync()
    last = shutil.disk_usage(DATA_ROOT).used
    for _ in range(100):
        time.sleep(0.3)
        now = shutil.disk_usage(DATA_ROOT).used
        if abs(now - last) < 16 * 2**20:
            break
        last = now
    if not drop_caches():
        _cannot_drop_caches()


@functools.cache
def _cannot_drop_caches() -> None:
    print("benchmark: cannot drop the kernel's caches (not root): each cold build starts from "
          "the memory the one before left, and the figures drift", file=sys.stderr)  # fmt: skip


def with_peak_disk(action: Callable[[], object]) -> tuple[float, int]:
    """Run `action`; its seconds and the peak of extra bytes used on Docker's data root's file
    system while it ran (sampled every 0.1 s)."""
    settle()
    start_used = shutil.disk_usage(DATA_ROOT).used
    peak = [start_used]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
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


def envbuild_build(command: list[str], entry_id: str, ref: str) -> Build:
    """A cold envbuild build of one entry, its build log stamped as it is written."""
    forget(ref)
    log = log_dir() / f"{entry_id}.log"
    log.unlink(missing_ok=True)
    lines: list[tuple[float, str]] = []
    done = threading.Event()
    started = [0.0]

    def build() -> None:
        started[0] = time.perf_counter()
        tail = threading.Thread(target=follow, args=(log, lines, started[0], done), daemon=True)
        tail.start()
        try:
            run([*command, "--no-cache"])
        finally:
            done.set()
            tail.join()

    seconds, disk = with_peak_disk(build)
    return Build(seconds=seconds, disk=disk, size=image_size(ref), lines=tuple(lines))


def hand_build(work: Path, base: str, ca_bundle: str, hand: Hand, wheels: Path | None) -> Build:
    """A cold `docker build` of a hand-written Dockerfile, its output stamped; the image removed."""
    context = hand_written(work, base, ca_bundle, hand, wheels)
    tag = f"envbuild-bench/hand-{hand.name.replace('+', '-')}:1"
    forget(tag)
    lines: list[tuple[float, str]] = []
    command = ["docker", "build", "--no-cache", "-t", tag, str(context)]
    seconds, disk = with_peak_disk(lambda: run_stamped(command, lines, time.perf_counter()))
    size = image_size(tag)
    forget(tag)
    return Build(seconds=seconds, disk=disk, size=size, lines=tuple(lines))


def hand_written(work: Path, base: str, ca_bundle: str, hand: Hand, wheels: Path | None) -> Path:
    """A context for the plain Dockerfile a user would write (CA bundle and wheels copied in)."""
    context = work / f"hand-{hand.name.replace('+', '-')}-{abs(hash(hand.install)) % 10_000}"
    if not context.exists():
        (context / "wheelhouse").mkdir(parents=True)
        shutil.copy(ca_bundle, context / "ca.crt")
        for wheel in wheels.iterdir() if wheels else ():
            shutil.copy(wheel, context / "wheelhouse" / wheel.name)
    dockerfile = HAND_WRITTEN.format(base=base, apt=APT[hand.compiler], install=hand.install)
    (context / "Dockerfile").write_text(dockerfile)
    return context


def forget(ref: str) -> None:
    """Remove an image, if there, and the layers only it held."""
    run(["docker", "rmi", "-f", ref], check=False)
    run(["docker", "image", "prune", "-f"], check=False)


_STEP = re.compile(r"^Step \d+/\d+ : (\S+)(.*)")
_UV_PHASE = re.compile(r"^(Prepared|Installed|Bytecode compiled) \d+ \w+ in ([\d.]+)(ms|s)\b")
_INSTALL_PHASES = re.compile(r"envbuild install: (.*)$")


@dataclass(frozen=True)
class Step:
    """One Dockerfile step of a stamped classic-builder build."""

    instruction: str
    text: str
    start: float
    seconds: float
    commit: float  # a RUN's last output line to the builder's next line (commit, clean-up)
    output: tuple[str, ...]


def steps(lines: tuple[tuple[float, str], ...], end: float) -> list[Step]:
    """The build's steps, each with its seconds (to the next step, or to the builder's
    "Successfully built" line after the last)."""
    found: list[Step] = []
    starts = [i for i, (_, line) in enumerate(lines) if _STEP.match(line)]
    for k, i in enumerate(starts):
        j = starts[k + 1] if k + 1 < len(starts) else len(lines)
        body = lines[i + 1 : j]
        done = [t for t, s in body if s.startswith("Successfully built")]
        stop = lines[j][0] if j < len(lines) else (done[0] if done else end)
        match = _STEP.match(lines[i][1])
        assert match is not None
        output = [(t, s) for t, s in body if not _builder_line(s)]
        after = [t for t, s in body if _builder_line(s) and output and t >= output[-1][0]]
        commit = (min(after) if after else stop) - output[-1][0] if output else 0.0
        found.append(Step(instruction=match.group(1).upper(), text=match.group(2).strip(),
                          start=lines[i][0], seconds=stop - lines[i][0], commit=commit,
                          output=tuple(s for _, s in output)))  # fmt: skip
    return found


def _builder_line(line: str) -> bool:
    return line.startswith((" ---> ", "Removing intermediate", "Successfully ", "Sending build"))


def where_it_went(build: Build) -> str:
    """One line: the OS packages' RUN, each install RUN (its phases, its commit), the rest."""
    found = steps(build.lines, build.seconds)
    if not found:
        return "no build output was seen"
    runs = [step for step in found if step.instruction == "RUN"]
    apt = next((step for step in runs if "apt-get" in step.text), None)
    installs = [step for step in runs if step is not apt]
    parts = []
    if apt is not None:
        parts.append(f"OS packages {apt.seconds:.1f} s (commit {apt.commit:.1f})")
    for step in installs:
        only = " (CUDA libraries)" if "--only" in step.text else ""
        parts.append(
            f"install{only} {step.seconds:.1f} s ({_phases(step)}commit {step.commit:.1f})"
        )
    rest = [step for step in found if step not in runs]
    parts.append(f"{len(rest)} other steps {sum(step.seconds for step in rest):.1f} s")
    last = found[-1].start + found[-1].seconds
    parts.append(f"before the first step {found[0].start:.1f} s, after the last "
                 f"{build.seconds - last:.1f} s")  # fmt: skip
    return "; ".join(parts)


def _phases(step: Step) -> str:
    """What the install step printed of its own phases: envbuild's and uv's summaries."""
    said = []
    for line in step.output:
        clean = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", line).strip()
        ours = _INSTALL_PHASES.search(clean)
        if ours:
            said.append(ours.group(1).replace(" install ", " uv "))
            continue
        match = _UV_PHASE.match(clean)
        if match:
            value = float(match.group(2)) / (1000 if match.group(3) == "ms" else 1)
            name = {"Prepared": "download+unpack", "Installed": "link",
                    "Bytecode compiled": "bytecode"}[match.group(1)]  # fmt: skip
            said.append(f"{name} {value:.1f}")
    return ", ".join(said) + ": " if said else ""


def median_of(runs: list[Build]) -> Build:
    """The run of median seconds (its disk, size and output with it)."""
    return sorted(runs, key=lambda build: build.seconds)[len(runs) // 2]


def gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB"


def verdict(holds: bool) -> str:
    return "met" if holds else "**missed**"


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


@dataclass(frozen=True)
class Setup:
    """What every section of the run shares."""

    work: Path
    wheels: Path  # the torch CPU wheel only: its dependencies come from PyPI
    fetch: list[str]  # --base-image, --ca-bundle
    base: str
    ca_bundle: str
    repeat: int


CPU_ID, CPU_REF = "torch2.13.0-cpu-py3.11-bookworm", "envbuild/torch:2.13.0-cpu-py3.11-bookworm"
CU_ID, CU_REF = "torch2.4.1-cu121-py3.11-bookworm", "envbuild/torch:2.4.1-cu121-py3.11-bookworm"


def cold_cpu(setup: Setup, rows: Rows) -> list[str]:
    """1. Cold torch CPU builds, interleaved `repeat` times: envbuild as it is by default (with
    bytecode) and with `bytecode: false`, and every hand-written Dockerfile, the same packages on
    every side (torch and its dependencies; envbuild's default numpy left out by the matrix);
    the median of each. Each envbuild side is held to the hand-written build that does as it
    does: with bytecode to uv+cc+pyc, without to uv+cc. Returns envbuild's build command (the
    default's)."""
    commands = {}
    for side, bytecode in ((COMPILED, "true"), (NOT_COMPILED, "false")):
        matrix = setup.work / f"torch-cpu-bytecode-{bytecode}.yaml"
        matrix.write_text(SAME_AS_HAND.format(version="2.13.0", cuda="cpu", bytecode=bytecode))
        commands[side] = [*ENVBUILD, "build", "-m", str(matrix), *setup.fetch, "--wheelhouse",
                          str(setup.wheels), "--no-smoke"]  # fmt: skip
        run(commands[side])  # its lock resolved (about a second; measured below), built once
    samples: dict[str, list[Build]] = {side: [] for side in commands}
    samples.update({hand.name: [] for hand in HANDS_CPU})
    for _ in range(setup.repeat):  # interleaved, so that a slow minute of the network or the
        # disk falls on every side; --no-cache, else identical layers are reused
        for side, command in commands.items():
            samples[side].append(envbuild_build(command, CPU_ID, CPU_REF))
        for hand in HANDS_CPU:
            samples[hand.name].append(
                hand_build(setup.work, setup.base, setup.ca_bundle, hand, setup.wheels)
            )
    median = {name: median_of(runs) for name, runs in samples.items()}
    ours, plain = median[COMPILED], median[NOT_COMPILED]
    uv_cc, uv_pyc, pip_cc = median["uv+cc"], median["uv+cc+pyc"], median["pip+cc"]
    each = "; runs: " + ", ".join(
        f"{name} " + "/".join(f"{b.seconds:.1f}" for b in runs) for name, runs in samples.items()
    )
    hands = ", ".join(f"{hand.name} {median[hand.name].seconds:.1f} s" for hand in HANDS_CPU)
    rows.append(("torch CPU cold build (--no-cache), bytecode: false",
                 f"{plain.seconds:.1f} s ({plain.seconds / uv_cc.seconds:.2f}x uv+cc)",
                 f"hand-written {hands}; target <= uv+cc (neither byte-compiles): "
                 f"{verdict(plain.seconds <= uv_cc.seconds)}"))  # fmt: skip
    rows.append(("torch CPU cold build (--no-cache), with bytecode (the default)",
                 f"{ours.seconds:.1f} s ({ours.seconds / uv_pyc.seconds:.2f}x uv+cc+pyc, "
                 f"{ours.seconds / uv_cc.seconds:.2f}x uv+cc)",
                 f"target <= uv+cc+pyc (both byte-compile): "
                 f"{verdict(ours.seconds <= uv_pyc.seconds)}"
                 f"{each if setup.repeat > 1 else ''}"))  # fmt: skip
    sizes = ", ".join(f"{hand.name} {gb(median[hand.name].size)}" for hand in HANDS_CPU)
    rows.append(("torch CPU image size", f"{gb(ours.size)}, bytecode: false {gb(plain.size)}",
                 f"hand-written {sizes}"))  # fmt: skip
    disks = ", ".join(
        f"{hand.name} {gb(median[hand.name].disk)} ({median[hand.name].disk / median[hand.name].size:.2f}x)"
        for hand in HANDS_CPU
    )
    fair = min(uv_cc.disk, pip_cc.disk)
    rows.append(("torch CPU peak extra disk",
                 f"{gb(ours.disk)} ({ours.disk / ours.size:.2f}x image), bytecode: false "
                 f"{gb(plain.disk)} ({plain.disk / plain.size:.2f}x)",
                 f"hand-written {disks}; target <= the +cc builds': "
                 f"{verdict(max(ours.disk, plain.disk) <= fair)}"))  # fmt: skip
    rows.append(("torch CPU, bytecode: false: where the seconds went",
                 "envbuild: " + where_it_went(plain), "uv+cc: " + where_it_went(uv_cc)))  # fmt: skip
    rows.append(("torch CPU, with bytecode: where the seconds went",
                 "envbuild: " + where_it_went(ours), "uv+cc+pyc: " + where_it_went(uv_pyc)))  # fmt: skip
    return commands[COMPILED]


def cold_cuda(setup: Setup, rows: Rows) -> None:
    """2. torch 2.4.1+cu121 from PyPI (its plain wheel is the cu121 build), each side cold once,
    the same packages on both sides (no numpy)."""
    matrix = setup.work / "torch-cu121.yaml"
    matrix.write_text(SAME_AS_HAND.format(version="2.4.1", cuda="12.1", bytecode="true"))
    cuda = [*ENVBUILD, "build", "-m", str(matrix), *setup.fetch, "--no-smoke"]
    run([*ENVBUILD, "lock", "-m", str(matrix)])  # resolved before the clock
    ours = envbuild_build(cuda, CU_ID, CU_REF)
    forget(CU_REF)  # 5 GB: not kept for the rest
    hand = {
        h.name: hand_build(setup.work, setup.base, setup.ca_bundle, h, None) for h in HANDS_CUDA
    }
    pip_cc, pip = hand["pip+cc"], hand["pip"]
    ratio = ours.seconds / pip_cc.seconds
    rows.append(("torch 2.4.1+cu121 cold build", f"{ours.seconds:.1f} s ({ratio:.2f}x pip+cc)",
                 f"hand-written pip+cc {pip_cc.seconds:.1f} s, pip {pip.seconds:.1f} s "
                 f"({ours.seconds / pip.seconds:.2f}x); target <= 0.7x pip+cc: {verdict(ratio <= 0.7)}"))  # fmt: skip
    rows.append(("torch 2.4.1+cu121 image size", gb(ours.size),
                 f"hand-written pip+cc {gb(pip_cc.size)}, pip {gb(pip.size)}"))  # fmt: skip
    rows.append(("torch 2.4.1+cu121 peak extra disk",
                 f"{gb(ours.disk)} ({ours.disk / ours.size:.2f}x image)",
                 f"hand-written pip+cc {gb(pip_cc.disk)} ({pip_cc.disk / pip_cc.size:.2f}x), "
                 f"pip {gb(pip.disk)} ({pip.disk / pip.size:.2f}x); target <= pip+cc: "
                 f"{verdict(ours.disk <= pip_cc.disk)}"))  # fmt: skip
    rows.append(("torch 2.4.1+cu121: where the seconds went", "envbuild: " + where_it_went(ours),
                 "pip+cc: " + where_it_went(pip_cc)))  # fmt: skip


def warm_figures(setup: Setup, rows: Rows, cpu: list[str]) -> None:
    """3.-7. The smoke test, a no-op rebuild, a warm lock, a big plan, the start-up."""
    run(cpu)  # the CPU image again (numpy-free), for the smoke timing below
    smoke = timed(lambda: run([*ENVBUILD, "smoke", CPU_REF]), repeat=3)
    bare = timed(
        lambda: run(["docker", "run", "--rm", CPU_REF, "python3", "-c", "import torch"]), repeat=3
    )
    rows.append(("smoke test wall time", f"envbuild smoke {smoke:.1f} s",
                 f"docker run python -c 'import torch' {bare:.1f} s"))  # fmt: skip

    # A no-op rebuild of an already built 3-entry matrix vs a loop of fully cached
    # `docker build`s (the hand-written Dockerfile, once per entry).
    cpu_matrix = setup.work / "cpu.yaml"  # a copy: its locks go beside it, not into the tree
    shutil.copy(CPU_MATRIX, cpu_matrix)
    matrix = ["-m", str(cpu_matrix), "--jobs", "2", *setup.fetch, "--wheelhouse", str(setup.wheels)]
    run([*ENVBUILD, "build", *matrix])  # builds what is missing and vets it
    noop = timed(lambda: run([*ENVBUILD, "build", *matrix]), repeat=3)
    hand = hand_written(setup.work, setup.base, setup.ca_bundle, HANDS_CPU[-1], setup.wheels)
    cached = timed(lambda: [run(["docker", "build", "-q", str(hand)]) for _ in range(3)], repeat=3)
    help_time = timed(lambda: run([*ENVBUILD, "--help"]), repeat=5)
    rows.append(("no-op rebuild, 3 entries", f"envbuild {noop:.2f} s",
                 f"cached docker build loop {cached:.2f} s + start-up {help_time:.2f} s = {cached + help_time:.2f} s"))  # fmt: skip

    # The lock of the default matrix (9 entries), warm (uv's cache filled by a first run).
    default = setup.work / "default.yaml"
    shutil.copy(REPO / "matrices" / "default.yaml", default)
    lock = [*ENVBUILD, "lock", "-m", str(default), "--wheelhouse", str(setup.wheels),
            "--ca-bundle", setup.ca_bundle]  # fmt: skip
    first = run(lock, check=False)
    warm = timed(lambda: run(lock, check=False), repeat=3)
    failed = [line for line in first.stderr.splitlines() if "could not resolve" in line]
    note = f"; {len(failed)} entries unresolved here: {failed[0][:120]}" if failed else ""
    rows.append(
        ("lock, default matrix (9 entries), warm", f"{warm:.2f} s", f"target <= 10 s{note}")
    )

    big = setup.work / "big.yaml"
    combos = big_matrix(big)
    plan = timed(lambda: run([*ENVBUILD, "plan", "-m", str(big), "--format", "json"]), repeat=3)
    rows.append((f"plan, {combos} combinations", f"{plan:.2f} s", "target < 1 s"))
    rows.append(("envbuild --help start-up", f"{help_time:.3f} s", "target < 0.3 s"))


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
        wheels = work / "wheelhouse"
        wheels.mkdir()
        for wheel in Path(args.wheelhouse).glob("torch-2.13.0+cpu-*.whl"):
            shutil.copy(wheel, wheels / wheel.name)
        setup = Setup(work=work, wheels=wheels, base=args.base_image, ca_bundle=args.ca_bundle,
                      fetch=["--base-image", args.base_image, "--ca-bundle", args.ca_bundle],
                      repeat=args.repeat)  # fmt: skip
        cpu = cold_cpu(setup, rows)
        if args.cuda:
            cold_cuda(setup, rows)
        warm_figures(setup, rows, cpu)
    for image in run(["docker", "images", "-q", "--filter", f"label={LABEL}"]).stdout.split():
        run(["docker", "rmi", "-f", image], check=False)
    width = max(len(r[0]) for r in rows)
    print(f"{'measure'.ljust(width)}  {'envbuild':<28}  reference")
    for name, ours_text, reference in rows:
        print(f"{name.ljust(width)}  {ours_text:<28}  {reference}")


if __name__ == "__main__":
    main()
