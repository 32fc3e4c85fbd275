"""A remote Docker engine for tests, as GitLab CI's `docker:dind` service serves one: Debian's
`dockerd` in a container, on TCP with TLS client certificates, published on a loopback port.

`dind_engine(host, base)` builds the engine's image once (tests/support/dind.Dockerfile: the
local base with Debian's `docker.io`; tagged under envbuild-test/ and labelled org.envbuild.test,
so the session's clean-up removes it; reused while the Dockerfile and the base are unchanged),
makes a CA, a server and a client certificate laid out as docker:dind's /certs, starts `dockerd
--tlsverify` with the options DESIGN.md lists (`--privileged` is refused here), loads the base
into it (`docker save | docker load`) and yields a `DindEngine`: the environment a docker client
needs to reach it (DOCKER_HOST, DOCKER_TLS_VERIFY, DOCKER_CERT_PATH) and a docker-py client. The
container and its anonymous volume at /var/lib/docker are removed however the block ends; one
left by a killed test run is removed by the next (its owner's pid is a label).

Measured here (2 cores, the host engine 20.10, `time.monotonic` around each part; the second
figure with other test runs on the engine, load average 6): the image 9.5 s / 35 s built without
cache, 0.01 s when reused (the build is skipped while its tag exists; BuildKit's cache makes a
rebuild after the session's clean-up a few seconds); the certificates 0.01 s; dockerd answering
through TLS 0.6 s / 1.0 s after the container starts; `docker save | docker load` of the 167 MB
base 3.9 s / 9 s; removing the container and its volume 0.8 s / 3.5 s, and 27-58 s once a torch CPU
image was built in it (the volume's layers are deleted). The engine up and loaded in about 5 s on
an idle host, 14 s on a busy one. A torch CPU build and smoke test through it with
`--builder buildkit`: 130-327 s as busy as the host was (the same build on the local engine is
the benchmarks' to compare).

The docker clients are Debian's `docker.io` 20.10 (/usr/bin/docker, by its full path: a newer
client earlier on the PATH may lack buildx) and docker-py.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import logging
import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import docker
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from docker.utils import kwargs_from_env

from tests.support.docker_support import TEST_LABEL, locked, shared_root

log = logging.getLogger(__name__)

DOCKER_CLI = "/usr/bin/docker"
DOCKERFILE = Path(__file__).with_name("dind.Dockerfile")
IMAGE_REPOSITORY = "envbuild-test/dind"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
TLS_PORT = 2376  # docker:dind's, with DOCKER_TLS_CERTDIR set
OWNER_LABEL = "org.envbuild.test.dind-owner"  # the pid of the test run that started it
READY_SECONDS = 60
SERVER_NAMES = ("docker", "localhost")  # docker: the service's host name in GitLab CI
SERVER_ADDRESSES = ("127.0.0.1",)

# CAP_SYS_RESOURCE, outside this machine's bounding set, is why `--privileged` is refused here;
# the engine gets each other capability by name instead. Not PERFMON, BPF, CHECKPOINT_RESTORE
# (bits 38-40): engine 20.10 refuses them as unknown ("invalid CapAdd"), and dockerd needs none.
# In the kernel's order: the index of each is its bit in CapBnd.
CAPABILITIES = (
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ",
)  # fmt: skip


class DindError(RuntimeError):
    """The docker-in-docker engine could not be built or started."""


@dataclass(frozen=True, kw_only=True)
class CertDirs:
    """docker:dind's /certs layout: ca/ (the CA), server/ (dockerd's), client/ (DOCKER_CERT_PATH)."""

    root: Path

    @property
    def ca(self) -> Path:
        return self.root / "ca"

    @property
    def server(self) -> Path:
        return self.root / "server"

    @property
    def client(self) -> Path:
        return self.root / "client"


@dataclass(frozen=True, kw_only=True)
class DindEngine:
    """A running docker-in-docker engine and the ways to reach it."""

    container_id: str
    port: int
    certs: CertDirs
    client: docker.DockerClient

    @property
    def host(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def env(self) -> dict[str, str]:
        """What a docker client (the CLI, docker-py, envbuild) needs to use this engine."""
        # envbuild's records of this engine's builds apart from the host engine's: the store
        # keys a build by its content hash, not by engine, so a build here would make the
        # host's image of the same entry look moved, and publishing it refused.
        return {
            **client_env(self.port, self.certs),
            "ENVBUILD_DATA_DIR": str(self.certs.root.parent / "envbuild-data"),
        }


def client_env(port: int, certs: CertDirs) -> dict[str, str]:
    """DOCKER_HOST, DOCKER_TLS_VERIFY and DOCKER_CERT_PATH for the engine on `port`."""
    return {
        "DOCKER_HOST": f"tcp://127.0.0.1:{port}",
        "DOCKER_TLS_VERIFY": "1",
        "DOCKER_CERT_PATH": str(certs.client),
    }


def allowed_capabilities(status: str) -> list[str]:
    """The capabilities in CapBnd of a /proc/<pid>/status text (this machine's bounding set)."""
    line = next(x for x in status.splitlines() if x.startswith("CapBnd:"))
    bounding = int(line.split()[1], 16)
    return [name for bit, name in enumerate(CAPABILITIES) if bounding >> bit & 1]


def image_tag(host: docker.DockerClient, base: str) -> str:
    """The engine image's tag: what it is built from (the Dockerfile, the base's id) decides it."""
    digest = hashlib.sha256(DOCKERFILE.read_bytes())
    digest.update(str(host.images.get(base).id).encode())
    return f"{IMAGE_REPOSITORY}:{digest.hexdigest()[:16]}"


def build_image(host: docker.DockerClient, base: str) -> str:
    """Build the engine's image on `host` unless an image of the same inputs is there."""
    tag = image_tag(host, base)
    try:
        host.images.get(tag)
    except docker.errors.ImageNotFound:
        pass
    else:
        return tag
    if not HOST_CA_BUNDLE.is_file():
        msg = f"no CA bundle at {HOST_CA_BUNDLE}: apt in the dind image's build needs the host's"
        raise DindError(msg)
    result = subprocess.run(
        [DOCKER_CLI, "build", "--progress=plain", "--file", str(DOCKERFILE),
         "--build-arg", f"BASE={base}", "--secret", f"id=ca,src={HOST_CA_BUNDLE}",
         "--label", f"{TEST_LABEL}=1", "--tag", tag, str(DOCKERFILE.parent)],
        capture_output=True, text=True, timeout=900, check=False,
        env={**os.environ, "DOCKER_BUILDKIT": "1"},
    )  # fmt: skip
    if result.returncode != 0:
        msg = f"cannot build the dind image {tag} (exit {result.returncode}):\n{result.stderr[-3000:]}"
        raise DindError(msg)
    return tag


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file = path / "key.pem"
    key_file.touch(mode=0o600)
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


def _issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_name: x509.Name,
    name: str,
    *,
    server: bool,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
    )
    if server:
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in SERVER_NAMES]
        sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in SERVER_ADDRESSES]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        usage = ExtendedKeyUsageOID.SERVER_AUTH
    else:
        usage = ExtendedKeyUsageOID.CLIENT_AUTH
    builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def make_certs(root: Path, *, ca_name: str = "envbuild-test dind CA") -> CertDirs:
    """A CA, dockerd's server certificate and a client certificate, as docker:dind lays them out."""
    dirs = CertDirs(root=root)
    ca_key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ca_name)])
    now = datetime.datetime.now(datetime.UTC)
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write(dirs.ca, ca_key, ca_cert)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    for folder, server in ((dirs.server, True), (dirs.client, False)):
        key, cert = _issue(ca_key, name, f"envbuild-test dind {folder.name}", server=server)
        _write(folder, key, cert)
        (folder / "ca.pem").write_bytes(ca_pem)
    return dirs


