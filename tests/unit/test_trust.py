"""Restricted networks: the CAs envbuild's own HTTPS trusts (`--ca-bundle`, envbuild.net.trust), and
the one line that names an index refusing uv (401/403), on the host and inside the image.

Every server here is real: http.server in a thread on loopback, speaking TLS with a certificate
of a test CA (trustme) where the case is about trust. The registry host is `0.0.0.0:PORT`: Linux
connects it to this machine, yet it is no loopback name to envbuild, so the client speaks https
to it as to a remote registry (a loopback registry gets plain http, as Docker allows).
"""

from __future__ import annotations

import socket
import ssl
import tempfile
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest
import requests
import trustme
from click.testing import CliRunner, Result

from envbuild.cli.main import main
from envbuild.core.interrupt import remove_scratch, scratch_prefix
from envbuild.core.models import NO_FRAMEWORK_INDEX, BuildOptions, Entry, Selection
from envbuild.knowledge.load import load_knowledge
from envbuild.lock.uv import refused_index
from envbuild.net.trust import chosen_bundle, default_store, trust_session, trusting, verify_setting
from envbuild.payload import install_env
from envbuild.registry.connection import RegistryConnection
from envbuild.registry.errors import RegistryUnreachable
from tests.support.lock_support import the_entry

TOKEN = "tok-3xYz-s3cret"  # a credential that must never be shown
USER = "team-bot"
PAGE = "/simple/torch/"
PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")

Answers = Mapping[str, tuple[int, Mapping[str, str]]]


class _Server4(ThreadingHTTPServer):
    daemon_threads = True


class _Server6(_Server4):
    address_family = socket.AF_INET6


class Site:
    """A real HTTP(S) server on `host` (a loopback address) answering GET with the status
    `answers` gives each path (404 otherwise); it records each path with its Authorization."""

    def __init__(
        self, answers: Answers | None = None, *, host: str = "127.0.0.1",
        cert: trustme.LeafCert | None = None,
    ) -> None:  # fmt: skip
        self.answers = dict(answers or {})
        self.seen: list[tuple[str, str | None]] = []
        owner = self

        class Handle(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                owner.seen.append((self.path, self.headers.get("Authorization")))
                status, headers = owner.answers.get(self.path, (404, {}))
                self.send_response_only(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self._server = (_Server6 if ":" in host else _Server4)((host, 0), Handle)
        if cert is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            cert.configure_cert(context)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        self.origin = f"{'https' if cert else 'http'}://{shown}:{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    def __enter__(self) -> Site:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)


def dead_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No proxy, CA bundle or Docker config of this machine's reaches these tests."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))
    monkeypatch.setenv("ENVBUILD_REGISTRY_TIMEOUT", "30")


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def ca_pem(ca: trustme.CA, tmp_path: Path) -> Path:
    path = tmp_path / "team-ca.pem"
    ca.cert_pem.write_to_path(str(path))
    return path


@pytest.fixture
def other_pem(tmp_path: Path) -> Path:
    """The PEM of a CA that signs nothing here."""
    path = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(path))
    return path


@pytest.fixture
def registry(ca: trustme.CA) -> Iterator[Site]:
    """A registry over https whose certificate only the test CA signs."""
    cert = ca.issue_cert("0.0.0.0", "127.0.0.1")  # names to connect to
    with Site(
        {"/v2/": (200, {"Docker-Distribution-API-Version": "registry/2.0"})}, cert=cert
    ) as site:
        yield site


def registry_url(site: Site) -> str:
    return f"https://0.0.0.0:{site.port}/v2/"


# -- the trust of envbuild's own requests -----------------------------------------------------


def test_a_session_trusts_the_bundle_only_when_given_it(registry: Site, ca_pem: Path) -> None:
    with requests.Session() as plain:
        trust_session(plain, None)
        with pytest.raises(requests.exceptions.SSLError):
            plain.get(registry_url(registry), timeout=30)
    with requests.Session() as trusting_session:
        trust_session(trusting_session, ca_pem)
        assert trusting_session.get(registry_url(registry), timeout=30).status_code == 200


def test_the_bundle_wins_over_requests_ca_bundle(
    registry: Site, ca_pem: Path, other_pem: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(other_pem))
    # requests alone takes the environment's bundle:
    with requests.Session() as unwrapped, pytest.raises(requests.exceptions.SSLError):
        unwrapped.get(registry_url(registry), timeout=30)
    with requests.Session() as session:
        trust_session(session, ca_pem)
        assert session.get(registry_url(registry), timeout=30).status_code == 200


def test_the_default_store_stays_trusted_beside_the_bundle(
    registry: Site, ca_pem: Path, other_pem: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(ca_pem))  # the machine's store signs the registry
    assert default_store() == str(ca_pem)
    with requests.Session() as session:
        trust_session(session, other_pem)  # --ca-bundle adds a CA; it takes none away
        assert session.get(registry_url(registry), timeout=30).status_code == 200


def test_the_verify_file_holds_the_default_store_and_the_bundle_once(
    ca_pem: Path, other_pem: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert verify_setting(None) is True
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(other_pem))
    first = verify_setting(ca_pem)
    assert isinstance(first, str)
    text = Path(first).read_bytes()
    assert other_pem.read_bytes().strip() in text
    assert ca_pem.read_bytes().strip() in text
    assert verify_setting(ca_pem) == first  # one file per bundle and store, not one per session
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(other_pem.parent / "gone.pem"))
    assert default_store() != str(other_pem.parent / "gone.pem")  # a missing file is no store


