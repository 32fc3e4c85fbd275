"""A Podman engine the e2e tests start: Debian's podman 4.3, through its Docker-compatible API.

`podman_engine()` starts `podman system service --time=0 unix://<folder>/podman.sock` as root with
storage, run state, network configuration and a containers.conf of its own under one temporary
folder, waits until the socket answers docker-py's ping, loads the base image into it from the
engine the tests use (`docker save` into the API's image load) and gives the environment that
reaches it (`DOCKER_HOST=unix://…`). On leaving, however the block ends, it stops the service
(SIGTERM, then SIGKILL), has `podman system reset` remove its storage (it unmounts the overlay
it mounted there), unmounts whatever is still mounted under the folder and removes the folder.
`scripts/engines/podman-setup.sh` prepares the host; what it has not done fails the test with
that fix.

Measured on the development machine (Debian bookworm, kernel 6.18, 2 cores, cgroup v1, no systemd):
- The service answers its first ping 0.1-0.2 s after it starts. Storage is the kernel's overlay
  on ext4; the OCI runtime is runc (crun is not installed); `cgroup_manager = "cgroupfs"` and
  `events_logger = "file"`, as there is no systemd or journald here.
- Rootful Podman gives every container RLIMIT_NOFILE and RLIMIT_NPROC of 1048576 (4194304 for
  nproc) unless containers.conf names others; this machine has no CAP_SYS_RESOURCE in its
  bounding set, so runc cannot raise them and *every* container fails to start ("error setting
  rlimit type 7: operation not permitted"). The folder's containers.conf sets
  `default_ulimits` to the service's own hard limits: nofile as this process has it, nproc
  lowered to the kernel's pid_max, as podman lowers its own on start (measured: 96363 here,
  32768 in the service).
- Networking is CNI (Debian's containernetworking-plugins; netavark is not installed), the
  network "podman" on the bridge cni-podman0, 10.88.0.0/16, gateway 10.88.0.1. The compat API
  answers `GET /networks/bridge` with it, as Docker names its default network. Podman makes the
  bridge only when a container first joins the network, and CNI leaves it on the host after
  (it is shared by every rootful Podman here). slirp4netns is rootless Podman's; this service
  does not use it.
- Containers on that network, and the RUN steps of a build (Buildah's), reach PyPI and
  deb.debian.org through the host's TLS-intercepting proxy: envbuild's `--ca-bundle` build of the
  torch CPU entry builds and passes its smoke test: 59 s build + 28 s smoke on a quiet machine,
  129 s + 72 s beside other engines' builds (2 cores); the e2e module takes 280-400 s in all.
- Podman's `docker save` archive holds each layer as `<digest>.tar` (its `<id>/layer.tar` are
  empty links), which `needles_in_layers` reads through the archive's manifest.
- Loading envbuild/base:bookworm (167 MB) through the API's image load: 3.8 s. Podman names it
  `localhost/envbuild/base:bookworm`, and resolves the short name `envbuild/base:bookworm` to it.
- Starting it and loading the base: 9.5-13 s in all. Stopping: SIGTERM ends the service in well
  under a second; `podman system reset --force` takes 0.2 s empty, 12-20 s holding the torch image.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
import requests

from tests.support.processes import stop

log = logging.getLogger(__name__)

SETUP = "scripts/engines/podman-setup.sh"
START_SECONDS = 30
STOP_SECONDS = 15
LOAD_SECONDS = 600
PID_MAX = Path("/proc/sys/kernel/pid_max")


@dataclass(frozen=True, kw_only=True)
class PodmanEngine:
    """A running Podman service: its folder (storage, run state, networks), socket and log."""

    folder: Path
    socket: Path
    log: Path
    pid: int

    @property
    def env(self) -> dict[str, str]:
        """The environment that points docker-py and envbuild at this engine."""
        # envbuild's records of this engine's builds apart from the host engine's: the store
        # keys a build by its content hash, not by engine, so a build here would make the
        # host's image of the same entry look moved, and publishing it refused.
        return {
            "DOCKER_HOST": f"unix://{self.socket}",
            "ENVBUILD_DATA_DIR": str(self.folder / "envbuild-data"),
        }

    def storage_options(self) -> list[str]:
        """podman's global options naming this engine's storage and networks."""
        return [
            "--root", str(self.folder / "root"), "--runroot", str(self.folder / "run"),
            "--tmpdir", str(self.folder / "tmp"),
            "--network-config-dir", str(self.folder / "networks"),
        ]  # fmt: skip

    def podman(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run the podman CLI on this engine's storage (beside its service, as Podman allows)."""
        return subprocess.run(
            ["podman", *self.storage_options(), *args],
            capture_output=True, text=True, timeout=timeout, check=False,
            env={**os.environ, "CONTAINERS_CONF": str(self.folder / "containers.conf")},
        )  # fmt: skip

    def client(self) -> docker.DockerClient:
        """A docker-py client of this engine."""
        return docker.DockerClient(base_url=self.env["DOCKER_HOST"], timeout=LOAD_SECONDS)


