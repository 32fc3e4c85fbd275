"""A corporate network for the tests: every server real, each in a container that
`testcontainers` starts from an image this test session builds (tests/fixtures/corp/Dockerfile, from the
locally bootstrapped Debian base; nothing is pulled).

    host, build containers ──(Docker's default bridge)──▶ squid :3128  (HTTP Basic auth)
    squid ──(an internal network, "corp")──▶ mitmproxy :8080  (intercepts TLS with the corp CA)
    mitmproxy ──▶ pypi.corp:443  (stunnel: a certificate from the index CA, which only
                                  mitmproxy trusts) ──▶ pypiserver :8080 (htpasswd: the token)
    dockerd, envbuild ──▶ registry at <bridge gateway>:<port>  (TLS from the corp CA, htpasswd)

The index is on the internal network alone: a build reaches it only through the proxy, and a
client sees it only through the interception (its own certificate is from a CA no client is
given), so a build that installs from it proves both. The corp CA's certificate is what a user
passes as `--ca-bundle`; its private key, like the index token, the proxy password and the
registry password, is a secret the tests search every output for (`CorpNetwork.needles`).

Every container and the network carry TEST_LABEL and are removed when the fixture ends; the
image is removed with the session's other test images. Readiness is a real request through the
whole chain, never a sleep.
"""

from __future__ import annotations

import contextlib
import secrets
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import docker
import requests
import trustme
from testcontainers.core.config import testcontainers_config
from testcontainers.core.container import DockerContainer
from testcontainers.core.network import Network
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

from envbuild.engine.docker_engine import ipv4_gateway
from tests.support.docker_support import DEFAULT_BASE, REPO, TEST_LABEL

CORP_IMAGE = "envbuild-test/corp-servers:1"
CONFIG = REPO / "tests" / "fixtures" / "corp"
INDEX_HOST = "pypi.corp"
INDEX_USER = "ml-team"
PROXY_USER = "builder"
SLOW_PROXY_USER = "slow-builder"  # squid.conf gives this user 4 MB/s
REGISTRY_USER = "publisher"
READY_S = 60.0

# Ryuk, testcontainers' reaper, is an image that cannot be pulled here; the fixtures remove
# what they start (and the session's cleanup anything labelled TEST_LABEL).
testcontainers_config.ryuk_disabled = True


def build_corp_image(client: docker.DockerClient, ca_bundle: Path, tmp: Path) -> str:
    """Build CORP_IMAGE (tests/fixtures/corp/Dockerfile) with the host's CA bundle for PyPI."""
    context = tmp / "corp-image"
    context.mkdir()
    shutil.copy(CONFIG / "Dockerfile", context / "Dockerfile")
    shutil.copy(ca_bundle, context / "host-ca.pem")
    try:
        client.images.build(
            path=str(context), tag=CORP_IMAGE, labels={TEST_LABEL: "1"}, rm=True,
            buildargs={"BASE": DEFAULT_BASE},
        )  # fmt: skip
    except docker.errors.BuildError as exc:
        log = "".join(str(item.get("stream", item.get("error", ""))) for item in exc.build_log)
        msg = f"cannot build {CORP_IMAGE} from {CONFIG / 'Dockerfile'}: {exc.msg}\n{log[-3000:]}"
        raise RuntimeError(msg) from None
    return CORP_IMAGE


def htpasswd(path: Path, users: list[str], password: str, *, bcrypt: bool = False) -> None:
    """An htpasswd file of `users` (one password), written by Apache's htpasswd (bcrypt or
    MD5-apr1); the password goes through stdin, never a command line."""
    flag = "-B" if bcrypt else "-m"
    for n, user in enumerate(users):
        subprocess.run(
            ["htpasswd", *(["-c"] if n == 0 else []), flag, "-i", str(path), user],
            input=password, text=True, check=True, capture_output=True,
        )  # fmt: skip


def free_port() -> int:
    """A TCP port that nothing on this host listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0", 0))
        return int(sock.getsockname()[1])


def wait_until(what: str, probe: Callable[[], str | None], timeout: float = READY_S) -> None:
    """Call `probe` until it returns None (ready); else fail with the last thing it said."""
    deadline = time.monotonic() + timeout
    last = "not probed"
    while time.monotonic() < deadline:
        try:
            problem = probe()
        except (OSError, requests.RequestException) as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem is None:
            return
        last = problem
        time.sleep(0.2)
    msg = f"{what} was not ready after {timeout:.0f} s: {last}"
    raise RuntimeError(msg)


def _key_lines(pem: bytes) -> list[str]:
    """Lines of a PEM private key's base64 body: each alone identifies the key."""
    return [line for line in pem.decode().splitlines() if line and not line.startswith("-----")][:3]


