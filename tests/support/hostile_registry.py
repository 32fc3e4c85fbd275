"""A real HTTP server on 127.0.0.1 that plays a registry, well or badly, for the client's tests.

`HostileRegistry(handler)` listens on a free port (stdlib http.server in a thread) and answers
every request with what `handler(seen)` returns: an `Answer` (status, headers, body as bytes or
chunks, a pause between chunks, a lying or missing Content-Length, or no answer at all). Every
request is recorded with its headers and body, so a test can check which server saw which
credentials, and a handler can store what a client uploads.

`Published` is a small valid image with envbuild evidence attached (image manifest, config,
evidence artifact, smoke report, package list); `Published.routes()` serves it the way the OCI
distribution API does, and each field can be replaced to make one answer malformed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import ssl
import subprocess
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
EVIDENCE_TYPE = "application/vnd.envbuild.evidence.v1+json"
REPOSITORY = "team/torch"
TAG = "2.4"


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canonical(document: Any) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Seen:
    """One request as the server received it."""

    method: str
    path: str  # with the query
    headers: dict[str, str]
    body: bytes = field(default=b"", repr=False)  # what a PUT or POST sent (Content-Length)

    @property
    def authorization(self) -> str | None:
        return next((v for k, v in self.headers.items() if k.lower() == "authorization"), None)


@dataclass
class Answer:
    """What the server sends back. `length`: "auto" (the body's), an int (a lie) or None (none:
    the body ends when the connection closes)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes | Iterable[bytes] = b""
    length: int | str | None = "auto"
    pause: float = 0.0  # seconds before each chunk
    stall: bool = False  # read the request, then never answer
    hold: bool = False  # after what it sent, keep the connection open and send nothing more
    raw: Iterable[bytes] | None = None  # bytes sent as they are, status line and all


Handler = Callable[[Seen], Answer]


