"""Issue 24's figures: what a registry stores, a push uploads and a node pulls when team images
share the framework's layers, beside today's other form of the same images, one install layer.

Run on a host set up by scripts/host-setup.sh (engine, .venv, ./wheelhouse, a bookworm base):

    .venv/bin/python benchmarks/layers.py [--base-image envbuild/base:bookworm]
                                          [--builder classic|buildkit] [--cuda] [--repeat N]

It locks three teams' images of the torch 2.13.0 CPU entry (torch from ./wheelhouse, the rest
from PyPI through the CA bundle, as the tests do), or with `--cuda` of the torch 2.4.1 CUDA 12.1
entry (torch and its nvidia-* wheels from PyPI: 5.8 GB images, about 20 GB of the engine's disk
at once): team A with `six==1.16.0`, team B with `tqdm`, and team A after a bump to
`six==1.17.0`. Each is built in two forms with one builder
(`--builder`, the classic one unless told), one after the other on the same engine:

- layered: the locks as `envbuild lock` writes them, whose `# via` annotations give the
  framework's part its own image, the framework image (templates/framework.j2), built once per
  key and found again by it, with the team's packages above it;
- one layer: the same locks without their annotations (as a lock written by hand), installed
  in one RUN, as every envbuild image was before.

For each form, from no image of the benchmark's and an empty registry (Debian's
docker-registry on a loopback port): A built cold (`--no-cache`, the build cache and its cache
mounts pruned first) and pushed; B built and pushed; A's bump built and pushed; then the engine
keeps A, forgets the bump (and BuildKit's whole build cache, which a node does not have) and
pulls it back. With `--repeat N`, team A's cold builds of both forms are first alternated N - 1
times more (single runs here vary by ±15% with the network): the median of each form's N is shown.
What the registry stores is the size of its blob folder; what a push uploaded is what it added
there (the engine uploads only the blobs the registry lacks); what a pull downloaded is the
sum of the blobs it reports as pulled, by the sizes in the image's manifest. Images are tagged
under envbuild-bench/ and removed at the end, with the registry's folder.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))
import run as cold_builds  # noqa: E402  (benchmarks/run.py: settle, as its cold builds do)

from tests.support.registry_server import RegistryServer  # noqa: E402

ENVBUILD = [sys.executable, "-m", "envbuild"]


@dataclass(frozen=True)
class Subject:
    """The entry the teams' images are of."""

    version: str
    cuda: str  # "cpu" or the CUDA version

    @property
    def tag(self) -> str:
        variant = "cpu" if self.cuda == "cpu" else "cu" + self.cuda.replace(".", "")
        return f"{self.version}-{variant}-py3.11-bookworm"

    @property
    def entry_id(self) -> str:
        return f"torch{self.tag}"


CPU = Subject("2.13.0", "cpu")  # torch from ./wheelhouse
CUDA = Subject("2.4.1", "12.1")  # torch and its nvidia-* wheels from PyPI
TEAMS = {"a": ["six==1.16.0"], "b": ["tqdm"], "a-bumped": ["six==1.17.0"]}
FORMS = ("one-layer", "layered")


def run(command: list[str], env: dict[str, str] | None = None) -> str:
    """stdout of `command`; exits with its output's tail when it fails."""
    done = subprocess.run(
        command, capture_output=True, text=True, check=False, env={**os.environ, **(env or {})}
    )
    if done.returncode != 0:
        sys.exit(f"benchmark: {' '.join(command[:5])} ... failed:\n{done.stderr[-3000:]}")
    return done.stdout


def forget() -> None:
    """Remove this benchmark's images (the classic builder's cache is their layers)."""
    subprocess.run(
        ["sh", "-c", "docker images -q 'envbuild-bench/*' | sort -u | xargs -r docker rmi -f;"
         " docker images -q 'envbuild/framework' | sort -u | xargs -r docker rmi -f;"
         " docker images -q '127.0.0.1:*/envbuild-bench/*' | sort -u | xargs -r docker rmi -f"],
        capture_output=True, check=False,
    )  # fmt: skip


