"""A real registry for tests: Debian's `docker-registry` (distribution) on a loopback port.

Nothing is mocked: the server stores blobs on disk under the test's temporary directory, checks
htpasswd passwords with bcrypt and, with `token_auth=True`, trusts bearer tokens issued by a
small token server that signs ES256 JWTs with the `openssl` command-line tool (the way Docker
Hub, GHCR or Harbor hand out tokens). A missing binary fails the test with the command to run.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import http.client
import io
import json
import secrets
import shutil
import socket
import subprocess
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

import requests

from envbuild.registry import OCI_MANIFEST, RegistryClient

INSTALL_HINT = "apt-get update && apt-get install -y docker-registry apache2-utils"
TOKEN_SERVICE = "envbuild-test-registry"
TOKEN_ISSUER = "envbuild-test-token-server"


class RegistryServerError(RuntimeError):
    """The test registry could not be started (a missing binary, a server that died)."""


def _binary(name: str, fallback: str | None = None) -> str:
    path = shutil.which(name) or (fallback if fallback and Path(fallback).exists() else None)
    if path is None:
        msg = f"`{name}` is not installed; run `{INSTALL_HINT}` (as root) and rerun the tests"
        raise RegistryServerError(msg)
    return path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _der_ecdsa_to_raw(der: bytes, size: int = 32) -> bytes:
    """ECDSA signature DER SEQUENCE{r, s} -> r || s, the form JWS ES256 wants."""
    if der[0] != 0x30:
        msg = "openssl returned an unexpected ECDSA signature"
        raise RegistryServerError(msg)
    index = 3 if der[1] & 0x80 else 2  # long-form length cannot happen for P-256, but be safe
    parts = []
    for _ in range(2):
        length = der[index + 1]
        value = der[index + 2 : index + 2 + length]
        parts.append(value.lstrip(b"\0").rjust(size, b"\0"))
        index += 2 + length
    return b"".join(parts)


class TokenServer:
    """Issues registry bearer tokens (docker/distribution token auth) for known users."""

    def __init__(self, directory: Path, users: dict[str, str]) -> None:
        self.users = users
        self.requests: list[dict[str, Any]] = []  # what clients asked for (no passwords)
        self.key = directory / "token.key"
        self.cert = directory / "token.crt"
        openssl = _binary("openssl")
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
             "-nodes", "-keyout", str(self.key), "-out", str(self.cert), "-days", "2",
             "-subj", "/CN=envbuild-test-token"],
            check=True, capture_output=True,
        )  # fmt: skip
        der = subprocess.run(
            [openssl, "x509", "-in", str(self.cert), "-outform", "DER"],
            check=True,
            capture_output=True,
        ).stdout
        self._x5c = base64.b64encode(der).decode("ascii")
        self._openssl = openssl
        self.port = free_port()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", self.port), self._handler())
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def _sign(self, payload: bytes) -> bytes:
        der = subprocess.run(
            [self._openssl, "dgst", "-sha256", "-sign", str(self.key)],
            input=payload,
            check=True,
            capture_output=True,
        ).stdout
        return _der_ecdsa_to_raw(der)

    def issue(self, subject: str, scopes: list[str]) -> str:
        """A JWT granting every requested action on every requested repository."""
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "ES256", "x5c": [self._x5c]}
        claims = {
            "iss": TOKEN_ISSUER,
            "sub": subject,
            "aud": TOKEN_SERVICE,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": access,
        }
        signing_input = (
            _b64url(json.dumps(header).encode()) + "." + _b64url(json.dumps(claims).encode())
        )
        return signing_input + "." + _b64url(self._sign(signing_input.encode("ascii")))

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                scopes = query.get("scope", [])
                subject = ""
                header = self.headers.get("Authorization", "")
                if header.startswith("Basic "):
                    user, _, password = base64.b64decode(header[6:]).decode().partition(":")
                    if server.users.get(user) != password:
                        self._answer(401, {"details": "wrong username or password"})
                        return
                    subject = user
                server.requests.append(
                    {"scopes": scopes, "service": query.get("service"), "user": subject}
                )
                if not subject:
                    scopes = []  # anonymous users get a token that grants nothing
                token = server.issue(subject, scopes)
                self._answer(200, {"token": token, "expires_in": 300})

            def _answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler


class RegistryServer:
    """`docker-registry serve` on 127.0.0.1:<free port>, storing under `tmp_dir`.

    `users` turns on htpasswd (HTTP Basic) authentication, or with `token_auth=True` bearer
    token authentication through a TokenServer that knows the same users.
    """

    def __init__(
        self, tmp_dir: Path, *, users: dict[str, str] | None = None, token_auth: bool = False
    ) -> None:
        self.tmp_dir = Path(tmp_dir)
        self.users = users
        self.token_auth = token_auth
        self.port = 0
        self.token_server: TokenServer | None = None
        self.log_path = self.tmp_dir / "registry.log"
        self._process: subprocess.Popen[bytes] | None = None
        self.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def start(self) -> None:
        """Write config.yml and start the server; wait until GET /v2/ answers (200 or 401)."""
        binary = _binary("docker-registry", "/usr/bin/docker-registry")
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        if self.token_auth and self.token_server is None:
            self.token_server = TokenServer(self.tmp_dir, self.users or {})
        for _ in range(3):  # another process may grab the free port before the server binds it
            self.port = free_port()
            config = self._write_config()
            with self.log_path.open("ab") as log:
                self._process = subprocess.Popen(
                    [binary, "serve", str(config)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            if self._wait_ready(timeout=20):
                return
            self.stop()
        msg = f"docker-registry did not start; its log ends: {self.log_tail()}"
        raise RegistryServerError(msg)

    def _write_config(self) -> Path:
        lines = [
            "version: 0.1",
            "log:",
            "  level: info",
            "  accesslog:",
            "    disabled: true",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {self.tmp_dir / 'storage'}",
            "  delete:",
            "    enabled: true",
            "  maintenance:",
            "    uploadpurging:",
            "      enabled: false",
            "http:",
            f"  addr: 127.0.0.1:{self.port}",
            f"  secret: {secrets.token_hex(16)}",
        ]
        if self.users and self.token_server is not None:
            lines += [
                "auth:",
                "  token:",
                f"    realm: {self.token_server.realm}",
                f"    service: {TOKEN_SERVICE}",
                f"    issuer: {TOKEN_ISSUER}",
                f"    rootcertbundle: {self.token_server.cert}",
            ]
        elif self.users:
            lines += [
                "auth:",
                "  htpasswd:",
                "    realm: envbuild-test",
                f"    path: {self._write_htpasswd(self.users)}",
            ]
        config = self.tmp_dir / "config.yml"
        config.write_text("\n".join(lines) + "\n")
        return config

    def _write_htpasswd(self, users: dict[str, str]) -> Path:
        htpasswd = _binary("htpasswd")
        entries = []
        for user, password in users.items():
            # -i reads the password from stdin, so it never shows in the process list.
            result = subprocess.run(
                [htpasswd, "-B", "-i", "-n", user],
                input=password.encode(),
                capture_output=True,
                check=True,
            )
            entries.append(result.stdout.decode().strip())
        path = self.tmp_dir / "htpasswd"
        path.write_text("\n".join(entries) + "\n")
        return path

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                return False
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.url}/v2/", timeout=2).status_code in (200, 401):
                    return True
            time.sleep(0.1)
        return False

    def log_tail(self, lines: int = 15) -> str:
        """The last lines the server logged, for failure messages."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return " | ".join(text.strip().splitlines()[-lines:])

    def stop(self) -> None:
        """Terminate the server (and wait for it); safe to call twice or mid-test."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def close(self) -> None:
        """Stop the registry and its token server."""
        self.stop()
        if self.token_server is not None:
            self.token_server.stop()
            self.token_server = None

    def __enter__(self) -> RegistryServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@dataclass
class Fault:
    """Answer `status` to the first `times` requests that `matches(method, path)` picks."""

    matches: Callable[[str, str], bool]
    times: int = 1
    status: int = 500
    met: int = 0


class FaultyFront:
    """A reverse proxy on a loopback port in front of a real registry that answers each fault's
    status to the requests it picks, and relays every other request unchanged.

    Bodies are relayed as they arrive (Content-Length or chunked, as the engine's layer uploads
    send them), the Host header is kept, so the registry's upload Locations name the front.
    """

    def __init__(self, upstream: RegistryServer, *faults: Fault) -> None:
        self.upstream = upstream
        self.failed: list[str] = []  # "METHOD path" of each request a fault answered
        self._faults = faults
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def __enter__(self) -> FaultyFront:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.met < fault.times and fault.matches(method, path):
                    fault.met += 1
                    self.failed.append(f"{method} {path}")
                    return fault
            return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        front = self

        class Relay(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _relay(self) -> None:
                body = self._body()
                fault = front._fault(self.command, self.path)
                if fault is not None:
                    for _ in body:
                        pass  # read the request whole, as a registry that fails it late does
                    message = b"injected failure\n"
                    self.send_response(fault.status)
                    self.send_header("Content-Type", "text/plain")
                    self.send_header("Content-Length", str(len(message)))
                    self.end_headers()
                    self.wfile.write(message)
                    return
                upstream = http.client.HTTPConnection(front.upstream.host, timeout=300)
                try:
                    upstream.putrequest(self.command, self.path, skip_host=True,
                                        skip_accept_encoding=True)  # fmt: skip
                    for name, value in self.headers.items():
                        upstream.putheader(name, value)
                    upstream.endheaders()
                    for chunk in body:
                        upstream.send(chunk)
                    answer = upstream.getresponse()
                    data = answer.read()
                    self.send_response(answer.status, answer.reason)
                    for name, value in answer.getheaders():
                        if name.lower() not in (
                            "content-length",
                            "transfer-encoding",
                            "connection",
                        ):
                            self.send_header(name, value)
                    length = answer.getheader("Content-Length")
                    self.send_header("Content-Length", length if self.command == "HEAD" and length
                                     else str(len(data)))  # fmt: skip
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(data)
                finally:
                    upstream.close()

            def _body(self) -> Iterator[bytes]:
                """The request's body as it arrives, in its own framing."""
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    while True:
                        line = self.rfile.readline()
                        yield line
                        size = int(line.split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while True:  # trailers, up to the empty line
                                trailer = self.rfile.readline()
                                yield trailer
                                if trailer in (b"\r\n", b"\n", b""):
                                    return
                        while size > 0:
                            data = self.rfile.read(min(size, 1 << 20))
                            if not data:
                                return
                            size -= len(data)
                            yield data
                        yield self.rfile.readline()  # the CRLF after the chunk
                left = int(self.headers.get("Content-Length") or 0)
                while left > 0:
                    data = self.rfile.read(min(left, 1 << 20))
                    if not data:
                        return
                    left -= len(data)
                    yield data

            do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = _relay

        return Relay


def blob_commit(method: str, path: str) -> bool:
    """A request that ends a blob upload: PUT …/blobs/uploads/<id>?digest=…"""
    return method == "PUT" and "/blobs/uploads/" in path and "digest=" in path


def manifest_put(method: str, path: str) -> bool:
    """A request that writes a manifest: PUT …/manifests/<tag or digest>."""
    return method == "PUT" and "/manifests/" in path


def tiny_image(marker: str) -> tuple[bytes, bytes, bytes]:
    """(layer .tar.gz, image config JSON, manifest JSON) of a one-file OCI image."""
    tar_buffer = io.BytesIO()
    with tarfile.open(fileobj=tar_buffer, mode="w") as archive:
        data = f"envbuild registry test {marker}\n".encode()
        info = tarfile.TarInfo("hello.txt")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    layer_tar = tar_buffer.getvalue()
    layer = gzip.compress(layer_tar, mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Labels": {"org.envbuild.test": marker}},
            "rootfs": {"type": "layers", "diff_ids": [sha256(layer_tar)]},
        }
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": sha256(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": sha256(layer),
                    "size": len(layer),
                }
            ],
        },
        indent=2,  # not the client's own serialisation: the digest must be of these bytes
    ).encode()
    return layer, config, manifest


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def push_image(client: RegistryClient, repository: str, tag: str) -> tuple[str, int]:
    """Push a tiny image; returns its manifest digest (computed here) and size."""
    layer, config, manifest = tiny_image(f"{repository}:{tag}")
    client.push_blob(repository, layer, "application/vnd.oci.image.layer.v1.tar+gzip")
    client.push_blob(repository, config, "application/vnd.oci.image.config.v1+json")
    assert client.push_manifest(repository, tag, manifest, OCI_MANIFEST) == sha256(manifest)
    return sha256(manifest), len(manifest)