def _reap_leftovers(host: docker.DockerClient) -> None:
    """Remove dind containers (and volumes) whose test run is gone: a SIGKILLed run leaves them."""
    for container in host.containers.list(all=True, filters={"label": OWNER_LABEL}):
        owner = int(container.labels.get(OWNER_LABEL, "0") or 0)
        try:
            os.kill(owner, 0)
        except ProcessLookupError:
            log.info("removing the dind engine %s left by run %s", container.short_id, owner)
            _remove(host, str(container.id))
        except PermissionError:
            pass  # alive, another user's


def _remove(host: docker.DockerClient, container_id: str) -> None:
    """Remove the container and its anonymous volumes (`docker rm -fv`)."""
    try:
        container = host.containers.get(container_id)
    except docker.errors.NotFound:
        return
    volumes = [m["Name"] for m in container.attrs.get("Mounts") or [] if m.get("Type") == "volume"]
    container.remove(force=True, v=True)
    for name in volumes:  # rm -v removes anonymous volumes; a named one is not ours to keep
        with suppress(docker.errors.NotFound):
            host.volumes.get(name).remove(force=True)


def _create(host: docker.DockerClient, image: str, certs: CertDirs) -> str:
    """Create the dockerd container; its id."""
    status = Path("/proc/self/status").read_text()
    host_config = host.api.create_host_config(
        cap_add=allowed_capabilities(status),
        security_opt=["seccomp=unconfined", "apparmor=unconfined"],
        binds={
            "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
            str(certs.root): {"bind": "/certs", "mode": "ro"},
        },
        cgroupns="host",
        tmpfs={"/run": ""},
        port_bindings={TLS_PORT: ("127.0.0.1", None)},  # None: the engine picks a free port
    )
    # `--security-opt systempaths=unconfined` is the CLI's: in the API it is no masked and no
    # read-only paths (an empty list; a missing one means the defaults).
    host_config["MaskedPaths"] = []
    host_config["ReadonlyPaths"] = []
    command = [
        "--host", f"tcp://0.0.0.0:{TLS_PORT}", "--tlsverify",
        "--tlscacert", "/certs/server/ca.pem",
        "--tlscert", "/certs/server/cert.pem",
        "--tlskey", "/certs/server/key.pem",
    ]  # fmt: skip
    created = host.api.create_container(
        image,
        command=command,
        volumes=["/var/lib/docker"],  # anonymous, as `-v /var/lib/docker`
        ports=[TLS_PORT],
        labels={TEST_LABEL: "1", OWNER_LABEL: str(os.getpid())},
        host_config=host_config,
    )
    return str(created["Id"])