@dataclass
class CorpNetwork:
    """The running servers and what a user of them is given (URLs, the CA bundle) and not."""

    folder: Path
    index_token: str = field(default_factory=lambda: f"tok-{secrets.token_hex(12)}")
    proxy_password: str = field(default_factory=lambda: f"px-{secrets.token_hex(12)}")
    registry_password: str = field(default_factory=lambda: f"rg-{secrets.token_hex(12)}")
    corp_ca: trustme.CA = field(default_factory=trustme.CA)
    index_ca: trustme.CA = field(default_factory=trustme.CA)
    proxy_ip: str = ""
    registry_host: str = ""
    containers: dict[str, DockerContainer] = field(default_factory=dict)
    network: Network | None = None

    @property
    def ca_bundle(self) -> Path:
        """The corp CA's certificate: what a user behind this network passes as --ca-bundle."""
        return self.folder / "corp-ca.pem"

    @property
    def index_url(self) -> str:
        return f"https://{INDEX_USER}:{self.index_token}@{INDEX_HOST}/simple"

    @property
    def proxy_url(self) -> str:
        return self.proxy_as(PROXY_USER)

    def proxy_as(self, user: str) -> str:
        return f"http://{user}:{self.proxy_password}@{self.proxy_ip}:3128"

    @property
    def needles(self) -> dict[str, str]:
        """Every secret, by name: passwords, the token, lines of both CAs' private keys."""
        found = {
            "index token": self.index_token,
            "proxy password": self.proxy_password,
            "registry password": self.registry_password,
        }
        for name, ca in (("corp CA key", self.corp_ca), ("index CA key", self.index_ca)):
            for n, line in enumerate(_key_lines(ca.private_key_pem.bytes())):
                found[f"{name} line {n + 1}"] = line
        return found

    # -- starting ------------------------------------------------------------------------

    def write_files(self, gateway: str, registry_port: int, wheels: Path) -> None:
        """The servers' configuration, keys and passwords, and the index's packages."""
        config = self.folder / "config"
        (config / "mitm").mkdir(parents=True)
        self.corp_ca.cert_pem.write_to_path(str(self.ca_bundle))
        # mitmproxy's CA: its key and certificate in one file, in its confdir.
        (config / "mitm" / "mitmproxy-ca.pem").write_bytes(
            self.corp_ca.private_key_pem.bytes() + self.corp_ca.cert_pem.bytes()
        )
        self.index_ca.cert_pem.write_to_path(str(config / "index-ca.pem"))
        index_cert = self.index_ca.issue_cert(INDEX_HOST)
        index_cert.private_key_and_cert_chain_pem.write_to_path(str(config / "index.pem"))
        registry_cert = self.corp_ca.issue_cert(gateway, "localhost", "127.0.0.1")
        registry_cert.cert_chain_pems[0].write_to_path(str(config / "registry.crt"))
        registry_cert.private_key_pem.write_to_path(str(config / "registry.key"))
        htpasswd(config / "index.htpasswd", [INDEX_USER], self.index_token)
        htpasswd(config / "proxy.htpasswd", [PROXY_USER, SLOW_PROXY_USER], self.proxy_password)
        htpasswd(config / "registry.htpasswd", [REGISTRY_USER], self.registry_password, bcrypt=True)
        for name in ("stunnel.conf", "registry.yml"):
            shutil.copy(CONFIG / name, config / name)
        packages = self.folder / "packages"
        packages.mkdir()
        for wheel in wheels.glob("*.whl"):
            try:
                (packages / wheel.name).hardlink_to(wheel)
            except OSError:
                shutil.copyfile(wheel, packages / wheel.name)
        for path in self.folder.rglob("*"):  # the servers run as other users (squid: proxy)
            path.chmod(0o755 if path.is_dir() else 0o644)
        self.registry_host = f"{gateway}:{registry_port}"

    def container(self, name: str, command: str) -> DockerContainer:
        config = self.folder / "config"
        made = (
            DockerContainer(CORP_IMAGE)
            .with_command(["sh", "-c", command])
            .with_volume_mapping(str(config), "/corp", "ro")
            .with_env("PYTHONUNBUFFERED", "1")  # mitmproxy and pypiserver log as they go
            .with_name(f"envbuild-test-corp-{name}-{secrets.token_hex(3)}")
            .with_kwargs(labels={TEST_LABEL: "1"})
        )
        self.containers[name] = made
        return made

    def start(self, client: docker.DockerClient) -> None:
        assert self.network is not None
        self.container(
            "index",
            "stunnel /corp/stunnel.conf & exec /opt/pypiserver/bin/pypi-server run -p 8080 "
            "-i 127.0.0.1 -a download,list -P /corp/index.htpasswd --disable-fallback "
            "--log-stream stdout /packages",
        ).with_volume_mapping(str(self.folder / "packages"), "/packages", "ro").with_network(
            self.network
        ).with_network_aliases(INDEX_HOST).start()
        # mitmproxy writes its certificate files next to its CA: a confdir of its own.
        self.container(
            "mitm",
            "cp -r /corp/mitm /tmp/confdir && exec mitmdump --listen-port 8080 "
            "--set confdir=/tmp/confdir --set ssl_verify_upstream_trusted_ca=/corp/index-ca.pem "
            "--set flow_detail=1 --set stream_large_bodies=1m",
        ).with_network(self.network).waiting_for(
            LogMessageWaitStrategy("Proxy server listening").with_startup_timeout(int(READY_S))
        ).start()
        mitm_ip = self.ip("mitm", self.network.name)
        squid_conf = (CONFIG / "squid.conf").read_text().replace("PARENT_IP", mitm_ip)
        (self.folder / "config" / "squid.conf").write_text(squid_conf)
        (self.folder / "config" / "squid.conf").chmod(0o644)
        # On the corp network from the start (its parent must be reachable from its first
        # request: squid marks an unreachable parent dead for a while), then on the bridge.
        squid = self.container("proxy", "exec squid -N -f /corp/squid.conf")
        squid.with_network(self.network).start()
        client.networks.get("bridge").connect(squid.get_wrapped_container().id)
        self.proxy_ip = self.ip("proxy", "bridge")
        port = int(self.registry_host.rsplit(":", 1)[1])
        self.container("registry", "exec docker-registry serve /corp/registry.yml").with_bind_ports(
            5000, port
        ).start()
        self.wait_ready()

    def ip(self, name: str, network: str) -> str:
        wrapped = self.containers[name].get_wrapped_container()
        wrapped.reload()
        return str(wrapped.attrs["NetworkSettings"]["Networks"][network]["IPAddress"])

    def wait_ready(self) -> None:
        """Ready: the index answers through squid and mitmproxy, the registry over TLS."""

        def index() -> str | None:
            answer = requests.get(
                f"https://{INDEX_HOST}/simple/torch/",
                proxies={"https": self.proxy_url},
                auth=(INDEX_USER, self.index_token),
                verify=str(self.ca_bundle),
                timeout=5,
            )
            return None if answer.status_code == 200 else f"HTTP {answer.status_code}"

        def registry() -> str | None:
            answer = requests.get(
                f"https://{self.registry_host}/v2/", verify=str(self.ca_bundle), timeout=5
            )
            return None if answer.status_code == 401 else f"HTTP {answer.status_code}"

        wait_until("the index through squid and mitmproxy", index)
        wait_until(f"the TLS registry at {self.registry_host}", registry)

    def kill_proxy(self) -> None:
        """SIGKILL squid: every connection through it drops at once."""
        self.containers["proxy"].get_wrapped_container().kill()

    def restart_proxy(self) -> None:
        """Start the killed squid again (its bridge address may change) and wait for it."""
        self.containers["proxy"].get_wrapped_container().start()
        self.proxy_ip = self.ip("proxy", "bridge")
        self.wait_ready()

    def restart_registry(self) -> None:
        """Kill and start the registry (same port, same storage) and wait for it."""
        self.containers["registry"].get_wrapped_container().restart(timeout=0)
        self.wait_ready()

    def logs(self, name: str) -> str:
        """What a server wrote: its output, and for squid its access log."""
        container = self.containers[name]
        stdout, stderr = container.get_logs()
        text = (stdout + stderr).decode(errors="replace")
        if name == "proxy":
            with contextlib.suppress(Exception):
                text += container.exec(["cat", "/tmp/access.log"]).output.decode(errors="replace")
        return text

    def stop(self) -> None:
        for container in self.containers.values():
            with contextlib.suppress(Exception):
                container.stop()
        if self.network is not None:
            with contextlib.suppress(Exception):
                self.network.remove()


@contextlib.contextmanager
def corp_network(
    client: docker.DockerClient, folder: Path, wheels: Path, ca_bundle: Path
) -> Iterator[CorpNetwork]:
    """Build the servers' image, start the servers, yield them; remove them at the end."""
    build_corp_image(client, ca_bundle, folder)
    gateway = ipv4_gateway(client.networks.get("bridge").attrs)
    assert gateway is not None, "the default bridge has no IPv4 gateway"
    corp = CorpNetwork(folder=folder / "corp")
    corp.write_files(gateway, free_port(), wheels)
    corp.network = Network(
        docker_network_kw={"internal": True, "labels": {TEST_LABEL: "1"}}
    ).create()
    try:
        corp.start(client)
        yield corp
    finally:
        corp.stop()
