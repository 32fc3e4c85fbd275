"""The package index dies in the middle of the install: the build fails with the reason, leaves
no tag, record or container behind, and a rerun against a working index builds.

The index is real: a TLS server (its own test CA, passed with --ca-bundle) in a container on the
engine's bridge network, serving the torch wheel's dependencies from ./wheelhouse in PEP 503
layout. It serves at full speed to the lock and the rerun, and slowly to the build it dies in,
so that it can be stopped while uv downloads from it. Its address then stops answering (no
refusal: reads and connects time out, or find no route), and uv's limits must end the build."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest
from docker.models.containers import Container

from envbuild.payload.install_env import HTTP_READ_TIMEOUT_S, HTTP_RETRIES, origin
from tests.support.docker_support import REPO, TEST_LABEL, TORCH_CPU_IMAGE, envbuild, torch_cpu_args
from tests.support.fault_support import (
    finish_quietly,
    rows,
    run_containers,
    scratch,
    start,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.extended]

REPOSITORY = "envbuild-test/index-cut-{framework}"
IMAGE = "envbuild-test/index-cut-torch:2.13.0-cpu-py3.11-bookworm"
PORT = 8443
# A hang guard, not a speed target: every request uv has in flight ends within its retries of
# the read timeout, plus backoff and the engine's clean-up.
FAILURE_GUARD_S = (1 + HTTP_RETRIES) * HTTP_READ_TIMEOUT_S + 60

SERVER = r"""
import http.server, os, ssl, sys, time

class Slow(http.server.SimpleHTTPRequestHandler):
    def copyfile(self, source, outputfile):
        while chunk := source.read(16384):
            outputfile.write(chunk)
            outputfile.flush()
            if os.path.exists("/certs/slow"):
                time.sleep(0.08)  # about 200 kB/s: a download lasts long enough to be cut

    def log_message(self, format, *args):
        print(format % args, flush=True)

while not os.path.exists("/certs/ready"):
    time.sleep(0.1)
server = http.server.ThreadingHTTPServer(("0.0.0.0", 8443), lambda *a: Slow(*a, directory="/srv"))
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
context.load_cert_chain("/certs/server.pem", "/certs/server.key")
server.socket = context.wrap_socket(server.socket, server_side=True)
print("serving", flush=True)
server.serve_forever()
"""


def _normalized(wheel: str) -> str:
    return re.sub(r"[-_.]+", "-", wheel.split("-", 1)[0]).lower()


@pytest.fixture(scope="module")
def index_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PEP 503 tree (simple/<project>/<wheels>) of the torch wheel's dependencies."""
    root = tmp_path_factory.mktemp("index")
    wheels = [w for w in (REPO / "wheelhouse").glob("*.whl") if not w.name.startswith("torch-")]
    assert wheels, "no dependency wheels in ./wheelhouse; run scripts/wheelhouse.sh"
    for wheel in wheels:
        project = root / "simple" / _normalized(wheel.name)
        project.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(wheel, project / wheel.name)
    return root


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