def matrix(folder: Path, team: str, subject: Subject) -> Path:
    """The torch CPU entry with `team`'s packages, in a folder of its own (its lock beside)."""
    path = folder / team / "team.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "defaults": {
            "python": "3.11",
            "os": "bookworm",
            "packages": TEAMS[team],
            "repository": f"envbuild-bench/layers-{team}-{{framework}}",
        },
        "include": [
            {"framework": "torch", "framework_version": subject.version, "cuda": subject.cuda}
        ],
    }
    path.write_text(json.dumps(document))  # JSON is YAML
    return path


def without_annotations(lock: Path) -> None:
    """The lock as one written by hand: no `# via` lines, so it installs in one RUN."""
    lines = lock.read_text().splitlines(keepends=True)
    lock.write_text("".join(line for line in lines if not line.startswith("    #")))


def blob_bytes(registry: RegistryServer) -> int:
    """Bytes in the registry's blob store."""
    root = registry.tmp_dir / "storage" / "docker" / "registry" / "v2" / "blobs"
    return sum(p.stat().st_size for p in root.rglob("data")) if root.exists() else 0


def manifest_layers(registry: RegistryServer, repository: str, tag: str) -> dict[str, int]:
    """The image's layer blobs (short digest: compressed bytes) as its manifest lists them."""
    request = urllib.request.Request(
        f"{registry.url}/v2/{repository}/manifests/{tag}",
        headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
    )
    with urllib.request.urlopen(request, timeout=30) as answer:
        manifest = json.load(answer)
    return {layer["digest"][7:19]: layer["size"] for layer in manifest["layers"]}


@dataclass
class Form:
    """One form's figures."""

    cold: float = 0.0  # the median of the cold builds of A
    colds: list[float] = field(default_factory=list)  # each cold build of A, in order
    size: int = 0
    stored_one: int = 0
    stored_two: int = 0
    second_push: int = 0
    first_push: int = 0
    bump_build: float = 0.0
    bump_push: int = 0
    bump_pull: int = 0
    layers: int = 0
    # A's layers bottom up: (short digest, compressed bytes, also in B's image)
    layer_sizes: list[tuple[str, int, bool]] = field(default_factory=list)
    # A's steps that wrote bytes, newest first: (uncompressed bytes, the step)
    steps: list[tuple[int, str]] = field(default_factory=list)


def steps(image: str) -> list[tuple[int, str]]:
    """The image's steps that wrote bytes, newest first: uncompressed size, the step's command."""
    listing = run(["docker", "image", "history", "--no-trunc", "--human=false",
                   "--format", "{{.Size}}\t{{.CreatedBy}}", image])  # fmt: skip
    found = []
    for line in listing.splitlines():
        size, _, command = line.partition("\t")
        if size.isdigit() and int(size) > 0:
            found.append((int(size), " ".join(command.split())))
    return found


def build(path: Path, common: list[str], *, cold: bool) -> float:
    start = time.perf_counter()
    run([*ENVBUILD, "build", "-m", str(path), *common, "--locked", "--no-smoke",
         *(["--no-cache"] if cold else [])])  # fmt: skip
    return time.perf_counter() - start


def push(registry: RegistryServer, team: str, tag: str) -> tuple[str, int]:
    """Push team's image; its registry name and the bytes the registry gained."""
    local = f"envbuild-bench/layers-{team}-torch:{tag}"
    remote = f"{registry.host}/envbuild-bench/layers-{team}-torch"
    before = blob_bytes(registry)
    run(["docker", "tag", local, f"{remote}:{tag}"])
    run(["docker", "push", f"{remote}:{tag}"])
    return remote, blob_bytes(registry) - before


def cold_build(path: Path, common: list[str]) -> float:
    """Team A's cold build from no image of the benchmark's and an empty build cache:
    BuildKit's cache mounts (uv's cache, which would hold the other form's wheels) outlive
    --no-cache."""
    forget()
    run(["docker", "builder", "prune", "-af"])
    # The last build's layers are still being written back and the removed images' blocks
    # freed: a build started now would pay for them, and the forms alternate, so each would
    # pay for the other's.
    cold_builds.settle()
    return build(path, common, cold=True)


