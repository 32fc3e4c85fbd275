"""A rootless Docker engine the e2e tests start, run by the unprivileged user envbuild-rootless.

`rootless_engine()` starts Debian's `dockerd-rootless.sh` (docker.io's contrib folder) as that user,
with a runtime folder, a data root and a home of its own under one temporary folder, waits until
`docker info` answers on its socket, loads the base image into it from the engine the tests use
(`docker save | docker load`) and gives the environment that reaches it (`DOCKER_HOST=unix://…`).
On leaving, however the block ends, it stops the engine (SIGTERM, then SIGKILL) and removes the
folder. `scripts/engines/rootless-setup.sh` prepares the host; what it has not done fails the test
with that fix, and what the kernel forbids skips it with the reason.

Measured on the development machine (Debian bookworm, kernel 6.18, 2 cores, cgroup v1, Debian's
Docker 20.10.24 and rootlesskit 1.1.0; no udev; user namespaces allowed: user.max_user_namespaces
96363, no kernel.unprivileged_userns_clone switch):
- It starts: `docker info` answers 0.4-2.3 s after the start. Storage is the kernel's overlay2 in
  the user namespace (`userxattr`, kernel 5.11 or later), not fuse-overlayfs or vfs; only "Native
  Overlay Diff" is off (dockerd: "may cause degraded performance for building images: running in
  a user namespace").
- No cgroups: with cgroup v1 a rootless engine has none ("Cgroup Driver: none"; dockerd warns
  "Running in rootless-mode without cgroups ... boot the system in cgroup v2 mode"). `--memory`
  and `--cpus` are then accepted and silently ignored (a `--memory 64m` container sees no limit).
  `--ulimit memlock=-1:-1` (what envbuild gives GPU containers) is refused: "error setting rlimits
  for ready process: error setting rlimit type 8: operation not permitted"; `--shm-size 1g` and
  `--network none` work.
- Networking is slirp4netns: containers resolve through 10.0.2.3 and reach PyPI and
  deb.debian.org through the host's TLS-intercepting proxy, given the host CA bundle (a secret
  mount of /etc/ssl/certs/ca-certificates.crt; apt-get and `curl --cacert` to PyPI: 200). The
  engine's bridges (172.17.0.1, an --internal network's gateway) live in rootlesskit's network
  namespace: no process on the host can bind to them.
- slirp4netns opens /dev/net/tun inside the user namespace; with no udev the node is the kernel's
  root-only 0600 and rootlesskit stops with "open: Permission denied ... setting up tap tap0:
  executing [[nsenter ... ip tuntap add name tap0 mode tap] ...]: exit status 1". The setup
  script makes it 0666, as Debian's udev rules (50-udev-default.rules) do on other hosts.
- root reaches the user's socket (CAP_DAC_OVERRIDE), so the tests run envbuild and
  `/usr/bin/docker` as root with DOCKER_HOST alone; nothing runs as the user but the engine.
- `docker save | docker load` of envbuild/base:bookworm (167 MB): 3.4 s; engine up with the base
  loaded: 5.7-9.6 s.
- `DOCKER_BUILDKIT=1 /usr/bin/docker build` with `RUN --mount=type=secret` works (the engine's
  built-in BuildKit, no `# syntax` line), as do `--mount=type=cache` and the classic builder
  (DOCKER_BUILDKIT=0): a secret step 4-8 s, apt plus a PyPI fetch 5-19 s (2 cores, shared).
- `envbuild build` of the torch CPU entry with `--builder buildkit` there: 104-275 s, smoke
  included (the upper figure with other engines' tests on the same 2 cores); afterwards the
  engine stops in 1.1 s and its data root, that image in it, is removed in 9-46 s.
- Stopping: SIGTERM to rootlesskit shuts dockerd down cleanly (about 1 s); rootlesskit runs with
  `--pidns`, so a SIGKILL of it takes every process of the engine with it, and the engine's mounts
  live in its own mount namespace: nothing is left on the host but the folder, which root removes
  (its files belong to the user's subordinate ids).
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.processes import stop

log = logging.getLogger(__name__)

ROOTLESS_USER = "envbuild-rootless"
DOCKERD_ROOTLESS = Path("/usr/share/docker.io/contrib/dockerd-rootless.sh")
# Debian's docker.io client: it drives BuildKit (a newer client earlier on the PATH may lack buildx).
DOCKER_CLI = "/usr/bin/docker"
SETUP = "scripts/engines/rootless-setup.sh"
TUN = Path("/dev/net/tun")
STOP_SECONDS = 30


class RootlessUnavailable(Exception):
    """The engine cannot start: `skip` when the host forbids it, otherwise a fix to apply."""

    def __init__(self, reason: str, *, skip: bool) -> None:
        super().__init__(reason)
        self.reason = reason
        self.skip = skip


@dataclass(frozen=True, kw_only=True)
class RootlessEngine:
    """A running rootless engine: its socket, its folders and its log."""

    folder: Path
    socket: Path
    log: Path
    pid: int

    @property
    def host(self) -> str:
        return f"unix://{self.socket}"

    @property
    def env(self) -> dict[str, str]:
        """What a process (root's included) needs to talk to this engine, over os.environ;
        TLS and context settings are emptied so that they cannot send it elsewhere."""
        # envbuild's records of this engine's builds apart from the host engine's: the store
        # keys a build by its content hash, not by engine, so a build here would make the
        # host's image of the same entry look moved, and publishing it refused.
        return {
            "DOCKER_HOST": self.host,
            "DOCKER_TLS_VERIFY": "",
            "DOCKER_CERT_PATH": "",
            "DOCKER_CONTEXT": "",
            "ENVBUILD_DATA_DIR": str(self.folder / "envbuild-data"),
        }

    def docker(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """Debian's docker client against this engine, as root."""
        return subprocess.run(
            [DOCKER_CLI, "--host", self.host, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def host_refusal() -> str | None:
    """Why this kernel lets no unprivileged user make the namespaces a rootless engine needs."""
    limits = {
        "/proc/sys/user/max_user_namespaces": ("0", "user.max_user_namespaces is 0"),
        # Debian kernels before 6.1 and Ubuntu's carry this switch; upstream kernels do not.
        "/proc/sys/kernel/unprivileged_userns_clone": (
            "0",
            "kernel.unprivileged_userns_clone is 0",
        ),
        # Ubuntu 23.10 and later: AppArmor denies user namespaces to unconfined programs.
        "/proc/sys/kernel/apparmor_restrict_unprivileged_userns": (
            "1",
            "kernel.apparmor_restrict_unprivileged_userns is 1 (rootlesskit needs an AppArmor profile)",
        ),
    }
    for path, (refusing, reason) in limits.items():
        try:
            value = Path(path).read_text().strip()
        except OSError:
            continue
        if value == refusing:
            return f"unprivileged user namespaces are off: {reason} ({path})"
    return None


def missing_setup() -> str | None:
    """What rootless-setup.sh has not done on this host, with that fix; None when all is there."""
    if os.geteuid() != 0:
        return "the tests start the rootless engine as another user, which needs root"
    fix = f"run `bash {SETUP}` as root"
    for tool in ("rootlesskit", "slirp4netns", "newuidmap", "newgidmap", "setpriv"):
        if shutil.which(tool) is None:
            return f"no {tool} on the PATH: {fix}"
    if not DOCKERD_ROOTLESS.is_file():
        return f"no {DOCKERD_ROOTLESS} (Debian's docker.io installs it): {fix}"
    try:
        pwd.getpwnam(ROOTLESS_USER)
    except KeyError:
        return f"no user {ROOTLESS_USER}: {fix}"
    for ids in (Path("/etc/subuid"), Path("/etc/subgid")):
        lines = ids.read_text().splitlines() if ids.is_file() else []
        if not any(line.startswith(f"{ROOTLESS_USER}:") for line in lines):
            return f"{ROOTLESS_USER} has no subordinate ids in {ids}: {fix}"
    if not TUN.exists():
        return f"no {TUN} (slirp4netns needs the tun module): {fix}"
    if stat.S_IMODE(TUN.stat().st_mode) & 0o006 != 0o006:
        return f"{TUN} is not open to every user (slirp4netns opens it as {ROOTLESS_USER}): {fix}"
    return None


def _tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    # dockerd-rootless.sh runs under `set -x`: its trace says little once the daemon started.
    kept = [line for line in text.splitlines() if not line.startswith("+")]
    return "\n".join(kept[-lines:])


def _wait_until_answering(
    engine: RootlessEngine, process: subprocess.Popen[bytes], timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            msg = f"the rootless engine exited ({process.returncode}) before answering; its log:\n{_tail(engine.log)}"
            raise RootlessUnavailable(msg, skip=False)
        if engine.socket.exists() and engine.docker("info", timeout=10).returncode == 0:
            return
        time.sleep(0.2)
    msg = f"the rootless engine did not answer on {engine.socket} within {timeout:.0f} s; its log:\n{_tail(engine.log)}"
    raise RootlessUnavailable(msg, skip=False)


def load_image(engine: RootlessEngine, image: str) -> None:
    """Copy `image` from the engine of the environment (the tests' own) into `engine`."""
    with subprocess.Popen(
        [DOCKER_CLI, "save", image], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as save:
        assert save.stdout is not None
        loaded = subprocess.run(
            [DOCKER_CLI, "--host", engine.host, "load", "--quiet"],
            stdin=save.stdout,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        save.stdout.close()
        saved_error = save.stderr.read().decode(errors="replace") if save.stderr else ""
        save.wait(timeout=600)
    if save.returncode != 0 or loaded.returncode != 0:
        msg = f"cannot copy {image} into the rootless engine: {saved_error.strip()} {loaded.stderr.strip()}"
        raise RuntimeError(msg)


@contextmanager
def rootless_engine(
    *, images: tuple[str, ...] = (), start_timeout: float = 60
) -> Iterator[RootlessEngine]:
    """A rootless engine with `images` loaded, stopped and removed whatever happens in the block."""
    refusal = host_refusal()
    if refusal:
        raise RootlessUnavailable(refusal, skip=True)
    missing = missing_setup()
    if missing:
        raise RootlessUnavailable(missing, skip=False)
    user = pwd.getpwnam(ROOTLESS_USER)
    # Not pytest's temporary folder: it is root's alone (0700), and the user must reach its own.
    folder = Path(tempfile.mkdtemp(prefix="envbuild-rootless-"))
    process: subprocess.Popen[bytes] | None = None
    try:
        for name in ("run", "data", "home"):
            (folder / name).mkdir()
        for path in (folder, *folder.iterdir()):
            os.chown(path, user.pw_uid, user.pw_gid)
        engine_log = folder / "dockerd.log"
        env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            # A home of its own: dockerd keeps key.json and reads daemon.json under $HOME/.config.
            "HOME": str(folder / "home"),
            "XDG_RUNTIME_DIR": str(folder / "run"),
            "DOCKERD_ROOTLESS_ROOTLESSKIT_FLAGS": "--pidns",
        }
        started = time.monotonic()
        with engine_log.open("wb") as log_file:
            process = subprocess.Popen(
                [
                    "setpriv",
                    f"--reuid={user.pw_uid}",
                    f"--regid={user.pw_gid}",
                    "--init-groups",
                    str(DOCKERD_ROOTLESS),
                    "--data-root",
                    str(folder / "data"),
                ],
                env=env,
                cwd=folder,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                # Its own session: a Ctrl-C meant for pytest must not stop it before the cleanup.
                start_new_session=True,
            )
        engine = RootlessEngine(
            folder=folder, socket=folder / "run" / "docker.sock", log=engine_log, pid=process.pid
        )
        _wait_until_answering(engine, process, start_timeout)
        log.info("rootless engine answering after %.1f s", time.monotonic() - started)
        for image in images:
            started = time.monotonic()
            load_image(engine, image)
            log.info("%s loaded in %.1f s", image, time.monotonic() - started)
        yield engine
    finally:
        started = time.monotonic()
        if process is not None:
            stop(process, STOP_SECONDS)
        stopped = time.monotonic()
        shutil.rmtree(folder, ignore_errors=True)
        log.info(
            "rootless engine stopped in %.1f s, its folder removed in %.1f s",
            stopped - started,
            time.monotonic() - stopped,
        )


@pytest.fixture(scope="session")
def rootless_docker(base_image: str) -> Iterator[RootlessEngine]:
    """A rootless engine holding the base image, for the whole session (skipped where the
    kernel forbids one; a host not set up fails with the fix)."""
    try:
        with rootless_engine(images=(base_image,)) as engine:
            yield engine
            return
    except RootlessUnavailable as exc:
        unavailable = exc  # skipped or failed outside the handler: no chained traceback
    if unavailable.skip:
        pytest.skip(unavailable.reason)
    pytest.fail(unavailable.reason, pytrace=False)
