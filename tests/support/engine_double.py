"""An in-memory engine for unit tests of the build, pipeline and publish logic.

It is a test double for the engine boundary only: images are records with ids, tags and labels,
builds return new ids, runs and base probes return what the test scripted. Nothing here says
anything about Docker itself; the integration tier proves the real `DockerEngine`.
"""

from __future__ import annotations

import hashlib
import json
import re
import tarfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from envbuild.core.errors import (
    BadInput,
    BuildFailed,
    EngineFailed,
    EngineUnavailable,
    EnvbuildError,
)
from envbuild.core.models import BUILDKIT, CLASSIC, BaseProbe, ProxySettings
from envbuild.core.platforms import AMD64
from envbuild.engine.interface import EngineInfo, ImageInfo, RunResult


@dataclass
class Image:
    """One image the engine holds."""

    id: str
    tags: list[str]
    labels: dict[str, str]
    platform: str = AMD64
    layers: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Build:
    """What one call of `build` was given (the context directory is gone after the build)."""

    dockerfile: str
    files: tuple[str, ...]
    tag: str | None
    labels: dict[str, str]
    build_args: dict[str, str]
    network: bool
    target: str | None
    no_cache: bool
    proxy: ProxySettings | None = None
    builder: str = CLASSIC
    secrets: dict[str, bytes] = field(default_factory=dict)  # id -> what the file held then
    platform: str | None = None


@dataclass(frozen=True, kw_only=True)
class Run:
    """What one call of `run` was given."""

    image_id: str
    command: list[str]
    files: tuple[str, ...]
    gpus: bool
    shm_size: str | None = None
    environment: dict[str, str] | None = None


def _normalize(ref: str) -> str:
    """`repo` means `repo:latest`, as for Docker."""
    return ref if ":" in ref.rsplit("/", 1)[-1] else f"{ref}:latest"


