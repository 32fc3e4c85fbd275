"""The docker-py implementation of the engine: the only module that imports docker."""

from __future__ import annotations

import io
import ipaddress
import json
import logging
import re
import tarfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import docker
import docker.errors
import requests
import urllib3.exceptions
from docker.types import DeviceRequest

from envbuild.core.errors import BadInput, BuildFailed, EngineUnavailable, EnvbuildError
from envbuild.core.interrupt import RUN_LABEL, RUN_PLACE_LABEL, run_id, run_place
from envbuild.core.labels import INSTALL_STAGE, STAGE
from envbuild.core.models import BaseProbe, ProxySettings
from envbuild.core.names import split_tag
from envbuild.engine.interface import EngineInfo, ImageInfo, RunResult
from envbuild.engine.leftovers import left_behind

log = logging.getLogger(__name__)

# The build network of --offline builds (`_offline_network`).
OFFLINE_NETWORK = "envbuild-offline"

_PROBE_SCRIPT = (
    '. /etc/os-release 2>/dev/null; echo "os=${ID:-unknown} ${VERSION_CODENAME:-unknown}"; '
    "if command -v python3 >/dev/null 2>&1; then "
    "python3 -c 'import sys; print(\"python=%d.%d\" % sys.version_info[:2])'; fi"
)

# How many times a push tags again after a concurrent publisher dropped the shared local tag,
# and how many times it tries again after the registry answered a transient error.
_PUSH_TRIES = 4
# Seconds before the first retry of a push the registry failed; doubled at each further try.
_PUSH_BACKOFF = 1.0
# How the engine says the tag to push is gone: the tag alone, or every tag of the repository.
_NO_SUCH_TAG = ("tag does not exist", "An image does not exist locally with the tag")
# How the engine reports a registry's answer that retrying can fix (429, 5xx): the engine itself
# does not retry an unexpected status, and a registry under concurrent commits of the same blob
# answers 500 to one of them.
_TRANSIENT_STATUS = re.compile(r"unexpected HTTP status: (429|5\d\d)\b")


class _TagVanished(Exception):
    """The local tag a push needs was removed before the engine read it."""


class _RegistryBusy(Exception):
    """The registry answered the engine's push with a status that retrying can fix."""


def ipv4_gateway(network_attrs: dict[str, Any]) -> str | None:
    """The IPv4 gateway of a network as the engine inspects it. An engine that adopted an
    existing bridge (docker0 left by an earlier dockerd) lists only the subnet; its gateway is
    then the subnet's first address, as Docker's IPAM assigns it."""
    for config in (network_attrs.get("IPAM") or {}).get("Config") or []:
        gateway = str(config.get("Gateway") or "")
        if gateway and ":" not in gateway:
            return gateway
        try:
            subnet = ipaddress.ip_network(str(config.get("Subnet") or ""), strict=False)
        except ValueError:
            continue
        if subnet.version == 4 and subnet.num_addresses > 2:
            return str(subnet.network_address + 1)
    return None


