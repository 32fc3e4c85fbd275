"""The engine interface: what envbuild asks of a container engine, and how to connect to one.

`Engine` is a Protocol. Its one real implementation, `envbuild.engine.docker_engine.DockerEngine`, is
the only module that imports docker; unit tests of the build, pipeline and publish logic use an
in-memory engine instead, and the real-engine tests prove the implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Protocol

from envbuild.core.errors import BadInput
from envbuild.core.models import AUTO, BUILDKIT, CLASSIC, BaseProbe, ProxySettings


@dataclass(frozen=True, kw_only=True)
class ImageInfo:
    """What the engine knows about one local image."""

    id: str
    tags: tuple[str, ...]
    labels: dict[str, str]
    platform: str = ""  # what its config records, as core.platforms names it (linux/arm64)
    layers: tuple[str, ...] = ()  # its file system's layers (diff ids), lowest first


@dataclass(frozen=True, kw_only=True)
class EngineInfo:
    """What `docker info` says about the engine."""

    version: str
    runtimes: tuple[str, ...]
    cdi_spec_dirs: tuple[str, ...]
    root_dir: str
    kind: str = "Docker"  # or "Podman" (its Docker-compatible API)
    api_version: str = ""
    rootless: bool = False
    address: str = ""  # as the user names it: DOCKER_HOST, or the default socket
    name: str = ""  # the engine's host name, as its info says
    platform: str = ""  # the machine it runs on, as core.platforms names it (linux/amd64)


@dataclass(frozen=True, kw_only=True)
class RunResult:
    """Exit code and output of a container that has been removed."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    seconds: float


class Engine(Protocol):
    """A connected container engine: build, run, inspect, tag, push, remove, probe.

    Every method raises EngineUnavailable, one line that names the engine and the request, when
    the engine cannot be reached or answers wrongly (EngineFailed: an error status, no answer
    in time, an answer cut short or not the engine's API); BuildFailed when a build's own step
    fails."""

    def describe(self) -> EngineInfo:
        """Version, runtimes and storage of the engine, for `envbuild doctor`."""
        ...

    def has_nvidia_runtime(self) -> bool:
        """True when the engine can hand GPUs to containers."""
        ...

    def image(self, ref: str) -> ImageInfo | None:
        """The local image `ref` (a tag or an id) names, or None."""
        ...

    def tag(self, image_id: str, ref: str) -> None:
        """Point `ref` (repo:tag) at the image."""
        ...

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
        """Build the context with `builder` (CLASSIC or BUILDKIT), streaming every output line;
        return the image id (BuildFailed). `platform` (linux/arm64): what the image is for,
        which its base must already be (neither builder checks a local base's platform).

        network=False: with the classic builder the RUN steps reach the host
        (`bridge_gateway(network=False)`) and nothing beyond it; with BuildKit, nothing at all.
        `proxy`: passed as Docker's predefined proxy build arguments (HTTP_PROXY, HTTPS_PROXY,
        NO_PROXY and lowercase), which the RUN steps see and which stay out of the history and
        the cache key. `secrets` (BuildKit only): id -> file, for `RUN --mount=type=secret`."""
        ...

    def builder_problem(self, builder: str) -> str:
        """ "" when `builder` (CLASSIC or BUILDKIT) works with this engine, else one line saying
        why not and what to use instead."""
        ...

    def load(self, archive: IO[bytes]) -> tuple[str, ...]:
        """Load a `docker save` archive (images with their configs, so with their platforms);
        return the ids of the images it held."""
        ...

    def push(
        self,
        image_id: str,
        ref: str,
        *,
        auth_config: dict[str, str] | None,
        on_line: Callable[[str], None],
    ) -> str:
        """Push the image as `ref` (host/repo:tag); return the digest the push reported."""
        ...

    def pull(
        self, ref: str, *, platform: str | None, auth_config: dict[str, str] | None
    ) -> ImageInfo | None:
        """Pull `ref` (host/repo:tag) for `platform`; the image, or None when the registry holds
        no such tag. EnvbuildError (one line naming the reference) when the pull fails otherwise."""
        ...

    def probe_base(self, ref: str, platform: str | None = None) -> BaseProbe:
        """Which OS a base image holds and which python3, if any; a missing one is pulled
        (for `platform`, else the engine's own)."""
        ...

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
        """Run `command` in a fresh container with `files` copied in; the container is removed.
        `shm_size` sizes /dev/shm (None: Docker's default, 64 MB)."""
        ...

    def remove_leftovers(self) -> int:
        """Remove the stopped containers a dead earlier run left; return how many."""
        ...

    def bridge_gateway(self, *, network: bool = True) -> str:
        """The host address a build's RUN steps reach: the default bridge's gateway, or with
        network=False that of the build network with no route off the host."""
        ...

    def remove_run_containers(self, run: str) -> int:
        """Force-remove every container run `run` made; return how many."""
        ...


def choose_builder(engine: Engine, wanted: str) -> str:
    """The builder to use: `wanted`, or for AUTO the classic builder where it works (an engine
    on this host: measured faster cold here, and proven by every fault and publish test), else
    BuildKit; BadInput (one line naming the engine and what to use instead) when none works."""
    if wanted == AUTO:
        problems: list[str] = []
        for name in (CLASSIC, BUILDKIT):
            problem = engine.builder_problem(name)
            if not problem:
                return name
            problems.append(f"{name}: {problem}")
        msg = f"no builder works with this engine ({'; '.join(problems)})"
        raise BadInput(msg)
    if wanted not in (BUILDKIT, CLASSIC):
        msg = f"--builder {wanted}: choose {AUTO}, {BUILDKIT} or {CLASSIC}"
        raise BadInput(msg)
    problem = engine.builder_problem(wanted)
    if problem:
        msg = f"--builder {wanted}: {problem}"
        raise BadInput(msg)
    return wanted


def connect() -> Engine:
    """The Docker engine DOCKER_HOST or the default socket names; EngineUnavailable if it does
    not answer within ENVBUILD_ENGINE_TIMEOUT seconds (default 120). docker-py is imported only
    here, so commands that need no engine never load it."""
    from envbuild.engine.docker_engine import DockerEngine

    return DockerEngine.connect()