def earlier_colds(work: Path, common: list[str], rounds: int) -> dict[str, list[float]]:
    """Team A's cold builds of both forms, alternated `rounds` times, before the forms are
    measured (whose own cold build is the last of each form's)."""
    found: dict[str, list[float]] = {form: [] for form in FORMS}
    for _ in range(rounds):
        for form in FORMS:
            found[form].append(cold_build(work / form / "a" / "team.yaml", common))
    forget()
    return found


def measure(form: str, work: Path, common: list[str], tag: str, colds: list[float]) -> Form:
    figures = Form()
    registry = RegistryServer(work / f"registry-{form}")
    try:
        paths = {team: work / form / team / "team.yaml" for team in TEAMS}
        figures.colds = [*colds, cold_build(paths["a"], common)]
        figures.cold = statistics.median(figures.colds)
        image = json.loads(
            run(["docker", "image", "inspect", f"envbuild-bench/layers-a-torch:{tag}"])
        )
        figures.size = image[0]["Size"]
        figures.layers = len(image[0]["RootFS"]["Layers"])
        figures.steps = steps(f"envbuild-bench/layers-a-torch:{tag}")
        _, figures.first_push = push(registry, "a", tag)
        figures.stored_one = blob_bytes(registry)
        build(paths["b"], common, cold=False)
        _, figures.second_push = push(registry, "b", tag)
        figures.stored_two = blob_bytes(registry)
        ours = manifest_layers(registry, "envbuild-bench/layers-a-torch", tag)
        theirs = manifest_layers(registry, "envbuild-bench/layers-b-torch", tag)
        figures.layer_sizes = [(short, size, short in theirs) for short, size in ours.items()]
        figures.bump_build = build(paths["a-bumped"], common, cold=False)
        remote, figures.bump_push = push(registry, "a-bumped", tag)
        # A node that holds A: the bump forgotten, then pulled from the registry. BuildKit's
        # cache holds the layers it built (the engine would find them there), and a node has
        # no build cache: dropped first.
        subprocess.run(["docker", "rmi", "-f", f"{remote}:{tag}",
                        f"envbuild-bench/layers-a-bumped-torch:{tag}"],
                       capture_output=True, check=False)  # fmt: skip
        run(["docker", "builder", "prune", "-af"])
        pulled = run(["docker", "pull", f"{remote}:{tag}"])
        sizes = manifest_layers(registry, "envbuild-bench/layers-a-bumped-torch", tag)
        fetched = re.findall(r"^([0-9a-f]{12}): Pull complete", pulled, re.MULTILINE)
        figures.bump_pull = sum(sizes.get(short, 0) for short in fetched)
    finally:
        registry.stop()
        forget()
    return figures


def positive(text: str) -> int:
    """--repeat's value: a whole number of at least 1."""
    if not text.isdigit() or int(text) < 1:
        msg = f"{text!r} is not a whole number of at least 1"
        raise argparse.ArgumentTypeError(msg)
    return int(text)


def runs(seconds: list[float]) -> str:
    """Each run's seconds, when there were several."""
    return f" ({', '.join(f'{value:.1f}' for value in seconds)})" if len(seconds) > 1 else ""


def judged(ratio: float, limit: float, *, percent: bool = False) -> str:
    """`ratio` against its target `limit`, to three figures, and whether it is met."""
    shown = f"{100 * ratio:.2f}%" if percent else f"{ratio:.3f}x"
    return f"{shown}, {'met' if ratio <= limit else 'MISSED'}"