@dataclass
class InMemoryEngine:
    """Implements envbuild.engine.interface.Engine over dictionaries; every call is recorded."""

    nvidia: bool = False
    # Goes into the id of every image it builds: two engines never build the same id, as two real
    # ones do not (the image's config holds its creation time); a base loaded into both is one id.
    name: str = "engine"
    platform: str = AMD64  # the machine the engine runs on
    images: dict[str, Image] = field(default_factory=dict)
    bases: dict[str, BaseProbe] = field(default_factory=dict)
    outputs: dict[str, RunResult] = field(default_factory=dict)  # image id or tag -> result
    # image id -> what the engine answers when its container cannot start (EngineFailed)
    unstartable: dict[str, str] = field(default_factory=dict)
    failing_builds: dict[str, str] = field(default_factory=dict)  # tag -> build error
    unavailable: bool = False  # every build raises EngineUnavailable, as a dead engine would
    builds: list[Build] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    pushes: list[tuple[str, str]] = field(default_factory=list)  # (image id, reference)
    # What registries hold, by reference, for `pull`: a reference named here with None fails to
    # pull (an unreachable registry); one not named is no such tag.
    remote: dict[str, Image | None] = field(default_factory=dict)
    pulls: list[str] = field(default_factory=list)
    probes: list[str] = field(default_factory=list)
    gateway: str = "127.0.0.1"  # where envbuild's build server listens during a build
    # builder -> "" where it works with this engine, else why not (Engine.builder_problem).
    support: dict[str, str] = field(default_factory=lambda: {BUILDKIT: "", CLASSIC: ""})
    # Called with the build arguments while a build runs, as its RUN steps would run then.
    during_build: Callable[[dict[str, str]], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    # -- what tests arrange -------------------------------------------------

    def add_image(
        self,
        seed: str,
        *,
        tags: tuple[str, ...] = (),
        labels: dict[str, str] | None = None,
        platform: str = AMD64,
    ) -> str:
        """Put an image in the engine (as `docker build`/`pull` elsewhere would); return its id."""
        image_id = "sha256:" + hashlib.sha256(seed.encode()).hexdigest()
        with self._lock:
            self.images[image_id] = Image(
                id=image_id, tags=[], labels=dict(labels or {}), platform=platform
            )
        for tag in tags:
            self.tag(image_id, tag)
        return image_id

    def add_base(
        self,
        ref: str,
        *,
        codename: str = "bookworm",
        python: str | None = "3.11",
        platform: str = AMD64,
    ) -> BaseProbe:
        """A local base image and what probing it finds."""
        image_id = self.add_image(f"base {ref} {platform}", tags=(ref,), platform=platform)
        self.bases[ref] = BaseProbe(
            ref=ref, image_id=image_id, os_id="debian", os_codename=codename, python=python,
            platform=platform,
        )  # fmt: skip
        return self.bases[ref]

    def remove_image(self, ref: str) -> None:
        """Delete an image (`docker rmi`)."""
        image = self.image(ref)
        assert image is not None, f"no image {ref}"
        with self._lock:
            del self.images[image.id]

    # -- the Engine protocol ------------------------------------------------

    def describe(self) -> EngineInfo:
        runtimes = ("nvidia", "runc") if self.nvidia else ("runc",)
        return EngineInfo(
            version="in-memory", runtimes=runtimes, cdi_spec_dirs=(), root_dir="",
            platform=self.platform,
        )  # fmt: skip

    def has_nvidia_runtime(self) -> bool:
        return self.nvidia

    def builder_problem(self, builder: str) -> str:
        return self.support[builder]

    def image(self, ref: str) -> ImageInfo | None:
        with self._lock:
            found = self.images.get(ref) or next(
                (i for i in self.images.values() if _normalize(ref) in i.tags), None
            )
            if found is None:
                return None
            return ImageInfo(
                id=found.id, tags=tuple(found.tags), labels=dict(found.labels),
                platform=found.platform, layers=found.layers,
            )  # fmt: skip

    def tag(self, image_id: str, ref: str) -> None:
        ref = _normalize(ref)
        with self._lock:
            for image in self.images.values():  # a tag names one image: it moves
                if ref in image.tags:
                    image.tags.remove(ref)
            self.images[image_id].tags.append(ref)

    def build(
        self,
        context_dir: Path,
        *,
        tag: str | None,
        labels: dict[str, str],
        build_args: dict[str, str],
        on_line: Callable[[str], None],
        network: bool = True,
        target: str | None = None,
        no_cache: bool = False,
        proxy: ProxySettings | None = None,
        builder: str = CLASSIC,
        secrets: Mapping[str, Path] | None = None,
        platform: str | None = None,
    ) -> str:
        dockerfile = (context_dir / "Dockerfile").read_text(encoding="utf-8")
        files = tuple(sorted(str(p.relative_to(context_dir)) for p in context_dir.rglob("*")))
        held = {name: path.read_bytes() for name, path in (secrets or {}).items()}
        with self._lock:
            self.builds.append(
                Build(
                    dockerfile=dockerfile, files=files, tag=tag, labels=dict(labels),
                    build_args=dict(build_args), network=network, target=target, no_cache=no_cache,
                    proxy=proxy, builder=builder, secrets=held, platform=platform,
                )
            )  # fmt: skip
            number = len(self.builds)
        if self.unavailable:
            msg = "lost the Docker engine during the build: connection refused"
            raise EngineUnavailable(msg)
        if self.during_build is not None:
            self.during_build(dict(build_args))
        steps = [line for line in dockerfile.splitlines() if line[:1].isalpha()]
        for index, step in enumerate(steps, 1):
            on_line(f"Step {index}/{len(steps)} : {step}")
        if tag is not None and tag in self.failing_builds:
            on_line(f"ERROR: {self.failing_builds[tag]}")
            raise BuildFailed(self.failing_builds[tag])
        # The image carries its Dockerfile's LABELs and the build's, as a real engine's does.
        # As both of Docker's builders do with a local base: the image is labelled with the
        # base's platform, whatever `platform` asked for.
        base = self.image(next(iter(re.findall(r"^FROM\s+(\S+)", dockerfile, re.M)), ""))
        # As a real engine's: the base's labels and layers, then a layer per RUN and COPY.
        steps_made = re.findall(r"^(?:RUN|COPY|ADD)\b.*$", dockerfile, re.M)
        image_id = self.add_image(
            f"build {number} on {self.name}\n{dockerfile}",
            labels={
                **(base.labels if base is not None else {}),
                **dockerfile_labels(dockerfile),
                **labels,
            },
            platform=base.platform if base is not None else AMD64,
        )
        with self._lock:
            self.images[image_id].layers = (
                *(base.layers if base is not None else ()),
                *(hashlib.sha256(f"{image_id} {step}".encode()).hexdigest() for step in steps_made),
            )
        if tag is not None:
            self.tag(image_id, tag)
        return image_id

    def load(self, archive: IO[bytes]) -> tuple[str, ...]:
        """Reads the archive's manifest and configs as `docker load` does."""
        loaded = []
        with tarfile.open(fileobj=archive, mode="r|") as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}  # type: ignore[union-attr]
        for item in json.loads(members["manifest.json"]):
            config = json.loads(members[item["Config"]])
            platform = f"{config['os']}/{config['architecture']}"
            loaded.append(
                self.add_image(
                    f"load {hashlib.sha256(members[item['Config']]).hexdigest()}",
                    tags=tuple(item.get("RepoTags") or ()),
                    labels=dict(config.get("config", {}).get("Labels") or {}),
                    platform=platform,
                )
            )
        return tuple(loaded)

    def push(
        self,
        image_id: str,
        ref: str,
        *,
        auth_config: dict[str, str] | None,
        on_line: Callable[[str], None],
    ) -> str:
        if image_id not in self.images:
            msg = f"push of {ref} failed: no such image {image_id}"
            raise EnvbuildError(msg)
        with self._lock:
            self.pushes.append((image_id, ref))
        # One image, one manifest: every reference pushed from it has the same digest.
        return "sha256:" + hashlib.sha256(f"manifest {image_id}".encode()).hexdigest()

    def pull(
        self, ref: str, *, platform: str | None, auth_config: dict[str, str] | None
    ) -> ImageInfo | None:
        with self._lock:
            self.pulls.append(ref)
        if ref not in self.remote:
            return None
        held = self.remote[ref]
        if held is None:
            msg = f"pull of {ref} failed: the registry cannot be reached"
            raise EnvbuildError(msg)
        with self._lock:
            self.images[held.id] = Image(
                id=held.id, tags=[], labels=dict(held.labels), platform=held.platform,
                layers=held.layers,
            )  # fmt: skip
        self.tag(held.id, ref)
        return self.image(ref)

    def probe_base(self, ref: str, platform: str | None = None) -> BaseProbe:
        with self._lock:
            self.probes.append(ref)
        if ref not in self.bases:
            msg = f"base image {ref} is not in the local engine and cannot be pulled"
            raise BadInput(msg)
        return self.bases[ref]

    def run(
        self,
        image: str,
        command: list[str],
        *,
        timeout: float,
        files: dict[str, bytes] | None = None,
        gpus: bool = False,
        shm_size: str | None = None,
        environment: dict[str, str] | None = None,
    ) -> RunResult:
        found = self.image(image)
        if found is None:
            msg = f"image {image} is not in the local engine; build or pull it first"
            raise EnvbuildError(msg)
        with self._lock:
            self.runs.append(
                Run(
                    image_id=found.id,
                    command=list(command),
                    files=tuple(files or ()),
                    gpus=gpus,
                    shm_size=shm_size,
                    environment=None if environment is None else dict(environment),
                )
            )
        if found.id in self.unstartable:
            raise EngineFailed(self.unstartable[found.id])
        for key in (found.id, *found.tags):
            if key in self.outputs:
                return self.outputs[key]
        return RunResult(
            exit_code=127, stdout="", stderr=f"nothing scripted for {image}", timed_out=False,
            seconds=0.0,
        )  # fmt: skip

    def remove_leftovers(self) -> int:
        return 0  # the double leaves no containers behind

    def bridge_gateway(self, *, network: bool = True) -> str:
        return self.gateway

    def remove_run_containers(self, run: str) -> int:
        return 0


_LABEL_PAIR = re.compile(r'([A-Za-z0-9._-]+)="((?:[^"\\]|\\.)*)"')


def dockerfile_labels(dockerfile: str) -> dict[str, str]:
    """The `key="value"` pairs of a Dockerfile's LABEL instructions (continuations included),
    the last one of each key winning, as the engine gives them to the image."""
    found: dict[str, str] = {}
    instruction = ""
    for line in dockerfile.splitlines():
        instruction += line.rstrip("\\") + " "
        if line.endswith("\\"):
            continue
        if instruction.startswith("LABEL "):
            found.update(_LABEL_PAIR.findall(instruction))
        instruction = ""
    return found