class IndexServer:
    """The index container; `start` returns its URL once it serves TLS for its bridge IP."""

    def __init__(self, client: docker.DockerClient, tree: Path, certs: Path) -> None:
        self.client, self.tree, self.certs = client, tree, certs
        self.container: Container | None = None

    def start(self) -> str:
        if self.certs.exists():
            shutil.rmtree(self.certs)
        self.certs.mkdir(parents=True)
        (self.certs / "serve.py").write_text(SERVER)
        self.container = self.client.containers.run(
            TORCH_CPU_IMAGE, ["python3", "/certs/serve.py"], detach=True,
            labels={TEST_LABEL: "1"},
            user="0:0",  # reads the keys openssl wrote 0600 as root; the image runs as envbuild
            volumes={str(self.tree): {"bind": "/srv", "mode": "ro"},
                     str(self.certs): {"bind": "/certs", "mode": "rw"}},
        )  # fmt: skip
        self.container.reload()
        ip = self.container.attrs["NetworkSettings"]["IPAddress"]
        assert ip, "the index container has no bridge address"
        self._certificates(ip)
        (self.certs / "ready").touch()
        wait_for(lambda: b"serving" in self.logs(), "the index server", 60)
        return f"https://{ip}:{PORT}/simple"

    def _certificates(self, ip: str) -> None:
        c = self.certs
        _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                 "-subj", "/CN=envbuild test index CA", "-keyout", str(c / "ca.key"),
                 "-out", str(c / "ca.pem"),
                 "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=envbuild test index",
                 "-keyout", str(c / "server.key"), "-out", str(c / "server.csr"))  # fmt: skip
        (c / "ext.cnf").write_text(
            f"subjectAltName=IP:{ip}\nbasicConstraints=CA:FALSE\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        )
        _openssl("x509", "-req", "-in", str(c / "server.csr"), "-CA", str(c / "ca.pem"),
                 "-CAkey", str(c / "ca.key"), "-CAcreateserial", "-days", "1",
                 "-extfile", str(c / "ext.cnf"), "-out", str(c / "server.pem"))  # fmt: skip

    def slow_down(self) -> None:
        """From now on, serve at about 200 kB/s per download."""
        (self.certs / "slow").touch()

    def logs(self) -> bytes:
        assert self.container is not None
        return bytes(self.container.logs())

    def kill(self) -> None:
        assert self.container is not None
        self.container.kill()

    def remove(self) -> None:
        if self.container is not None:
            self.container.remove(force=True)
            self.container = None


@pytest.fixture
def index_server(
    docker_client: docker.DockerClient, index_tree: Path, torch_cpu_build: object, tmp_path: Path
) -> Iterator[IndexServer]:
    server = IndexServer(docker_client, index_tree, tmp_path / "certs")
    yield server
    server.remove()


def test_the_index_dying_mid_install_fails_cleanly_and_the_rerun_builds(
    docker_client: docker.DockerClient,
    index_server: IndexServer,
    base_image: str,
    wheelhouse: Path,
    tmp_path: Path,
) -> None:
    url = index_server.start()
    bundle = tmp_path / "ca.pem"  # the test CA, as a private index's CA would be given
    shutil.copyfile(index_server.certs / "ca.pem", bundle)
    report = tmp_path / "r.json"
    args = torch_cpu_args(base_image, wheelhouse, bundle, report)
    args[args.index("--repository") + 1] = REPOSITORY
    args[args.index("--index-url") + 1] = url
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "ENVBUILD_DATA_DIR": str(tmp_path / "data")}
    # The lock is resolved on the host first (uv reads the index too); the cut comes later.
    lock = ["lock", "--framework", "torch", "--framework-version", "2.13.0", "--cuda", "cpu",
            "--python", "3.11", "--wheelhouse", str(wheelhouse), "--ca-bundle", str(bundle),
            "--index-url", url]  # fmt: skip
    locked = envbuild(*lock, env=env)
    assert locked.returncode == 0, locked.stderr[-3000:]
    index_server.slow_down()
    before = index_server.logs().count(b".whl HTTP")
    # From nothing, both times: a framework image of this key that another test left on the
    # engine would otherwise be taken, and nothing would be downloaded from the index.
    process = start([*args, "--no-smoke", "--no-cache"], env)

    def installing() -> bool:
        return index_server.logs().count(b".whl HTTP") > before

    wait_for(installing, "the install to download from the index")
    index_server.kill()  # the index goes away in the middle of the install
    code, stderr = finish_quietly(process, timeout=FAILURE_GUARD_S)

    assert code == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    (result,) = json.loads(report.read_text())["results"]
    assert result["status"] == "failed"
    assert "build failed" in result["error"]
    assert "uv could not download" in result["error"], result["error"]
    assert f"from the package index at {origin(url)}" in result["error"], result["error"]
    assert scratch(process.pid) == []
    assert rows(tmp_path / "data", "built") == 0
    with pytest.raises(docker.errors.ImageNotFound):
        docker_client.images.get(IMAGE)
    log = tmp_path / "cache" / "envbuild" / "logs" / "torch2.13.0-cpu-py3.11-bookworm.log"
    assert run_containers(docker_client, process.pid, log) == []

    index_server.remove()
    url = index_server.start()  # a working index again (a new address, a new CA)
    shutil.copyfile(index_server.certs / "ca.pem", bundle)
    args[args.index("--index-url") + 1] = url
    rerun = envbuild(*args, "--no-smoke", "--no-cache", env=env)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert rows(tmp_path / "data", "built") == 2  # its framework image's, then its own
    docker_client.images.remove(IMAGE, force=True)