def test_an_interrupt_removes_the_verify_file_and_a_later_request_makes_it_again(
    ca_pem: Path,
) -> None:
    """An interrupt ends the process with os._exit, so no atexit handler runs: the combined file
    is this run's scratch, which the interrupt removes with the rest (it was left in /tmp)."""
    first = Path(str(verify_setting(ca_pem)))
    assert first.name.startswith(scratch_prefix("ca")), first
    other = Path(tempfile.gettempdir()) / f"{scratch_prefix('context')}x"
    other.mkdir()
    assert remove_scratch() >= 2
    assert not first.exists()
    assert not other.exists()
    again = Path(str(verify_setting(ca_pem)))
    assert again.is_file()
    assert ca_pem.read_bytes().strip() in again.read_bytes()


def test_trusting_sets_the_bundle_for_its_block_only(ca_pem: Path) -> None:
    assert chosen_bundle() is None
    with trusting(ca_pem):
        assert chosen_bundle() == ca_pem
        with trusting(None):
            assert chosen_bundle() is None
        assert chosen_bundle() == ca_pem
    assert chosen_bundle() is None


def test_the_registry_client_reaches_a_privately_signed_registry_with_the_bundle(
    registry: Site, ca_pem: Path
) -> None:
    host = f"0.0.0.0:{registry.port}"
    with trusting(ca_pem), RegistryConnection.for_host(host) as client:
        assert client.scheme == "https"
        response = client.exchange("GET", f"{client.base_url}/v2/", what="the API check")
        assert client.read(response, "the API check", 1024).status == 200
    assert registry.seen == [("/v2/", None)]


def test_without_the_bundle_the_registry_client_says_to_pass_it(registry: Site) -> None:
    host = f"0.0.0.0:{registry.port}"
    with RegistryConnection.for_host(host) as client, pytest.raises(RegistryUnreachable) as error:
        client.exchange("GET", f"{client.base_url}/v2/", what="the API check")
    (line,) = error.value.message.splitlines()
    assert "TLS verification failed" in line
    assert "--ca-bundle" in line
    assert f"/etc/docker/certs.d/{host}/ca.crt" in line