class DockerEngine:
    """A connected Docker engine, driven through docker-py (classic builder API)."""

    def __init__(self, client: docker.DockerClient) -> None:
        self._client = client

    @classmethod
    def connect(cls) -> DockerEngine:
        """Connect using DOCKER_HOST or the default socket; EngineUnavailable if it does not answer."""
        try:
            client = docker.from_env(timeout=600)
            client.ping()
        except (docker.errors.DockerException, requests.RequestException) as exc:
            msg = (
                "cannot reach the Docker engine (DOCKER_HOST or /var/run/docker.sock): "
                f"{_short(exc)}; start dockerd (e.g. `sudo dockerd &`) or set DOCKER_HOST"
            )
            raise EngineUnavailable(msg) from exc
        return cls(client)

    def describe(self) -> EngineInfo:
        """Version, runtimes and storage of the engine, for `envbuild doctor`."""
        info = self._client.info()
        return EngineInfo(
            version=str(self._client.version().get("Version", "unknown")),
            runtimes=tuple(sorted(info.get("Runtimes") or {})),
            cdi_spec_dirs=tuple(info.get("CDISpecDirs") or ()),
            root_dir=str(info.get("DockerRootDir", "")),
        )

    def has_nvidia_runtime(self) -> bool:
        """True when the engine has the NVIDIA container runtime to hand GPUs to containers."""
        # Not CDISpecDirs: recent engines list /etc/cdi whether or not a GPU spec is in it.
        runtimes = self._client.info().get("Runtimes") or {}
        return "nvidia" in runtimes

    # Images.

    def image(self, ref: str) -> ImageInfo | None:
        """The local image `ref` names, or None."""
        try:
            image = self._client.images.get(ref)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            if exc.status_code in (400, 404):  # an invalid reference cannot exist locally
                return None
            raise
        return _info(image)

    def tag(self, image_id: str, ref: str) -> None:
        """Point `ref` (repo:tag) at the image."""
        repository, tag = split_tag(ref)
        self._client.images.get(image_id).tag(repository, tag or "latest")

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
    ) -> str:
        """Build with the classic builder, streaming every output line; return the image id."""
        # Docker's predefined proxy arguments: no ARG needed, kept out of `docker history`
        # and of the cache key (docs.docker.com/build/building/variables/#predefined-build-args).
        build_args = {**(proxy.environment() if proxy is not None else {}), **build_args}
        image_id: str | None = None
        last_lines: list[str] = []
        try:
            stream: Iterator[dict[str, Any]] = self._client.api.build(
                path=str(context_dir),
                tag=tag,
                labels=labels,
                buildargs=build_args,
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
                network_mode=None if network else self._offline_network(),
                target=target,
                nocache=no_cache,
            )
            for chunk in stream:
                if "stream" in chunk:
                    for line in str(chunk["stream"]).splitlines():
                        on_line(line)
                        if line.strip():
                            last_lines = [*last_lines[-19:], line]
                elif "error" in chunk:
                    message = str(chunk["error"]).strip()
                    on_line(f"ERROR: {message}")
                    raise BuildFailed(_build_error(message, last_lines))
                elif "aux" in chunk and "ID" in chunk["aux"]:
                    image_id = str(chunk["aux"]["ID"])
        except docker.errors.APIError as exc:
            msg = f"the engine refused the build: {_short(exc)}"
            raise BuildFailed(msg) from exc
        except _LOST as exc:
            raise _lost(exc, "during the build") from exc
        if image_id is None:
            raise BuildFailed(_build_error("the engine reported no image id", last_lines))
        return image_id

    def bridge_gateway(self, *, network: bool = True) -> str:
        """The gateway of the default bridge, or (network=False) of envbuild's internal network,
        made if missing: the host address a build's RUN steps can reach."""
        name = "bridge" if network else self._offline_network()
        try:
            attrs = self._client.networks.get(name).attrs
        except docker.errors.DockerException as exc:
            msg = f"cannot inspect the Docker network {name!r}: {_short(exc)}"
            raise BuildFailed(msg) from exc
        except _LOST as exc:
            raise _lost(exc) from exc
        gateway = ipv4_gateway(attrs)
        if gateway:
            return gateway
        msg = (
            f"the Docker network {name!r} has no IPv4 gateway; envbuild serves a build's files "
            "there: check dockerd's --bip/--bridge settings"
        )
        raise BuildFailed(msg)

    def _offline_network(self) -> str:
        """envbuild's internal bridge network: an --offline build reaches the host's gateway
        address (envbuild's build server) and nothing beyond the host. Made if missing."""
        try:
            found = self._client.networks.list(names=[OFFLINE_NETWORK])
            if not any(n.name == OFFLINE_NETWORK for n in found):
                try:
                    self._client.networks.create(
                        OFFLINE_NETWORK, driver="bridge", internal=True,
                        labels={"org.envbuild.network": "offline"},
                    )  # fmt: skip
                except docker.errors.APIError as exc:
                    if exc.status_code != 409:  # 409: another run made it first
                        raise
        except docker.errors.DockerException as exc:
            msg = f"cannot make the offline build network {OFFLINE_NETWORK!r}: {_short(exc)}"
            raise BuildFailed(msg) from exc
        except _LOST as exc:
            raise _lost(exc) from exc
        return OFFLINE_NETWORK

    def import_rootfs(self, tar_stream: IO[bytes], ref: str, changes: list[str]) -> str:
        """Import a root filesystem tarball as image `ref`; return its id."""
        repository, tag = split_tag(ref)
        result = self._client.api.import_image_from_stream(
            tar_stream, repository=repository, tag=tag or "latest", changes=changes
        )
        text = result if isinstance(result, str) else json.dumps(result)
        image = self.image(ref)
        if image is None:
            msg = f"docker import of {ref} produced no image: {text[-300:]}"
            raise EnvbuildError(msg)
        return image.id

    def push(
        self,
        image_id: str,
        ref: str,
        *,
        auth_config: dict[str, str] | None,
        on_line: Callable[[str], None],
    ) -> str:
        """Tag the image as `ref` (repo:tag), push it, drop the local tag; return the pushed digest.

        Two publishers of one image on one engine share the local tag `ref`: the first to finish
        drops it, and the other's push, if it had not yet begun, finds no such tag. That push
        tags again and retries; each publisher drops the tag once, so a few tries suffice.
        A registry's 429 or 5xx is retried too, after a backoff: the engine retries neither,
        and the layers pushed already are not uploaded again.
        """
        vanished = busy = 0
        while True:
            try:
                return self._push_once(image_id, ref, auth_config=auth_config, on_line=on_line)
            except _TagVanished:
                vanished += 1
                if vanished >= _PUSH_TRIES:
                    msg = (
                        f"push of {ref} failed: the local tag was removed {_PUSH_TRIES} times "
                        "while pushing (another process untagging it?); publish again"
                    )
                    raise EnvbuildError(msg) from None
                log.info("the local tag %s was removed by another publisher; tagging again", ref)
            except _RegistryBusy as exc:
                busy += 1
                if busy >= _PUSH_TRIES:
                    msg = (
                        f"{_push_failure(ref, str(exc))} ({_PUSH_TRIES} tries); publish again later"
                    )
                    raise EnvbuildError(msg) from None
                wait = _PUSH_BACKOFF * 2 ** (busy - 1)
                log.warning("push of %s: %s; retrying in %g s", ref, exc, wait)
                on_line(f"the registry answered {exc}; retrying in {wait:g} s")
                time.sleep(wait)

    def _push_once(
        self,
        image_id: str,
        ref: str,
        *,
        auth_config: dict[str, str] | None,
        on_line: Callable[[str], None],
    ) -> str:
        repository, tag = split_tag(ref)
        tag = tag or "latest"
        self.tag(image_id, ref)
        digest: str | None = None
        try:
            stream = self._client.api.push(
                repository, tag=tag, stream=True, decode=True, auth_config=auth_config
            )
            for chunk in stream:
                if "error" in chunk:
                    error = str(chunk["error"]).strip()
                    if error.startswith(_NO_SUCH_TAG):
                        raise _TagVanished(error)
                    if _TRANSIENT_STATUS.search(error):
                        raise _RegistryBusy(error)
                    raise EnvbuildError(_push_failure(ref, error))
                if "status" in chunk and chunk.get("id") is None:
                    on_line(str(chunk["status"]))
                aux = chunk.get("aux") or {}
                if "Digest" in aux:
                    digest = str(aux["Digest"])
        except docker.errors.NotFound as exc:
            raise _TagVanished(str(exc)) from exc
        except docker.errors.APIError as exc:
            raise EnvbuildError(_push_failure(ref, _short(exc))) from exc
        except _LOST as exc:
            raise _lost(exc, f"while pushing {ref}") from exc
        finally:
            self._untag(image_id, ref)
        if digest is None:
            msg = f"push of {ref} reported no digest"
            raise EnvbuildError(msg)
        return digest

    def _untag(self, image_id: str, ref: str) -> None:
        """Drop the local tag `ref` unless it is the image's last name; gone already is fine."""
        image = self.image(image_id)
        if image is None or ref not in image.tags or not any(t != ref for t in image.tags):
            return
        try:
            self._client.images.remove(ref, noprune=True)
        except docker.errors.NotFound:
            pass  # another publisher of the same image dropped it first
        except docker.errors.DockerException:
            log.warning("could not remove the local tag %s", ref)

    # Containers.

    def probe_base(self, ref: str) -> BaseProbe:
        """Which OS a base image holds and which python3, if any (runs a throwaway container)."""
        image = self.image(ref) or self._pull(ref)
        result = self.run(ref, ["/bin/sh", "-c", _PROBE_SCRIPT], timeout=60)
        fields = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
        os_id, _, codename = fields.get("os", "unknown unknown").partition(" ")
        return BaseProbe(
            ref=ref,
            image_id=image.id,
            os_id=os_id,
            os_codename=codename,
            python=fields.get("python"),
        )

    def _pull(self, ref: str) -> ImageInfo:
        """Pull a missing base image; BadInput naming the way out when the registry says no."""
        log.info("pulling %s", ref)
        try:
            return _info(self._client.images.pull(ref))
        except (docker.errors.APIError, requests.RequestException) as exc:
            msg = (
                f"base image {ref} is not in the local engine and cannot be pulled ({_short(exc)}); "
                "make one with `envbuild base bootstrap` and pass --base-image"
            )
            raise BadInput(msg) from exc

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
        """Run `command` in a fresh container, copying `files` in first; the container is always removed."""
        start = time.monotonic()
        container = None
        try:
            container = self._client.containers.create(
                image,
                command=command,
                environment=environment or {},
                shm_size=shm_size,
                # NCCL pins memory; only GPU runs ask for it (some hosts forbid raising it).
                ulimits=[docker.types.Ulimit(name="memlock", soft=-1, hard=-1)] if gpus else None,
                device_requests=[DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None,
                network_mode="none",
                labels={
                    "org.envbuild.role": "smoke",
                    RUN_LABEL: run_id(),
                    RUN_PLACE_LABEL: run_place(),
                },
            )
            for path, data in (files or {}).items():
                container.put_archive("/", _tar_of(path, data))
            container.start()
            timed_out = False
            try:
                status = container.wait(timeout=timeout)
                exit_code: int | None = int(status.get("StatusCode", -1))
            except (requests.ReadTimeout, requests.ConnectionError):
                # docker-py reports a wait that timed out as either; a dead engine answers no ping.
                self._require_engine(f"the smoke test of {image}")
                timed_out = True
                exit_code = None
                container.kill()
            stdout = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
            stderr = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
            return RunResult(
                exit_code=exit_code,
                stdout=stdout,
                stderr=stderr,
                timed_out=timed_out,
                seconds=time.monotonic() - start,
            )
        except docker.errors.ImageNotFound as exc:
            msg = f"image {image} is not in the local engine; build or pull it first"
            raise EnvbuildError(msg) from exc
        except docker.errors.APIError as exc:
            msg = f"the engine could not run {image}: {_short(exc)}"
            raise EnvbuildError(msg) from exc
        except _LOST as exc:
            raise _lost(exc, f"while running {image}") from exc
        finally:
            if container is not None:
                try:
                    container.remove(force=True)
                except _LOST_OR_REFUSED:
                    log.warning("could not remove container %s", container.id)

    def _require_engine(self, doing: str) -> None:
        try:
            self._client.ping()
        except _LOST_OR_REFUSED as exc:
            raise _lost(exc, f"during {doing}") from exc

    def remove_leftovers(self) -> int:
        """Remove stopped containers that only a dead run leaves: envbuild's smoke containers and
        the install step's (and the builder stage's of older envbuild versions), kept by an
        engine that died mid-build or a run that died; return how many. Another run on the same
        engine (parallel CI jobs on one runner) keeps its own: see `left_behind`."""
        removed = 0
        for label in ("org.envbuild.role=smoke", INSTALL_STAGE, f"{STAGE}=builder"):
            for status in ("exited", "dead", "created"):
                filters: dict[str, str | list[str] | bool] = {"label": label, "status": status}
                for container in self._client.containers.list(all=True, filters=filters):
                    if not left_behind(container.attrs, now=time.time()):
                        continue
                    try:
                        container.remove(force=True)
                        removed += 1
                    except docker.errors.DockerException as exc:
                        log.warning(
                            "could not remove container %s: %s", container.short_id, _short(exc)
                        )
        if removed:
            log.info("removed %d containers left by an earlier run that died", removed)
        return removed

    def remove_run_containers(self, run: str) -> int:
        """Force-remove every container a run made (after an interrupt); return how many."""
        removed = 0
        try:
            containers = self._client.containers.list(
                all=True, filters={"label": f"{RUN_LABEL}={run}"}
            )
            for container in containers:
                container.remove(force=True)
                removed += 1
        except (docker.errors.DockerException, requests.RequestException) as exc:
            log.warning("could not remove the containers of run %s: %s", run, _short(exc))
        return removed


# What a dead or restarting engine raises mid-request: docker-py streams read urllib3 directly.
_LOST: tuple[type[BaseException], ...] = (
    requests.RequestException,
    urllib3.exceptions.HTTPError,
    ConnectionError,
)
_LOST_OR_REFUSED: tuple[type[BaseException], ...] = (docker.errors.DockerException, *_LOST)
_RESTART = "check that dockerd runs (`docker info`), restart it, and run envbuild again"


def _info(image: Any) -> ImageInfo:
    labels = (image.attrs.get("Config") or {}).get("Labels") or {}
    return ImageInfo(id=str(image.id), tags=tuple(image.tags), labels=dict(labels))


def _tar_of(path: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.size = len(data)
        info.mode = 0o755
        info.mtime = int(time.time())
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _lost(exc: BaseException, doing: str = "") -> EngineUnavailable:
    """The one-line error for an engine that went away mid-call."""
    during = f" {doing}" if doing else ""
    return EngineUnavailable(f"lost the Docker engine{during}: {_short(exc)}; {_RESTART}")


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


# The classic builder's word for a failed RUN, which repeats the whole (long) script.
_RUN_FAILED = re.compile(r"The command '.*' returned a non-zero code: (\d+)", re.DOTALL)


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _build_error(message: str, last_lines: list[str]) -> str:
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


def _push_failure(ref: str, error: str) -> str:
    """The one line for a failed push; a certificate the engine does not trust names the fix."""
    if "x509:" in error or "unknown authority" in error:
        host = ref.split("/", 1)[0]
        return (
            f"push of {ref} failed: Docker's engine does not trust the TLS certificate of "
            f"registry {host} ({error}); put the PEM of the CA that signs it at "
            f"/etc/docker/certs.d/{host}/ca.crt on the engine's host (read at each push)"
        )
    return f"push of {ref} failed: {error}"