class HostileRegistry:
    """A server on 127.0.0.1:<free port> answering with `handler`; a context manager.

    With `tls` (a certificate and key from `self_signed`) it speaks https.
    """

    def __init__(
        self, handler: Handler | None = None, *, tls: tuple[Path, Path] | None = None
    ) -> None:
        self.handler: Handler = handler or (lambda seen: Answer(status=404))
        self.seen: list[Seen] = []
        self.sent_bytes = 0  # body bytes the server managed to write, over all requests
        self._stop = threading.Event()
        self._lock = threading.Lock()
        owner = self

        class Handle(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in separate writes: with Nagle's algorithm the body
            # waits for the client's delayed ACK, 40 ms on every kept-alive answer.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                seen = Seen(self.command, self.path, dict(self.headers.items()), body)
                with owner._lock:
                    owner.seen.append(seen)
                owner._answer(self, owner.handler(seen))

            do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handle)
        self._server.daemon_threads = True
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self.port = self._server.server_address[1]
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"{'https' if tls else 'http'}://{self.host}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    def _answer(self, handle: BaseHTTPRequestHandler, answer: Answer) -> None:
        if answer.stall:
            self._stop.wait(120)
            handle.close_connection = True
            return
        if answer.raw is not None:
            handle.close_connection = True
            self._write(handle, answer.raw, answer.pause)
            self._hold(answer)
            return
        chunks = [answer.body] if isinstance(answer.body, bytes) else answer.body
        handle.send_response_only(answer.status)
        for name, value in answer.headers.items():
            handle.send_header(name, value)
        if answer.length == "auto" and isinstance(answer.body, bytes):
            handle.send_header("Content-Length", str(len(answer.body)))
        elif isinstance(answer.length, int):
            handle.send_header("Content-Length", str(answer.length))
        else:
            handle.send_header("Connection", "close")
            handle.close_connection = True
        handle.end_headers()
        if handle.command != "HEAD":
            self._write(handle, chunks, answer.pause)
        self._hold(answer)

    def _hold(self, answer: Answer) -> None:
        if answer.hold:
            self._stop.wait(120)

    def _write(self, handle: BaseHTTPRequestHandler, chunks: Iterable[bytes], pause: float) -> None:
        try:
            for chunk in chunks:
                if pause and self._stop.wait(pause):
                    break
                handle.wfile.write(chunk)
                handle.wfile.flush()
                with self._lock:
                    self.sent_bytes += len(chunk)
        except OSError:  # the client hung up: what a bounded client does
            handle.close_connection = True

    def requests_to(self, pattern: str) -> list[Seen]:
        return [s for s in self.seen if re.search(pattern, s.path)]

    def close(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> HostileRegistry:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


# -- content: a valid published image with its evidence --------------------------------


def json_answer(body: bytes, media_type: str = "application/json", **headers: str) -> Answer:
    return Answer(headers={"Content-Type": media_type, **headers}, body=body)


def oci_error(status: int, code: str, message: str) -> Answer:
    body = canonical({"errors": [{"code": code, "message": message}]})
    return Answer(status=status, headers={"Content-Type": "application/json"}, body=body)


@dataclass(frozen=True)
class Published:
    """An image and its evidence as a registry stores them; replace a field to break one."""

    smoke: bytes = b""  # the smoke report; empty: a passing one for this image
    packages: bytes = b"# pip freeze\ntorch==2.4.1\nnumpy==2.0.2\n"
    config: bytes = (
        b'{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}'
    )
    image_manifest: bytes = b""  # empty: a valid one for `config`
    evidence_manifest: bytes = b""  # empty: a valid one for the subject and the files
    referrers_index: bytes = b""  # empty: a valid index listing the evidence manifest
    train: dict[str, Any] = field(default_factory=lambda: {"loss_first": 2.3, "loss_last": 0.4})

    @property
    def image_id(self) -> str:
        return sha256(self.config)

    def smoke_report(self) -> bytes:
        if self.smoke:
            return self.smoke
        return canonical({"image_id": self.image_id, "passed": True, "train": self.train})

    def manifest(self) -> bytes:
        if self.image_manifest:
            return self.image_manifest
        return canonical(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": {
                    "mediaType": "application/vnd.oci.image.config.v1+json",
                    "digest": self.image_id,
                    "size": len(self.config),
                },
                "layers": [],
            }
        )

    def evidence(self) -> bytes:
        if self.evidence_manifest:
            return self.evidence_manifest
        files = {"smoke-report.json": self.smoke_report(), "packages.txt": self.packages}
        return canonical(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "artifactType": EVIDENCE_TYPE,
                "config": {
                    "mediaType": "application/vnd.oci.empty.v1+json",
                    "digest": sha256(b"{}"),
                    "size": 2,
                },
                "layers": [
                    {
                        "mediaType": "application/json",
                        "digest": sha256(data),
                        "size": len(data),
                        "annotations": {"org.opencontainers.image.title": name},
                    }
                    for name, data in files.items()
                ],
                "subject": {
                    "mediaType": OCI_MANIFEST,
                    "digest": sha256(self.manifest()),
                    "size": len(self.manifest()),
                },
                "annotations": {"org.opencontainers.image.created": "2026-01-01T00:00:00Z"},
            }
        )

    def index(self) -> bytes:
        if self.referrers_index:
            return self.referrers_index
        return canonical(
            {
                "schemaVersion": 2,
                "mediaType": OCI_INDEX,
                "manifests": [
                    {
                        "mediaType": OCI_MANIFEST,
                        "digest": sha256(self.evidence()),
                        "size": len(self.evidence()),
                        "artifactType": EVIDENCE_TYPE,
                    }
                ],
            }
        )

    def blobs(self) -> dict[str, bytes]:
        return {sha256(b): b for b in (self.smoke_report(), self.packages, self.config, b"{}")}

    def with_(self, **changes: Any) -> Published:
        return replace(self, **changes)

    def routes(self, **overrides: Handler) -> Handler:
        """The distribution API over this content; `overrides` maps a path regex to a handler
        that answers instead (the first match wins)."""
        manifests = {TAG: self.manifest(), sha256(self.manifest()): self.manifest()}
        manifests[sha256(self.evidence())] = self.evidence()
        blobs = self.blobs()
        subject = sha256(self.manifest())

        def handle(seen: Seen) -> Answer:
            path = seen.path.split("?", 1)[0]
            for pattern, handler in overrides.items():
                if re.search(pattern, seen.path):
                    return handler(seen)
            prefix = f"/v2/{REPOSITORY}/"
            if path == "/v2/":
                return json_answer(b"{}")
            if path.startswith(prefix + "manifests/"):
                body = manifests.get(path.removeprefix(prefix + "manifests/"))
                if body is None:
                    return oci_error(404, "MANIFEST_UNKNOWN", "manifest unknown")
                return json_answer(body, OCI_MANIFEST, **{"Docker-Content-Digest": sha256(body)})
            if path == prefix + f"referrers/{subject}":
                return json_answer(self.index(), OCI_INDEX)
            if path.startswith(prefix + "blobs/"):
                blob = blobs.get(path.removeprefix(prefix + "blobs/"))
                if blob is None:
                    return oci_error(404, "BLOB_UNKNOWN", "blob unknown")
                return Answer(headers={"Content-Type": "application/octet-stream"}, body=blob)
            return oci_error(404, "NAME_UNKNOWN", "repository name not known to registry")

        return handle


def require_basic(user: str, password: str, inner: Handler) -> Handler:
    """`inner`, behind HTTP Basic auth with these credentials."""
    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    def handle(seen: Seen) -> Answer:
        if seen.authorization != expected:
            return Answer(status=401, headers={"WWW-Authenticate": 'Basic realm="hostile"'})
        return inner(seen)

    return handle


def junk(total: int, chunk: int = 64 * 1024) -> Iterator[bytes]:
    """`total` bytes of JSON-looking junk, generated a chunk at a time."""
    sent = 0
    while sent < total:
        size = min(chunk, total - sent)
        yield b"[" * size
        sent += size


def chunked(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """`chunks` framed as HTTP/1.1 chunked transfer encoding (send with length=None and a
    Transfer-Encoding: chunked header)."""
    for chunk in chunks:
        yield b"%x\r\n%s\r\n" % (len(chunk), chunk)
    yield b"0\r\n\r\n"


def one_byte_at_a_time(data: bytes) -> Iterator[bytes]:
    for i in range(len(data)):
        yield data[i : i + 1]


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key, made with the openssl command-line tool."""
    openssl = shutil.which("openssl")
    if openssl is None:
        msg = "`openssl` is not installed; run `apt-get install -y openssl` and rerun the tests"
        raise RuntimeError(msg)
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key