def test_a_dead_proxy_is_named_not_the_registry_alone(registry: Site) -> None:
    from envbuild.core.models import ProxySettings

    host = f"0.0.0.0:{registry.port}"
    proxy = ProxySettings(
        http=f"http://u:Pw-dead@127.0.0.1:{dead_port()}",
        https=f"http://u:Pw-dead@127.0.0.1:{dead_port()}",
    )
    with RegistryConnection.for_host(host, proxy=proxy) as client:
        client.transport.backoff = 0
        with pytest.raises(RegistryUnreachable) as error:
            client.exchange("GET", f"{client.base_url}/v2/", what="the API check")
    (line,) = error.value.message.splitlines()
    assert "through the proxy http://127.0.0.1:" in line
    assert "NO_PROXY" in line
    assert "Pw-dead" not in line
    assert registry.seen == []


# -- --ca-bundle on the command line ----------------------------------------------------------


def invoke(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def assert_one_error_line(result: Result, option: str, code: int = 2) -> str:
    assert result.exit_code == code, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"envbuild: error: {option}"), line
    return line


def test_publish_refuses_a_missing_ca_bundle_before_the_engine(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    result = invoke("publish", "envbuild/torch:x", "--registry", "h", "--ca-bundle", str(missing))
    line = assert_one_error_line(result, "--ca-bundle ")
    assert "missing.pem" in line
    assert "no such file" in line


def test_verify_refuses_a_ca_bundle_without_a_certificate(tmp_path: Path) -> None:
    empty = tmp_path / "notes.txt"
    empty.write_text("no certificate here\n")
    result = invoke("verify", "127.0.0.1:9/team/torch:1", "--ca-bundle", str(empty))
    line = assert_one_error_line(result, "--ca-bundle ")
    assert "holds no PEM certificate" in line


def test_verify_talks_tls_to_the_registry_with_the_ca_bundle(registry: Site, ca_pem: Path) -> None:
    reference = f"0.0.0.0:{registry.port}/team/torch:2.4"
    refused = invoke("verify", reference)
    line = assert_one_error_line(refused, "cannot reach registry", code=1)
    assert "--ca-bundle" in line
    assert "certs.d" in line
    assert registry.seen == []  # the handshake failed: no request got through
    trusted = invoke("verify", reference, "--ca-bundle", str(ca_pem))
    assert trusted.exit_code != 0  # the registry holds no such image ...
    assert "TLS" not in trusted.stderr  # ... but it was reached over TLS and asked
    assert [path for path, _ in registry.seen if path.startswith("/v2/team/torch/")]


# -- an index that refuses uv, asked from the host (uv_resolve) -------------------------------


@pytest.fixture(scope="module")
def torch_cpu() -> Entry:
    """An entry whose framework comes from its own index (PyTorch's CPU index)."""
    entry = the_entry(
        load_knowledge(), Selection(framework="torch", framework_version="2.13.0", cuda="cpu")
    )
    assert entry.install.index_url is not None
    return entry


def with_credentials(origin: str, path: str = "/simple") -> str:
    scheme, rest = origin.split("://")
    return f"{scheme}://{USER}:{TOKEN}@{rest}{path}"


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_an_index_refusing_the_token_is_named_without_it(torch_cpu: Entry, host: str) -> None:
    with Site({PAGE: (403, {})}, host=host) as index:
        options = BuildOptions(
            index_url=with_credentials(index.origin), framework_index=NO_FRAMEWORK_INDEX
        )
        line = refused_index(torch_cpu, options)
    assert line is not None
    assert f"the package index at {index.origin} answered HTTP 403 to {PAGE}" in line
    assert "it refused the credentials" in line
    assert TOKEN not in line
    assert USER not in line
    (_, authorization) = index.seen[0]
    assert authorization is not None  # it was asked with the URL's credentials
    assert index.seen == [(PAGE, authorization)]


def test_an_index_wanting_credentials_says_so(torch_cpu: Entry) -> None:
    with Site({PAGE: (401, {"WWW-Authenticate": 'Basic realm="pypi"'})}) as index:
        options = BuildOptions(index_url=f"{index.origin}/simple/", framework_index="none")
        line = refused_index(torch_cpu, options)
    assert line is not None
    assert f"{index.origin} answered HTTP 401" in line
    assert "it wants credentials" in line


def test_a_framework_mirror_refusing_is_named(torch_cpu: Entry) -> None:
    with Site({"/whl/cpu/torch/": (403, {})}) as mirror:
        options = BuildOptions(framework_index=with_credentials(mirror.origin, "/whl/cpu"))
        line = refused_index(torch_cpu, options)
    assert line is not None
    assert f"the package index at {mirror.origin} answered HTTP 403 to /whl/cpu/torch/" in line
    assert TOKEN not in line


def test_an_index_that_answers_or_is_dead_explains_nothing(torch_cpu: Entry) -> None:
    with Site({PAGE: (200, {})}) as index:
        options = BuildOptions(
            index_url=with_credentials(index.origin),
            extra_index_urls=(f"http://127.0.0.1:{dead_port()}/simple",),
            framework_index="none",
        )
        assert refused_index(torch_cpu, options) is None
    assert [path for path, _ in index.seen] == [PAGE]


# -- the same inside the image (payload/install_env, stdlib only) -----------------------------


def config(index_url: str | None, *extras: str) -> install_env.Config:
    return install_env.Config(
        index_url=index_url, extra_index_urls=extras, find_links=False, offline=False,
        ca_bundle=False,
    )  # fmt: skip


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_the_installer_names_an_index_refusing_the_token(host: str) -> None:
    with Site({PAGE: (403, {})}, host=host) as index:
        line = install_env.refused_index(config(with_credentials(index.origin)), "torch", None)
    assert line is not None
    assert f"the package index at {index.origin} answered HTTP 403 to {PAGE}" in line
    assert "it refused the credentials" in line
    assert TOKEN not in line
    assert USER not in line
    assert index.seen[0][1] is not None


def test_the_installer_says_nothing_of_an_index_that_answers_or_is_dead() -> None:
    with Site({PAGE: (200, {})}) as index:
        dead = f"http://127.0.0.1:{dead_port()}/simple"
        assert (
            install_env.refused_index(config(dead, f"{index.origin}/simple"), "torch", None) is None
        )
    assert [path for path, _ in index.seen] == [PAGE]


def test_the_installer_asks_over_tls_with_the_builds_ca(ca: trustme.CA, ca_pem: Path) -> None:
    cert = ca.issue_cert("127.0.0.1")
    with Site({PAGE: (401, {})}, cert=cert) as index:
        url = f"{index.origin}/simple"
        assert install_env.refused_index(config(url), "torch", None) is None  # not trusted
        line = install_env.refused_index(config(url), "torch", str(ca_pem))
    assert line is not None
    assert f"{index.origin} answered HTTP 401" in line
    assert "it wants credentials" in line


def test_the_installer_never_sends_the_token_to_where_an_index_redirects() -> None:
    with Site({PAGE: (403, {})}) as elsewhere:
        moved = {PAGE: (302, {"Location": f"{elsewhere.origin}{PAGE}"})}
        with Site(moved) as index:
            install_env.refused_index(config(with_credentials(index.origin)), "torch", None)
        assert index.seen[0][1] is not None
    assert all(authorization is None for _, authorization in elsewhere.seen)


def test_a_ca_bundle_ssl_cannot_load_leaves_uvs_own_message(tmp_path: Path) -> None:
    fake = tmp_path / "ca.crt"  # passes the host's check (it holds the PEM marker) ...
    fake.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    with Site({PAGE: (403, {})}) as index:  # ... but ssl cannot load it
        assert (
            install_env.refused_index(config(f"{index.origin}/simple"), "torch", str(fake)) is None
        )


def test_the_first_pinned_package_of_the_lock_is_asked_for(tmp_path: Path) -> None:
    lock = tmp_path / "envbuild.lock"
    lock.write_text(
        "# envbuild lock\n# inputs: abc\n\n    --hash=sha256:00\n"
        "filelock==3.16.1 \\\n    --hash=sha256:11\ntorch==2.13.0+cpu \\\n    --hash=sha256:22\n"
    )
    assert install_env.first_package(str(lock)) == "filelock"
    lock.write_text("# nothing pinned\n")
    assert install_env.first_package(str(lock)) == "pip"