def _published_port(host: docker.DockerClient, container_id: str) -> int:
    bindings = host.api.port(container_id, TLS_PORT) or []
    return int(bindings[0]["HostPort"])


def _log_tail(host: docker.DockerClient, container_id: str) -> str:
    try:
        return host.api.logs(container_id, tail=30).decode(errors="replace")
    except docker.errors.APIError as exc:
        return f"(no log: {exc})"


def _wait_ready(host: docker.DockerClient, container_id: str, env: dict[str, str]) -> str:
    """Wait until `docker version` answers through TLS: the engine's API version. DindError with
    dockerd's log tail if it does not in time."""
    deadline = time.monotonic() + READY_SECONDS
    last = ""
    while time.monotonic() < deadline:
        state = host.api.inspect_container(container_id)["State"]
        if not state["Running"]:
            msg = (
                f"dockerd in {container_id[:12]} exited ({state['ExitCode']}) before it "
                f"answered; its log ends:\n{_log_tail(host, container_id)}"
            )
            raise DindError(msg)
        result = subprocess.run(
            [DOCKER_CLI, "version", "--format", "{{.Server.APIVersion}}"],
            capture_output=True, text=True, timeout=30, check=False, env={**os.environ, **env},
        )  # fmt: skip
        if result.returncode == 0 and result.stdout.strip():
            return result.stdout.strip()
        last = result.stderr.strip()
        time.sleep(0.25)
    msg = (
        f"dockerd in {container_id[:12]} did not answer `docker version` at {env['DOCKER_HOST']} "
        f"within {READY_SECONDS} s (last: {last}); its log ends:\n{_log_tail(host, container_id)}"
    )
    raise DindError(msg)


def tls_client(env: dict[str, str], api_version: str) -> docker.DockerClient:
    """docker-py's client for the engine `env` names, verifying it with DOCKER_CERT_PATH's CA.

    Not `docker.from_env`: requests lets REQUESTS_CA_BUNDLE or CURL_CA_BUNDLE (set on this host,
    as behind most TLS-intercepting proxies) replace the client's CA, and the engine's certificate
    then fails to verify (docker-py issues #2433, #2598). trust_env=False keeps the CA; it is set
    before the first request, so the API version is given rather than asked."""
    kwargs = kwargs_from_env(environment=env)
    client = docker.DockerClient(**kwargs, version=api_version, timeout=600)
    client.api.trust_env = False
    return client


def load_image(engine: DindEngine, ref: str) -> None:
    """`docker save ref | docker load` from the host engine into the dind engine."""
    save = subprocess.Popen(
        [DOCKER_CLI, "save", ref], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert save.stdout is not None
    try:
        loaded = subprocess.run(
            [DOCKER_CLI, "load", "--quiet"], stdin=save.stdout, capture_output=True,
            text=True, timeout=600, check=False, env={**os.environ, **engine.env},
        )  # fmt: skip
    finally:
        save.stdout.close()
        saved = save.wait(timeout=60)
    if saved != 0 or loaded.returncode != 0:
        error = save.stderr.read().decode(errors="replace") if save.stderr else ""
        msg = f"cannot load {ref} into the dind engine: {error.strip()} {loaded.stderr.strip()}"
        raise DindError(msg)


@contextmanager
def dind_engine(
    host: docker.DockerClient, base: str, workdir: Path, *, timings: dict[str, float] | None = None
) -> Iterator[DindEngine]:
    """A running docker-in-docker engine holding `base`; removed with its volume on exit.
    `timings`, when given, gets the seconds each part took."""
    spent = timings if timings is not None else {}
    mark = time.monotonic()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.monotonic()
        spent[name] = now - mark
        mark = now

    _reap_leftovers(host)
    image = build_image(host, base)
    lap("image")
    certs = make_certs(workdir / "certs")
    lap("certs")
    container_id = _create(host, image, certs)
    client: docker.DockerClient | None = None
    try:
        host.api.start(container_id)
        port = _published_port(host, container_id)
        env = client_env(port, certs)
        api_version = _wait_ready(host, container_id, env)
        lap("ready")
        client = tls_client(env, api_version)
        engine = DindEngine(container_id=container_id, port=port, certs=certs, client=client)
        load_image(engine, base)
        lap("load")
        yield engine
    finally:
        mark = time.monotonic()
        if client is not None:
            client.close()
        _remove(host, container_id)
        lap("remove")


@pytest.fixture(scope="session", name="dind")
def dind_fixture(
    docker_client: docker.DockerClient,
    base_image: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[DindEngine]:
    """A docker-in-docker engine for the session (one per lane; its image built once for all)."""
    root = shared_root(tmp_path_factory)
    with locked(root / "dind-image.lock"):
        build_image(docker_client, base_image)
    with dind_engine(docker_client, base_image, tmp_path_factory.mktemp("dind")) as engine:
        yield engine
