"""The docker-py implementation of the engine: the only module that imports docker.

Every public method of `DockerEngine` is an engine call (`_engine_calls`): whatever docker-py,
requests or urllib3 raise on the engine's answer (an error status, a timeout, a connection cut
mid-answer, a body that is not the Docker Engine API) leaves it as one `EngineFailed` line,
worded in one place (`_failure`): the engine's address, the request, what the
engine said and what to check. Methods catch docker-py's errors themselves only where an answer
has a meaning (an image that is not there, a tag another publisher removed, a base image the
engine cannot pull).
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import inspect
import io
import ipaddress
import json
import logging
import math
import os
import re
import socket
import ssl
import struct
import tarfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any, Concatenate, ParamSpec, TypeVar

import docker
import docker.errors
import docker.utils.build
import requests
import urllib3.exceptions
from docker.types import DeviceRequest

from envbuild.core.errors import (
    BadInput,
    BuildFailed,
    EngineFailed,
    EnvbuildError,
)
from envbuild.core.interrupt import RUN_LABEL, RUN_PLACE_LABEL, run_id, run_place
from envbuild.core.labels import INSTALL_STAGE, STAGE
from envbuild.core.models import BUILDKIT, CLASSIC, BaseProbe, ProxySettings
from envbuild.core.names import split_tag
from envbuild.core.platforms import platform_of
from envbuild.core.settings import seconds_setting
from envbuild.engine import buildkit, probe_records
from envbuild.engine.build_errors import build_error
from envbuild.engine.interface import EngineInfo, ImageInfo, RunResult
from envbuild.engine.leftovers import left_behind
from envbuild.net.bounded import printable

log = logging.getLogger(__name__)

TIMEOUT_ENV = "ENVBUILD_ENGINE_TIMEOUT"
# Seconds the engine has to begin each answer, and to go on with any answer but a long
# operation's stream (`_LONG_STREAMS`).
DEFAULT_TIMEOUT = 120
DEFAULT_ADDRESS = "unix:///var/run/docker.sock"
# Answers that stream a long operation's progress: once begun, they may pause as long as a step
# runs silently (a RUN step compiling for an hour, a large layer pulled or pushed), as docker-py
# itself lets builds and pulls do. Ctrl-C still ends them cleanly.
_LONG_STREAMS = re.compile(r"(/v[\d.]+)?(/build|/images/create|/images/.+/push)")
# A container's logs: envbuild's containers have no TTY, so the engine frames what they print.
_LOGS = re.compile(r"(/v[\d.]+)?/containers/[^/]+/logs")

# The build network of --offline builds (`_offline_network`).
OFFLINE_NETWORK = "envbuild-offline"

_PROBE_SCRIPT = (
    '. /etc/os-release 2>/dev/null; echo "os=${ID:-unknown} ${VERSION_CODENAME:-unknown}"; '
    "if command -v python3 >/dev/null 2>&1; then "
    "python3 -c 'import sys; print(\"python=%d.%d\" % sys.version_info[:2])'; fi"
)

# How many times a copy into a container is tried when the engine answers 5xx, and the seconds
# before the first retry (doubled at each further try).
_COPY_TRIES = 3
_COPY_BACKOFF = 0.5
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


# What requests lets replace the CA of any HTTPS request (docker-py's for the engine too: a TLS
# engine's own CA is then refused, docker/docker-py#2433); CI jobs behind a proxy set them.
_CA_OVERRIDES = ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")


@contextlib.contextmanager
def _engine_tls_only() -> Iterator[None]:
    """While docker-py first asks the engine (before its session can be told to ignore the
    environment), the environment's CA overrides are set aside."""
    saved = {name: os.environ.pop(name) for name in _CA_OVERRIDES if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _loopback(address: str) -> bool:
    """Whether a tcp:// engine address names this host's loopback."""
    host = urllib.parse.urlsplit(address).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def answer_timeout(environ: Mapping[str, str] | None = None) -> int:
    """Seconds the engine has to answer: ENVBUILD_ENGINE_TIMEOUT (whole seconds, rounded up),
    else the default."""
    seconds = seconds_setting(TIMEOUT_ENV, DEFAULT_TIMEOUT, environ)
    return math.ceil(seconds)


def engine_address(environ: Mapping[str, str] | None = None) -> str:
    """The engine docker-py connects to, as a user names it: DOCKER_HOST, else the socket."""
    env = os.environ if environ is None else environ
    return env.get("DOCKER_HOST") or DEFAULT_ADDRESS


class _Asked(threading.local):
    """The request this thread last sent to the engine: the one an answer cut short or
    unreadable mid-stream belongs to, when docker-py's exception does not carry it."""

    request: requests.PreparedRequest | None = None


_E = TypeVar("_E", bound="DockerEngine")
_P = ParamSpec("_P")
_R = TypeVar("_R")


def _engine_call(
    method: Callable[Concatenate[_E, _P], _R],
) -> Callable[Concatenate[_E, _P], _R]:
    """`method`, with every failure of the engine's answers raised as one EngineFailed line."""

    @functools.wraps(method)
    def call(self: _E, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        except _FAILURES as exc:
            raise self._failed(exc) from exc

    return call


_C = TypeVar("_C", bound=type)


def _engine_calls(cls: _C) -> _C:
    """Make every public method of `cls` an engine call (`_engine_call`): the one place where
    docker-py's, requests' and urllib3's errors become envbuild's, whatever the method."""
    for name, member in list(vars(cls).items()):
        if not name.startswith("_") and inspect.isfunction(member):
            setattr(cls, name, _engine_call(member))
    return cls


@_engine_calls
class DockerEngine:
    """A connected Docker engine, driven through docker-py (classic builder API)."""

    def __init__(
        self,
        client: docker.DockerClient,
        *,
        address: str | None = None,
        timeout: int | None = None,
    ) -> None:
        self._client = client
        self._address = address or engine_address()
        self._timeout = timeout or DEFAULT_TIMEOUT
        self._asked = _Asked()
        self._buildkit_client: tuple[buildkit.Client | None, str] | None = None
        self._buildkit_problem: str | None = None  # "" once an empty BuildKit build worked
        self._send = client.api.send
        client.api.send = self._bounded_send  # type: ignore[method-assign]

    @classmethod
    def connect(cls) -> DockerEngine:
        """Connect using DOCKER_HOST or the default socket, every answer bounded by
        ENVBUILD_ENGINE_TIMEOUT; EngineUnavailable if it does not answer."""
        timeout, address = answer_timeout(), engine_address()
        try:
            with _engine_tls_only():
                client = docker.from_env(timeout=timeout)  # asks GET /version: the API it speaks
        except _FAILURES as exc:
            raise _failure(exc, address, timeout, "GET /version", connecting=True) from exc
        # The engine is reached as DOCKER_HOST, DOCKER_TLS_VERIFY and DOCKER_CERT_PATH say, not
        # through a proxy or against a CA bundle that the environment names for the web.
        client.api.trust_env = False
        engine = cls(client, address=address, timeout=timeout)
        try:
            engine._ping()
        except _FAILURES as exc:
            raise engine._failed(exc, connecting=True) from exc
        return engine

    def _ping(self) -> None:
        """Ask the engine whether it is there; it answers OK (docker-py says False otherwise)."""
        if not self._client.ping():
            msg = "an answer other than OK"
            raise _NotTheApi(msg)

    def _failed(self, exc: BaseException, *, connecting: bool = False) -> EngineFailed:
        """The one line for an engine call that failed with `exc`; see `_failure`."""
        asked = _request_of(exc) or self._asked.request
        request = _shown_request(asked) if asked is not None else "a request"
        return _failure(exc, self._address, self._timeout, request, connecting=connecting)

    def _bounded_send(self, request: requests.PreparedRequest, **kwargs: Any) -> requests.Response:
        """docker-py's every request, noted, and bounded: the answer must begin in time."""
        self._asked.request = request
        if kwargs.get("timeout") is None:  # docker-py asks none for builds and pulls
            kwargs["timeout"] = self._timeout
        path = urllib.parse.urlsplit(request.url or "").path
        logs = request.method == "GET" and _LOGS.fullmatch(path) is not None
        if logs:
            kwargs["stream"] = True  # read here, bounded, not whole by requests
        response = self._send(request, **kwargs)
        if request.method == "POST" and _LONG_STREAMS.fullmatch(path):
            _wait_as_long_as_it_runs(response)
        elif logs and response.ok:
            # Read bounded, once, before docker-py does; a client wrapped by two engines (two
            # DockerEngine of one docker-py client) has it read by the inner one already.
            if not getattr(response, "_content_consumed", False):
                response._content = _bounded_log(response)
                response._content_consumed = True  # type: ignore[attr-defined]
            try:
                _check_log_frames(response.content)
            except _NotTheApi as exc:
                exc.request = request
                raise
        return response

    @contextlib.contextmanager
    def _cleaning_up(self) -> Iterator[None]:
        """Requests that clean up after a call (remove its container, drop its tag) leave the
        request the call failed on as the one its error names."""
        failed_on = self._asked.request
        try:
            yield
        finally:
            self._asked.request = failed_on

    def describe(self) -> EngineInfo:
        """Version, kind, runtimes and storage of the engine, for `envbuild doctor`."""
        info = _document(self._client.api.info())
        version = _document(self._client.api.version())
        components = version.get("Components") or []
        names = [str(c.get("Name", "")) for c in components if isinstance(c, dict)]
        security = [str(option) for option in info.get("SecurityOptions") or ()]
        return EngineInfo(
            version=str(version.get("Version", "unknown")),
            runtimes=tuple(sorted(info.get("Runtimes") or {})),
            cdi_spec_dirs=tuple(info.get("CDISpecDirs") or ()),
            root_dir=str(info.get("DockerRootDir", "")),
            kind="Podman" if any("podman" in name.lower() for name in names) else "Docker",
            api_version=str(version.get("ApiVersion", "")),
            rootless=any("rootless" in option for option in security),
            address=self._address,
            name=str(info.get("Name", "")),
            platform=platform_of(str(info.get("Architecture", ""))) or "",
        )

    def builder_problem(self, builder: str) -> str:
        """ "" when `builder` works with this engine, else why not and what to use instead."""
        facts = self.describe()
        if builder == CLASSIC:
            return self._classic_problem(facts)
        if facts.kind == "Podman":
            return (
                "Podman's Docker API has no BuildKit (Podman builds with Buildah); "
                "use --builder classic"
            )
        return self._buildkit_works()

    def _buildkit_works(self) -> str:
        """ "" when BuildKit builds on this engine (an empty build, once), else why not."""
        if self._buildkit_problem is None:
            client, why = self._find_buildkit_client()
            if client is None:
                self._buildkit_problem = (
                    f"no docker client here builds with BuildKit ({why}); install Debian's "
                    f"docker.io (its 20.10 client), or docker-buildx, or name one in "
                    f"{buildkit.CLIENT_ENV}"
                )
            else:
                engine = f"the Docker engine at {printable(self._address, 120)}"
                self._buildkit_problem = buildkit.probe(client, engine)
        return self._buildkit_problem

    def _find_buildkit_client(self) -> tuple[buildkit.Client | None, str]:
        if self._buildkit_client is None:
            self._buildkit_client = buildkit.find_client()
        return self._buildkit_client

    def _classic_problem(self, facts: EngineInfo) -> str:
        """Why the classic builder cannot build here, or "": it serves the build's inputs from
        this host on the gateway of the engine's bridge, which only an engine on this host, with
        its networks in this host's namespace, reaches. An engine over TCP is on this host when
        it is reached on a loopback address and names this host (a docker:dind container
        published on a loopback port names its container)."""
        engine = f"the {facts.kind} engine at {printable(self._address, 120)}"
        serves = "the classic builder serves the build's inputs from this host, which"
        if facts.rootless:
            return (
                f"{serves} {engine} does not reach: it is rootless, its networks live in "
                "rootlesskit's namespace; use --builder buildkit"
            )
        if not self._address.startswith("unix://") and not (
            _loopback(self._address) and facts.name == socket.gethostname()
        ):
            return (
                f"{serves} {engine} does not reach: it is not on this host; use --builder buildkit"
            )
        return ""

    def has_nvidia_runtime(self) -> bool:
        """True when the engine has the NVIDIA container runtime to hand GPUs to containers."""
        # Not CDISpecDirs: recent engines list /etc/cdi whether or not a GPU spec is in it.
        runtimes = _document(self._client.api.info()).get("Runtimes") or {}
        return "nvidia" in runtimes

    # Images.

    def image(self, ref: str) -> ImageInfo | None:
        """The local image `ref` names, or None."""
        try:
            attrs = _document(self._client.api.inspect_image(ref))  # type: ignore[no-untyped-call]
        except docker.errors.APIError as exc:
            if exc.status_code in (400, 404):  # an invalid reference cannot exist locally
                return None
            raise
        labels = _document(attrs.get("Config") or {}).get("Labels") or {}
        recorded = f"{attrs.get('Os') or 'linux'}/{attrs.get('Architecture') or ''}"
        layers = _document(attrs.get("RootFS") or {}).get("Layers") or []
        return ImageInfo(
            id=str(attrs["Id"]),
            tags=tuple(attrs.get("RepoTags") or ()),
            labels=dict(labels),
            platform=platform_of(str(attrs.get("Architecture", ""))) or recorded,
            layers=tuple(str(layer) for layer in layers) if isinstance(layers, list) else (),
        )

    def tag(self, image_id: str, ref: str) -> None:
        """Point `ref` (repo:tag) at the image."""
        repository, tag = split_tag(ref)
        self._client.api.tag(image_id, repository, tag or "latest")

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
        """Build with `builder`, streaming every output line; return the image id."""
        # Docker's predefined proxy arguments: no ARG needed, kept out of `docker history`
        # and of the cache key (docs.docker.com/build/building/variables/#predefined-build-args).
        build_args = {**(proxy.environment() if proxy is not None else {}), **build_args}
        if builder == BUILDKIT:
            client, why = self._find_buildkit_client()
            if client is None:
                msg = f"--builder buildkit: no docker client here builds with BuildKit ({why})"
                raise BadInput(msg)
            return buildkit.build(
                client, context_dir, engine=f"the Docker engine at {printable(self._address, 120)}",
                tag=tag, labels=labels, build_args=build_args,
                secrets=secrets or {}, on_line=on_line, network=network, target=target,
                no_cache=no_cache, platform=platform,
            )  # fmt: skip
        if secrets:
            msg = "the classic builder has no secret mounts; build with BuildKit"
            raise BuildFailed(msg)
        # The labels as one instruction of the Dockerfile sent, where they can be: the classic
        # builder makes a step of each label given through its API (a container made and
        # committed, 0.04-0.05 s each here), and the image's labels are the same.
        labelled = None if target else labelled_dockerfile(context_dir / "Dockerfile", labels)
        with contextlib.ExitStack() as stack:
            context: dict[str, Any] = {"path": str(context_dir)}
            if labelled is not None:
                # The context's archive made here, the labelled Dockerfile in it under a name of
                # its own, and that one name sent: docker-py, given a Dockerfile outside the
                # context, sends the name and the text both as `dockerfile`, and Podman reads
                # the text as a path.
                archive = docker.utils.build.tar(
                    context_dir, dockerfile=(LABELLED_DOCKERFILE, labelled)
                )
                stack.callback(archive.close)
                context = {
                    "fileobj": archive,
                    "custom_context": True,
                    "dockerfile": LABELLED_DOCKERFILE,
                }
            stream: Iterator[dict[str, Any]] = self._client.api.build(
                **context,
                tag=tag,
                labels=labels if labelled is None else None,
                buildargs=build_args,
                rm=True,
                forcerm=True,
                pull=False,
                decode=True,
                network_mode=None if network else self._offline_network(),
                target=target,
                nocache=no_cache,
                platform=platform,
            )
            return _built_image(stream, on_line)

    def bridge_gateway(self, *, network: bool = True) -> str:
        """The gateway of the default bridge, or (network=False) of envbuild's internal network,
        made if missing: the host address a build's RUN steps can reach."""
        name = "bridge" if network else self._offline_network()
        gateway = ipv4_gateway(_document(self._client.api.inspect_network(name)))
        if gateway:
            if not _bindable(gateway) and self.describe().kind == "Podman":
                self._join_network(name)
            return gateway
        msg = (
            f"the Docker network {name!r} has no IPv4 gateway; envbuild serves a build's files "
            "there: check dockerd's --bip/--bridge settings"
        )
        raise BuildFailed(msg)

    def _join_network(self, name: str) -> None:
        """Run a throwaway container on network `name`. Podman makes a network's bridge, and
        with it the gateway address the build server binds, only when a container first joins
        the network (CNI and netavark alike); Docker's bridges exist from the start."""
        api = self._client.api
        images = _documents(api.images())
        if not images:
            return  # nothing to run: the build server's bind then says what is wrong
        image = str(max(images, key=lambda i: int(i.get("Created") or 0))["Id"])
        labels = {RUN_LABEL: run_id(), RUN_PLACE_LABEL: run_place()}
        host_config = api.create_host_config(network_mode=name)
        created = api.create_container(image, ["true"], host_config=host_config, labels=labels)
        container = str(_document(created)["Id"])
        try:
            api.start(container)  # the engine joins the network before the command runs
            api.wait(container, timeout=60)
        except docker.errors.APIError as exc:  # no `true` in it: the bridge is up all the same
            log.info("the container that brings up %s's bridge failed: %s", name, exc)
        finally:
            self._remove_container(container)

    def _offline_network(self) -> str:
        """envbuild's internal bridge network: an --offline build reaches the host's gateway
        address (envbuild's build server) and nothing beyond the host. Made if missing."""
        found = self._client.api.networks(names=[OFFLINE_NETWORK])
        if not any(n.get("Name") == OFFLINE_NETWORK for n in _documents(found)):
            try:
                made = self._client.api.create_network(
                    OFFLINE_NETWORK, driver="bridge", internal=True,
                    labels={"org.envbuild.network": "offline"},
                )  # fmt: skip
                _document(made)
            except docker.errors.APIError as exc:
                if exc.status_code != 409:  # 409: another run made it first
                    raise
        return OFFLINE_NETWORK

    def load(self, archive: IO[bytes]) -> tuple[str, ...]:
        """Load a `docker save` archive; return the ids of the images it held."""
        loaded: list[str] = []
        for chunk in self._client.api.load_image(archive):  # type: ignore[no-untyped-call]
            chunk = _document(chunk)
            if "error" in chunk:
                msg = (
                    f"the engine could not load the image archive: {printable(chunk['error'], 300)}"
                )
                raise EnvbuildError(msg)
            stream = str(chunk.get("stream", ""))
            if stream.startswith("Loaded image ID: "):
                loaded.append(stream.removeprefix("Loaded image ID: ").strip())
            elif stream.startswith("Loaded image: "):
                image = self.image(stream.removeprefix("Loaded image: ").strip())
                if image is not None:
                    loaded.append(image.id)
        if not loaded:
            msg = "the engine loaded the image archive but named no image in it"
            raise EnvbuildError(msg)
        return tuple(dict.fromkeys(loaded))

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
                _document(chunk)
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
            if not str(exc.explanation or "").startswith(_NO_SUCH_TAG):
                raise
            raise _TagVanished(str(exc)) from exc
        finally:
            self._untag(image_id, ref)
        if digest is None:
            msg = f"push of {ref} reported no digest"
            raise EnvbuildError(msg)
        return digest

    def _untag(self, image_id: str, ref: str) -> None:
        """Drop the local tag `ref` unless it is the image's last name; gone already is fine."""
        with self._cleaning_up():
            try:
                image = self.image(image_id)
                if image is None or ref not in image.tags or not any(t != ref for t in image.tags):
                    return
                _documents(self._client.api.remove_image(ref, noprune=True))
            except docker.errors.NotFound:
                pass  # another publisher of the same image dropped it first
            except EngineFailed as exc:
                log.warning("could not remove the local tag %s: %s", ref, exc.message)
            except _FAILURES as exc:
                log.warning("could not remove the local tag %s: %s", ref, self._failed(exc).message)

    # Containers.

    def probe_base(self, ref: str, platform: str | None = None) -> BaseProbe:
        """Which OS a base image holds and which python3, if any: what a throwaway container
        found in an image of the same id before (probe_records), else what one finds now."""
        image = self.image(ref) or self._pull(ref, platform)
        found = probe_records.recalled(image.id, _PROBE_SCRIPT)
        if found is None:
            result = self.run(ref, ["/bin/sh", "-c", _PROBE_SCRIPT], timeout=60)
            fields = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
            os_id, _, codename = fields.get("os", "unknown unknown").partition(" ")
            found = probe_records.ProbeFindings(
                os_id=os_id, os_codename=codename, python=fields.get("python")
            )
            probe_records.remember(image.id, _PROBE_SCRIPT, found)
        return BaseProbe(
            ref=ref,
            image_id=image.id,
            os_id=found.os_id,
            os_codename=found.os_codename,
            python=found.python,
            platform=image.platform,
        )

    def pull(
        self, ref: str, *, platform: str | None, auth_config: dict[str, str] | None
    ) -> ImageInfo | None:
        """Pull `ref` for `platform`; the image, or None when the registry holds no such tag."""
        log.info("pulling %s", ref)
        repository, tag = split_tag(ref)
        try:
            for chunk in self._client.api.pull(
                repository, tag=tag or "latest", stream=True, decode=True, platform=platform,
                auth_config=auth_config,
            ):  # fmt: skip
                if "error" in _document(chunk):
                    msg = f"pull of {printable(ref, 200)} failed: {printable(chunk['error'], 300)}"
                    raise EnvbuildError(msg)
        except _FAILURES as exc:
            response = _http_error(exc)
            if response is None:
                raise
            if response.status_code == 404:  # the registry answered: no such manifest
                return None
            engine = f"the Docker engine at {printable(self._address, 120)}"
            msg = f"pull of {printable(ref, 200)} failed: {engine} answered {_status(response)}"
            raise EnvbuildError(msg) from exc
        return self.image(ref)

    def _pull(self, ref: str, platform: str | None = None) -> ImageInfo:
        """Pull a missing base image; BadInput naming the way out when the registry says no."""
        log.info("pulling %s", ref)
        repository, tag = split_tag(ref)
        cannot = f"base image {ref} is not in the local engine and cannot be pulled"
        fix = "make one with `envbuild base bootstrap` and pass --base-image"
        try:
            for chunk in self._client.api.pull(
                repository, tag=tag or "latest", stream=True, decode=True, platform=platform
            ):
                if "error" in _document(chunk):
                    msg = f"{cannot} ({printable(chunk['error'])}); {fix}"
                    raise BadInput(msg)
            image = self.image(ref)
        except _FAILURES as exc:
            # Docker answers a pull the registry refused, or could not be reached for, with an
            # error status: the base is the user's to fix, not the engine.
            response = _http_error(exc)
            if response is None:
                raise
            request = _request_of(exc) or self._asked.request
            answered = _shown_request(request) if request is not None else "the pull"
            engine = f"the Docker engine at {printable(self._address, 120)}"
            msg = f"{cannot} ({engine} answered {answered} with {_status(response)}); {fix}"
            raise BadInput(msg) from exc
        if image is None:
            msg = f"{cannot} (the engine pulled it, then did not have it); {fix}"
            raise BadInput(msg)
        return image

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
        api = self._client.api
        start = time.monotonic()
        host_config = api.create_host_config(
            shm_size=shm_size,
            # NCCL pins memory; only GPU runs ask for it (some hosts forbid raising it).
            ulimits=[docker.types.Ulimit(name="memlock", soft=-1, hard=-1)] if gpus else None,
            device_requests=[DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None,
            network_mode="none",
        )
        labels = {"org.envbuild.role": "smoke", RUN_LABEL: run_id(), RUN_PLACE_LABEL: run_place()}
        # The low-level call: its answer is the id alone, known before anything else can fail.
        created = api.create_container(
            image, command=command, environment=environment or {}, host_config=host_config,
            labels=labels,
        )  # fmt: skip
        container = str(_document(created)["Id"])
        try:
            for path, data in (files or {}).items():
                self._copy_in(container, _tar_of(path, data))
            api.start(container)
            timed_out = False
            try:
                status = _document(api.wait(container, timeout=math.ceil(timeout)))
                exit_code: int | None = int(status.get("StatusCode", -1))
            except (requests.ReadTimeout, requests.ConnectionError) as exc:
                # docker-py reports a wait that timed out as either; a dead engine answers no ping.
                if not _found(exc, _TIMEOUTS):
                    raise
                self._ping()
                timed_out = True
                exit_code = None
                try:
                    api.kill(container)
                except docker.errors.APIError as refused:
                    if refused.status_code != 409:  # 409: it ended meanwhile
                        raise
            # Each read at most RUN_OUTPUT_MAX bytes (`_bounded_send`).
            stdout = api.logs(container, stdout=True, stderr=False).decode("utf-8", "replace")
            stderr = api.logs(container, stdout=False, stderr=True).decode("utf-8", "replace")
            return RunResult(
                exit_code=exit_code,
                stdout=stdout,
                stderr=stderr,
                timed_out=timed_out,
                seconds=time.monotonic() - start,
            )
        finally:
            self._remove_container(container)

    def _remove_container(self, container: str) -> bool:
        """Force-remove a container; a warning naming it, and False, when the engine will not."""
        with self._cleaning_up():
            try:
                self._client.api.remove_container(container, force=True)
            except docker.errors.NotFound:
                pass  # gone already: what removing it was for
            except _FAILURES as exc:
                message = self._failed(exc).message
                log.warning("container %s is left behind: %s", container[:12], message)
                return False
        return True

    def _copy_in(self, container: str, archive: bytes) -> None:
        """Unpack `archive` at the root of the (created) `container`, tried again after an answer
        of 5xx: Podman's copy runs a helper process, and answered 500 ("passing bulk input to
        subprocess: write |1: broken pipe") once in a run where the same copy succeeded before
        and after. Unpacking the same files again is harmless."""
        for attempt in range(_COPY_TRIES):
            try:
                self._client.api.put_archive(container, "/", archive)
                return
            except docker.errors.APIError as exc:
                status = exc.status_code or 0
                if status < 500 or attempt == _COPY_TRIES - 1:
                    raise
                wait = _COPY_BACKOFF * 2**attempt
                shown = printable(_short(exc), 300)
                log.info(
                    "copy into container %s: %s; retrying in %g s", container[:12], shown, wait
                )
                time.sleep(wait)

    def remove_leftovers(self) -> int:
        """Remove stopped containers that only a dead run leaves: envbuild's smoke containers and
        the install step's (and the builder stage's of older envbuild versions), kept by an
        engine that died mid-build or a run that died; return how many. Another run on the same
        engine (parallel CI jobs on one runner) keeps its own: see `left_behind`."""
        removed = 0
        for label in ("org.envbuild.role=smoke", INSTALL_STAGE, f"{STAGE}=builder"):
            # By label alone: `left_behind` reads the state from the inspect document. Podman
            # answers a `status=dead` filter with 500 ("unknown container state"), having none.
            filters: dict[str, str | list[str] | bool] = {"label": label}
            for listed in _documents(self._client.api.containers(all=True, filters=filters)):
                container = str(listed["Id"])
                try:
                    attrs = _document(self._client.api.inspect_container(container))
                except docker.errors.NotFound:
                    continue  # removed since it was listed
                if left_behind(attrs, now=time.time()):
                    removed += self._remove_container(container)
        if removed:
            log.info("removed %d containers left by an earlier run that died", removed)
        return removed

    def remove_run_containers(self, run: str) -> int:
        """Force-remove every container a run made (after an interrupt); return how many."""
        removed = 0
        try:
            listed = self._client.api.containers(all=True, filters={"label": f"{RUN_LABEL}={run}"})
            containers = [str(c["Id"]) for c in _documents(listed)]
        except _FAILURES as exc:
            message = self._failed(exc).message
            log.warning("could not remove the containers of run %s: %s", run, message)
            return 0
        for container in containers:
            removed += self._remove_container(container)
        return removed


def _built_image(stream: Iterator[dict[str, Any]], on_line: Callable[[str], None]) -> str:
    """The id of the image the classic builder's `stream` ends in, each output line given to
    `on_line`; BuildFailed with the build's last lines when it failed."""
    image_id: str | None = None
    last_lines: list[str] = []
    for chunk in stream:
        _document(chunk)
        if "stream" in chunk:
            for line in str(chunk["stream"]).splitlines():
                on_line(line)
                if line.strip():
                    last_lines = [*last_lines[-19:], line]
        elif "error" in chunk:
            message = str(chunk["error"]).strip()
            on_line(f"ERROR: {message}")
            raise BuildFailed(build_error(message, last_lines))
        elif "aux" in chunk and "ID" in chunk["aux"]:
            image_id = str(chunk["aux"]["ID"])
    if image_id is None:
        raise BuildFailed(build_error("the engine reported no image id", last_lines))
    return image_id


# The labelled Dockerfile's name in the classic builder's context: no COPY of envbuild's names it.
LABELLED_DOCKERFILE = ".envbuild.Dockerfile"


def labelled_dockerfile(path: Path, labels: Mapping[str, str]) -> str | None:
    """The Dockerfile at `path` with `labels` in one LABEL instruction at its end, each name and
    value in single quotes (no escape, no variable: the text as it is): added to the Dockerfile's
    own last instruction when that is a LABEL (envbuild's are: one step fewer), else a LABEL
    of their own. None when there are none, or when they cannot be written so (a quote or a
    control character, an unreadable Dockerfile, one whose last line continues or that changes
    its escape character): then they go through the API, as before."""
    words = []
    for name, value in sorted(labels.items()):
        if not name or any(char == "'" or not char.isprintable() for char in name + value):
            return None
        words.append(f"'{name}'='{value}'")
    if not words:
        return None
    try:
        text = path.read_text(encoding="utf-8").rstrip()
    except (OSError, UnicodeDecodeError):
        return None
    if text.endswith(("\\", "`")) or re.search(r"(?im)^#\s*escape\s*=", text):
        return None
    if re.match(r"(?i)\s*LABEL\s", _last_instruction(text.split("\n"))):
        return f"{text} \\\n      {' '.join(words)}\n"
    return f"{text}\nLABEL {' '.join(words)}\n"


def _last_instruction(lines: list[str]) -> str:
    """The first line of the Dockerfile's last instruction (`lines`, its text without a line
    break at its end): a line belongs to the one before it when the last line before it that is
    neither blank nor a comment ends with a backslash (Docker's reading)."""
    first = len(lines) - 1
    while True:
        before = first - 1
        while before >= 0 and (not lines[before].strip() or lines[before].lstrip().startswith("#")):
            before -= 1
        if before < 0 or not lines[before].rstrip(" \t").endswith("\\"):
            return lines[first]
        first = before


def _bindable(address: str) -> bool:
    """Whether this host can listen on `address` (one of its own addresses)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except OSError:
        return False
    return True


def _tar_of(path: str, data: bytes) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        info = tarfile.TarInfo(path.lstrip("/"))
        info.size = len(data)
        info.mode = 0o755
        info.mtime = int(time.time())
        archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


# What docker-py, requests and urllib3 raise on an engine's answer. The last rows are what
# parsing raises on a body that is not the API: JSON that does not parse (ValueError), JSON of
# another shape (docker-py indexes it), log frames that do not unpack.
# What `run` keeps of a container's stdout and of its stderr (the smoke report is a few KB, the
# package listing of an image a few hundred).
RUN_OUTPUT_MAX = 16 * 1024 * 1024
_FRAME_HEADER = 8
_CUT_NOTE = "\n[envbuild: output cut at {limit} bytes]\n"


def _bounded_log(response: requests.Response, limit: int = RUN_OUTPUT_MAX) -> bytes:
    """A log answer's body, read whole when it holds at most `limit` bytes of output; else its
    frames up to `limit` bytes and one frame more saying where it was cut, the rest unread
    (what runs in a container may be any image's, and may print without end). Read no deeper
    than twice `limit` and a margin: frames' headers are 8 bytes each, of a line or of nothing."""
    data = bytearray()
    ended = False
    while len(data) <= 2 * limit + 64 * 1024:
        block = response.raw.read(1024 * 1024, decode_content=True)
        if not block:
            ended = True
            break
        data += block
    kept, printed, stream = _frames_up_to(bytes(data), limit)
    if ended and printed <= limit:
        return bytes(data)  # whole: `_check_log_frames` judges its framing
    response.close()
    note = _CUT_NOTE.format(limit=limit).encode()
    return kept + bytes([stream, 0, 0, 0]) + struct.pack(">L", len(note)) + note


def _frames_up_to(data: bytes, limit: int) -> tuple[bytes, int, int]:
    """The frames of `data` with `limit` bytes of output in all, the one that passes it cut
    short; with how many bytes of output `data` holds (counted to past `limit`) and the stream
    (stdout 1, stderr 2) of the last frame."""
    kept = bytearray()
    printed = offset = 0
    stream = 1
    while offset + _FRAME_HEADER <= len(data) and printed <= limit:
        stream, length = data[offset], struct.unpack(">L", data[offset + 4 : offset + 8])[0]
        start = offset + _FRAME_HEADER
        payload = data[start : start + min(length, max(0, limit - printed))]
        if printed < limit:
            kept += data[offset : offset + 4] + struct.pack(">L", len(payload)) + payload
        printed += min(length, len(data) - start)
        offset = start + length
    return bytes(kept), printed, stream


_FAILURES: tuple[type[BaseException], ...] = (
    docker.errors.DockerException,
    requests.RequestException,
    urllib3.exceptions.HTTPError,
    http.client.HTTPException,
    ConnectionError,
    TimeoutError,
    docker.errors.StreamParseError,
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    IndexError,
    struct.error,
)
_TIMEOUTS = (requests.Timeout, urllib3.exceptions.TimeoutError, TimeoutError)
_REFUSED = (ConnectionRefusedError, FileNotFoundError, urllib3.exceptions.NewConnectionError)
_CUT = (
    requests.ConnectionError,
    requests.exceptions.ChunkedEncodingError,
    urllib3.exceptions.ProtocolError,
    http.client.HTTPException,
    ConnectionError,
)
_UNREADABLE = (
    ValueError, TypeError, KeyError, AttributeError, IndexError, struct.error,
    docker.errors.StreamParseError,
)  # fmt: skip
_RESTART = "check that dockerd runs (`docker info`), restart it, and run envbuild again"
_NOT_THE_API = (
    "check that DOCKER_HOST names a Docker engine (not a proxy or another server) that serves "
    "this request: `docker version` against it names the API versions it speaks"
)
_ENGINE_LOG = (
    "check the engine's log (`journalctl -u docker`, or dockerd's output) and `docker info`"
)


class _NotTheApi(ValueError):
    """An answer that parsed, but is not the document the Docker Engine API defines there."""

    request: requests.PreparedRequest | None = None


def _document(value: Any) -> dict[str, Any]:
    """`value`, a JSON object the engine answered; _NotTheApi when it is something else."""
    if not isinstance(value, dict):
        msg = f"a JSON {type(value).__name__} where the API has an object"
        raise _NotTheApi(msg)
    return value


def _documents(value: Any) -> list[dict[str, Any]]:
    """`value`, a JSON array of objects the engine answered; _NotTheApi when it is not."""
    if not isinstance(value, list):
        msg = f"a JSON {type(value).__name__} where the API has an array"
        raise _NotTheApi(msg)
    return [_document(item) for item in value]


def _failure(
    exc: BaseException, address: str, timeout: int, request: str, *, connecting: bool = False
) -> EngineFailed:
    """The one line for an engine call that failed with `exc`: the engine, the request, what
    the engine answered (or that it did not), and what to check."""
    engine = f"the Docker engine at {printable(address, 120)}"
    answered = _http_error(exc)
    if answered is not None:
        hint = _ENGINE_LOG if answered.status_code >= 500 else _NOT_THE_API
        return EngineFailed(f"{engine} answered {request} with {_status(answered)}; {hint}")
    if _found(exc, _TIMEOUTS):
        return EngineFailed(
            f"{engine} did not answer {request} within {timeout:g} s; check that it is not hung "
            f"or overloaded (`docker info`), or set {TIMEOUT_ENV} to more seconds"
        )
    if _found(exc, (ssl.SSLError, requests.exceptions.SSLError)):
        inner = [e for e in _causes(exc) if isinstance(e, ssl.SSLError)]
        reason = printable(str(inner[-1] if inner else exc), 200)
        return EngineFailed(
            f"TLS with {engine} failed during {request} ({reason}); check DOCKER_CERT_PATH "
            "(ca.pem, cert.pem, key.pem of a client certificate the engine trusts) and "
            "DOCKER_TLS_VERIFY"
        )
    if connecting and _found(exc, _REFUSED):
        return EngineFailed(
            f"cannot reach {engine} ({_reason(exc, _REFUSED)}); start dockerd "
            "(e.g. `sudo dockerd &`) or set DOCKER_HOST"
        )
    if _found(exc, _CUT):
        return EngineFailed(f"lost {engine} during {request}: {_reason(exc, _CUT)}; {_RESTART}")
    if _found(exc, _UNREADABLE):
        detail = _reason(exc, _UNREADABLE, unreadable=True)
        return EngineFailed(
            f"{engine} answered {request} with something that is not the Docker Engine API "
            f"({detail}); {_NOT_THE_API}"
        )
    return EngineFailed(f"{engine} failed {request}: {_reason(exc, _FAILURES)}; {_ENGINE_LOG}")


def _causes(exc: BaseException) -> list[BaseException]:
    """`exc` and what it wraps, outermost first: its cause and context, urllib3's `reason`, and
    the exceptions among its arguments (where requests keeps urllib3's)."""
    found: list[BaseException] = []
    todo = [exc]
    while todo and len(found) < 32:
        current = todo.pop(0)
        if any(current is seen for seen in found):
            continue
        found.append(current)
        wrapped = (current.__cause__, current.__context__, getattr(current, "reason", None))
        todo += [e for e in (*wrapped, *current.args) if isinstance(e, BaseException)]
    return found


def _found(exc: BaseException, kinds: tuple[type[BaseException], ...]) -> bool:
    return any(isinstance(e, kinds) for e in _causes(exc))


def _reason(
    exc: BaseException, kinds: tuple[type[BaseException], ...], *, unreadable: bool = False
) -> str:
    """What the innermost exception of `kinds` says: an OS error's own words, else its text,
    and for an unreadable answer what kind of reading failed."""
    inner = [e for e in _causes(exc) if isinstance(e, kinds)][-1]
    if isinstance(inner, OSError) and inner.strerror:
        return printable(inner.strerror, 200)
    text = _short(inner)
    if unreadable and isinstance(inner, json.JSONDecodeError):
        text = f"not JSON: {text}"
    elif unreadable and not isinstance(inner, _NotTheApi):
        text = f"{type(inner).__name__}: {text}"
    return printable(text, 240)


def _http_error(exc: BaseException) -> requests.Response | None:
    """The engine's answer with an error status that `exc` carries, if it does."""
    for cause in _causes(exc):
        response = getattr(cause, "response", None)
        if isinstance(cause, requests.HTTPError) and isinstance(response, requests.Response):
            return response
    return None


def _status(response: requests.Response) -> str:
    """`500 Internal Server Error: the engine's message`, on one line."""
    text = response.text
    try:
        document = json.loads(text)
    except ValueError:
        document = None
    if isinstance(document, dict) and "message" in document:
        text = str(document["message"])
    elif "html" in response.headers.get("Content-Type", ""):
        text = re.sub(r"<[^>]*>", " ", text)
    message = printable(" ".join(text.split()), 200)
    status = f"{response.status_code} {printable(response.reason or '', 60)}".strip()
    return f"{status}: {message}" if message else status


def _request_of(exc: BaseException) -> requests.PreparedRequest | None:
    """The request `exc` says it failed, if it says."""
    for cause in _causes(exc):
        request = getattr(cause, "request", None)
        if request is None:
            request = getattr(getattr(cause, "response", None), "request", None)
        if isinstance(request, requests.PreparedRequest):
            return request
    return None


def _shown_request(request: requests.PreparedRequest) -> str:
    """`GET /v1.41/containers/json`: the method and path, without the query."""
    path = urllib.parse.unquote(urllib.parse.urlsplit(request.url or "").path)
    return f"{request.method} {printable(path, 160)}"


def _check_log_frames(body: bytes) -> None:
    """Check that a log is Docker's multiplexed stream: frames of an 8-byte header (the stream,
    0 to 2, three zero bytes, the length) and that many bytes. docker-py reads any bytes as
    frames, and would hand on a web page's as what the container printed."""
    offset = 0
    while offset < len(body):
        header = body[offset : offset + 8]
        if len(header) < 8 or header[0] > 2 or header[1:4] != b"\0\0\0":
            msg = f"a log that is not Docker's multiplexed stream at byte {offset}: {header!r}"
            raise _NotTheApi(msg)
        offset += 8 + struct.unpack(">L", header[4:])[0]
        if offset > len(body):
            msg = f"a log whose last frame is cut short ({len(body)} bytes of {offset})"
            raise _NotTheApi(msg)


def _wait_as_long_as_it_runs(response: requests.Response) -> None:
    """Let a long operation's begun answer pause as long as the operation does (`_LONG_STREAMS`):
    the socket's read timeout, the engine's to begin answering, is lifted for the rest of it."""
    connection = getattr(response.raw, "connection", None)
    settimeout = getattr(getattr(connection, "sock", None), "settimeout", None)
    if callable(settimeout):
        settimeout(None)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


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