def mb(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-image", default="envbuild/base:bookworm")
    parser.add_argument("--ca-bundle", default="/etc/ssl/certs/ca-certificates.crt")
    parser.add_argument("--builder", choices=("classic", "buildkit"), default="classic")
    parser.add_argument(
        "--repeat", type=positive, default=1, metavar="N",
        help="team A's cold builds of both forms, alternated N times: the median is shown",
    )  # fmt: skip
    parser.add_argument(
        "--cuda", action="store_true",
        help=f"the torch {CUDA.version} CUDA {CUDA.cuda} entry (from PyPI) instead of the CPU one",
    )  # fmt: skip
    options = parser.parse_args()
    subject = CUDA if options.cuda else CPU
    common = [
        "--base-image", options.base_image, "--wheelhouse", str(REPO / "wheelhouse"),
        "--ca-bundle", options.ca_bundle, "--index-url", "https://pypi.org/simple",
    ]  # fmt: skip
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="envbuild-bench-layers-") as tmp:
        work = Path(tmp)
        # A store of its own: no record of the user's builds makes a framework image found.
        env = {"XDG_CACHE_HOME": str(work / "cache"), "XDG_DATA_HOME": str(work / "data")}
        os.environ.update(env)
        for team in TEAMS:
            path = matrix(work / "layered", team, subject)
            run([*ENVBUILD, "lock", "-m", str(path), *common])
            one = matrix(work / "one-layer", team, subject)
            lock = path.parent / "team.lock" / f"{subject.entry_id}.txt"
            (one.parent / "team.lock").mkdir()
            copied = one.parent / "team.lock" / lock.name
            copied.write_text(lock.read_text())
            without_annotations(copied)
        building = [*common, "--builder", options.builder]
        colds = earlier_colds(work, building, options.repeat - 1)
        results = {form: measure(form, work, building, subject.tag, colds[form]) for form in FORMS}
    old, new = results["one-layer"], results["layered"]
    rows = [
        ("layers in the image", f"{new.layers}", f"{old.layers}", f"<= 12: {'met' if new.layers <= 12 else 'MISSED'}"),
        ("cold build of team A (--no-cache)" + (", median" if len(new.colds) > 1 else ""),
         f"{new.cold:.1f} s" + runs(new.colds), f"{old.cold:.1f} s" + runs(old.colds),
         f"<= 1.05x: {judged(new.cold / old.cold, 1.05)}"),
        ("image size", mb(new.size), mb(old.size), f"<= 1.01x: {judged(new.size / old.size, 1.01)}"),
        ("registry after A, then after A and B", f"{mb(new.stored_one)}, {mb(new.stored_two)}",
         f"{mb(old.stored_one)}, {mb(old.stored_two)}",
         f"<= 1.1x: {judged(new.stored_two / new.stored_one, 1.1)} (one layer {old.stored_two / old.stored_one:.2f}x)"),
        ("B's push against A's", mb(new.second_push), mb(old.second_push),
         f"<= 5%: {judged(new.second_push / new.first_push, 0.05, percent=True)} (one layer {100 * old.second_push / old.first_push:.0f}%)"),
        ("rebuild after bumping six against A's cold build", f"{new.bump_build:.1f} s",
         f"{old.bump_build:.1f} s",
         f"<= 0.15x: {judged(new.bump_build / new.cold, 0.15)} (one layer {old.bump_build / old.cold:.2f}x)"),
        ("the bump's push against the image", mb(new.bump_push), mb(old.bump_push),
         f"<= 5%: {judged(new.bump_push / new.first_push, 0.05, percent=True)} (one layer {100 * old.bump_push / old.first_push:.0f}%)"),
        ("the bump's pull by a node holding A", mb(new.bump_pull), mb(old.bump_pull),
         f"<= 5%: {judged(new.bump_pull / new.first_push, 0.05, percent=True)} (one layer {100 * old.bump_pull / old.first_push:.0f}%)"),
    ]  # fmt: skip
    print(f"entry: {subject.entry_id}, builder: {options.builder}")
    print("| measure | layered | one layer | target |\n| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    for form, figures in results.items():
        print(f"{form}: team A's layers bottom up, compressed as the registry holds them"
              " (* also in B's image):")  # fmt: skip
        for short, size, shared in figures.layer_sizes:
            print(f"  {short}  {mb(size):>12}  {'*' if shared else ''}")
        print(f"{form}: team A's steps that wrote bytes, newest first, uncompressed:")
        for size, command in figures.steps:
            print(f"  {mb(size):>12}  {command[:110]}")
    print(f"benchmark: {time.perf_counter() - started:.0f} s in all")


if __name__ == "__main__":
    main()