def missing_setup() -> str | None:
    """What scripts/engines/podman-setup.sh would install that this host lacks, or None."""
    if shutil.which("podman") is None:
        return f"no podman on PATH; run {SETUP} as root"
    if not Path("/usr/lib/cni/bridge").is_file():
        return f"no CNI bridge plugin (/usr/lib/cni/bridge); run {SETUP} as root"
    if os.geteuid() != 0:
        return "a rootful Podman service needs root; run the tests as root"
    return None


def containers_conf() -> str:
    """The service's containers.conf: limits runc can set here, and no systemd or journald."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    pid_max = int(PID_MAX.read_text())
    if nproc == resource.RLIM_INFINITY or nproc > pid_max:
        nproc = pid_max
    if nofile == resource.RLIM_INFINITY:
        nofile = 1048576
    return (
        "[containers]\n"
        f'default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]\n'
        "[engine]\n"
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
    )


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc.strerror})"


def _wait_until_answering(engine: PodmanEngine, process: subprocess.Popen[bytes]) -> float:
    """Seconds until docker-py's ping answers OK; RuntimeError with the log's tail otherwise."""
    started = time.monotonic()
    deadline = started + START_SECONDS
    last = "no answer yet"
    while time.monotonic() < deadline:
        if process.poll() is not None:
            msg = f"podman system service exited {process.returncode}:\n{_tail(engine.log)}"
            raise RuntimeError(msg)
        if engine.socket.exists():
            try:
                with closing(engine.client()) as client:
                    if client.ping():
                        return time.monotonic() - started
            except (docker.errors.DockerException, requests.RequestException) as exc:
                last = str(exc)
        time.sleep(0.1)
    msg = f"podman's socket did not answer within {START_SECONDS} s ({last}):\n{_tail(engine.log)}"
    raise RuntimeError(msg)


def _unmount_under(folder: Path) -> None:
    """Unmount what is still mounted under `folder` (deepest first), lazily if busy."""
    prefix = f"{folder}/"
    mounts = []
    with Path("/proc/self/mountinfo").open() as table:
        for line in table:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(prefix):
                mounts.append(point)
    for point in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False, timeout=30)


def _remove(engine: PodmanEngine) -> None:
    """Remove the engine's storage and folder: `podman system reset` unmounts what it mounted."""
    try:
        reset = engine.podman("system", "reset", "--force", timeout=120)
        if reset.returncode != 0:
            log.warning("podman system reset failed: %s", reset.stderr.strip()[-500:])
    except subprocess.TimeoutExpired:
        log.warning("podman system reset did not finish within 120 s")
    _unmount_under(engine.folder)
    shutil.rmtree(engine.folder, ignore_errors=True)


def load_image(engine: PodmanEngine, image: str) -> None:
    """Copy `image` from the tests' engine into Podman: `docker save` into the API's image load."""
    with closing(docker.from_env(timeout=LOAD_SECONDS)) as host, closing(engine.client()) as podman:
        saved = host.images.get(image).save(named=True)
        podman.images.load(b"".join(saved))
        podman.images.get(image)  # Podman names it localhost/<image> and resolves the short name


@contextmanager
def podman_engine(base_image: str) -> Iterator[PodmanEngine]:
    """A Podman service of its own with `base_image` loaded; stopped and removed on leaving."""
    missing = missing_setup()
    if missing is not None:
        raise RuntimeError(missing)
    folder = Path(tempfile.mkdtemp(prefix="envbuild-podman-"))
    engine = PodmanEngine(
        folder=folder, socket=folder / "podman.sock", log=folder / "service.log", pid=0
    )
    (folder / "containers.conf").write_text(containers_conf())
    process: subprocess.Popen[bytes] | None = None
    try:
        with engine.log.open("wb") as log_file:
            process = subprocess.Popen(
                ["podman", *engine.storage_options(), "system", "service", "--time=0",
                 engine.env["DOCKER_HOST"]],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                env={**os.environ, "CONTAINERS_CONF": str(folder / "containers.conf")},
                start_new_session=True,  # a Ctrl-C of the tests reaches it through stop() only
            )  # fmt: skip
        engine = PodmanEngine(folder=folder, socket=engine.socket, log=engine.log, pid=process.pid)
        seconds = _wait_until_answering(engine, process)
        log.info("podman system service answered in %.2f s", seconds)
        load_image(engine, base_image)
        yield engine
    finally:
        if process is not None:
            stop(process, STOP_SECONDS)
        with contextlib.suppress(OSError):
            _remove(engine)


@pytest.fixture(scope="session")
def podman(base_image: str) -> Iterator[PodmanEngine]:
    """The session's Podman engine (see the module's docstring); fails with the fix to apply."""
    try:
        with podman_engine(base_image) as engine:
            yield engine
    except RuntimeError as exc:
        pytest.fail(f"cannot start a Podman engine: {exc}")
