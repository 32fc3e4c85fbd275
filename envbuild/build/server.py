"""Serve a build what it must use but the image must never hold, for the build's duration only.

The classic builder (docker-py drives no BuildKit) has no secret mounts: whatever a build gets
as a context file or a build argument stays in a layer or in the history. So the CA bundle, the
index URLs (which may carry credentials), the uv binary and the wheelhouse are served from the
host instead, by a small HTTP server that

- listens on one address only, the gateway of the build's Docker network, on a random port;
- answers GET only, under a random unguessable path prefix (`secrets.token_urlsafe`);
- serves a fixed set of names: `config.json`, `uv`, `ca.crt`, `wheels/` (a listing page usable
  as uv `--find-links`) and `wheels/<file>`; every other path is 404, so `..` or an encoded
  variant reaches nothing; files are opened without following links and must be regular;
- bounds the connections it serves at once and how long one may stay silent;
- is shut down, its port freed, when the build ends, whether it succeeded, failed or was
  interrupted (the CLI's SIGTERM handler raises in the main thread; a process that exits
  closes the socket with it).

The image's install RUN (two when the CUDA libraries get a layer of their own:
templates/partials/install.j2, envbuild/payload/install_env.py) receives the server's URL as
the build argument ENVBUILD_SERVE. The classic builder records that URL in
the image history; once the build is over it names a closed port and grants nothing.

BuildKit needs no server (`write_mounted`): config.json and the CA bundle become secret files
the docker client sends through its session, uv and the wheelhouse a folder of the build context
that the install RUN binds read-only; nothing depends on where the engine runs. That folder
lies at the same path from build to build of an entry (`kept_context`): the docker client keys
the engine's copy of a context by its folder, so a rebuild sends only what changed and the
engine keeps one copy of an entry's wheels, not one more per build.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import hmac
import html
import importlib.metadata
import json
import logging
import os
import secrets
import shutil
import socket
import stat
import sys
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO

from packaging.utils import canonicalize_name

from envbuild.build.render import CA_SECRET, CONFIG_SECRET, FRAMEWORK_INPUTS_DIR, INPUTS_DIR
from envbuild.core.errors import BadInput, BuildFailed
from envbuild.core.models import BuildContext, BuildOptions, ServedInputs
from envbuild.core.names import shown
from envbuild.core.places import cache_dir, contexts_dir
from envbuild.core.platforms import MACHINE
from envbuild.lock.lockfile import pins
from envbuild.lock.uv import fetch_uv

log = logging.getLogger(__name__)

# The names install_env.py fetches (it imports nothing of envbuild: keep these in step).
CONFIG_NAME = "config.json"
UV_NAME = "uv"
CA_NAME = "ca.crt"
WHEELS_NAME = "wheels/"
MAX_CONNECTIONS = 16  # served at once; more wait in the listen backlog, then are dropped
IDLE_SECONDS = 120.0  # a connection silent this long is closed
_CHUNK = 1024 * 1024
# BuildKit refuses a secret larger than this (its session's limit, 500 KB); a CA bundle above it
# is bound from the context instead: certificates are public, only the index settings are secret.
SECRET_MAX_BYTES = 500 * 1024


def find_uv() -> Path:
    """The uv binary the build runs: the one beside envbuild's Python, else the one on PATH."""
    beside = Path(sys.executable).with_name("uv")
    found = beside if beside.is_file() else None
    if found is None:
        which = shutil.which("uv")
        found = Path(which) if which else None
    if found is None:
        msg = (
            "cannot find the uv binary (beside envbuild's Python or on PATH); builds install "
            "the lock with it: `pip install uv` into envbuild's environment"
        )
        raise BuildFailed(msg)
    return found.resolve()


def uv_for(platform: str, options: BuildOptions) -> Path:
    """The uv binary a build for `platform` runs: the host's for the host's machine, else the
    same version built for the image's machine, fetched once into envbuild's cache."""
    machine = MACHINE[platform]
    if machine == os.uname().machine:
        return find_uv()
    version = importlib.metadata.version("uv")
    home = cache_dir() / "uv" / f"{version}-{machine}"
    binary = home / "uv"
    if elf_machine(binary) == machine:
        return binary
    home.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{home.name}-", dir=home.parent) as scratch:
        fetched = fetch_uv(machine, options, Path(scratch) / "target")
        if elf_machine(fetched) != machine:
            msg = f"the uv wheel fetched for {machine} holds no {machine} program"
            raise BuildFailed(msg)
        Path(scratch, "target", "bin").rename(Path(scratch, "ready"))
        try:
            Path(scratch, "ready").rename(home)  # whole or not at all; another run may be first
        except OSError:
            if elf_machine(binary) != machine:
                raise
    return binary


_ELF_MACHINES = {62: "x86_64", 183: "aarch64"}


def elf_machine(path: Path) -> str | None:
    """The machine an ELF program is for (x86_64, aarch64), or None when `path` is none."""
    try:
        with path.open("rb") as handle:
            header = handle.read(20)
    except OSError:
        return None
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    return _ELF_MACHINES.get(int.from_bytes(header[18:20], "little"))


def config_document(served: ServedInputs) -> bytes:
    """config.json, as install_env.parse_config reads it."""
    return json.dumps(
        {
            "index_url": served.index_url,
            "extra_index_urls": list(served.extra_index_urls),
            "find_links": bool(served.wheels),
            "offline": served.offline,
            "ca_bundle": served.ca_bundle is not None,
        }
    ).encode()


def build_files(served: ServedInputs, uv: Path) -> dict[str, Path | bytes]:
    """Every name the server answers for one build, and what it sends."""
    files: dict[str, Path | bytes] = {CONFIG_NAME: config_document(served), UV_NAME: uv}
    if served.ca_bundle is not None:
        files[CA_NAME] = served.ca_bundle
    if served.wheels:
        files[WHEELS_NAME] = listing(path.name for path in served.wheels)
        for path in served.wheels:
            files[WHEELS_NAME + path.name] = path
    return files


def listing(names: Iterator[str] | tuple[str, ...]) -> bytes:
    """A find-links page: one relative link per file (pip's and uv's flat-index format)."""
    links = "".join(
        f'<a href="{html.escape(urllib.parse.quote(name))}">{html.escape(name)}</a><br>\n'
        for name in names
    )
    return f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n".encode()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = False

    def __init__(self, address: str, prefix: str, files: Mapping[str, Path | bytes]) -> None:
        self.prefix = prefix
        self.files = dict(files)
        self.slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self.open: set[socket.socket] = set()
        self.open_lock = threading.Lock()
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.address_family = family
        super().__init__((address, 0), _Handler)

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        if not self.slots.acquire(timeout=IDLE_SECONDS):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        with self.open_lock:
            self.open.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.open_lock:
                self.open.discard(request)
            self.slots.release()

    def handle_error(self, request: object, client_address: object) -> None:
        """A build that goes away mid-download (its engine died, it was interrupted) is no error
        of envbuild's: log it, never print socketserver's traceback into the user's output."""
        error = sys.exc_info()[1]
        log.debug("build server: %s ended a request: %s", client_address, error)

    def close_connections(self) -> None:
        """End every connection still open (a kept-alive one must not outlive the build)."""
        with self.open_lock:
            for request in self.open:
                with contextlib.suppress(OSError):
                    request.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = IDLE_SECONDS
    protocol_version = "HTTP/1.1"
    server_version = "envbuild"
    sys_version = ""

    def do_GET(self) -> None:
        """Send one of the server's files, or 404."""
        name = self._name()
        content = self.server.files.get(name) if name is not None else None
        if content is None:
            self._refuse(404, "Not Found")
            return
        if isinstance(content, bytes):
            self._send(content, len(content), None)
            return
        try:
            fd = os.open(content, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:
            self._refuse(404, "Not Found")
            return
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                self._refuse(404, "Not Found")
                return
            self._send(b"", info.st_size, handle)

    def _name(self) -> str | None:
        """The served name the request path asks for, or None if it is not under the prefix."""
        path = self.path
        if "?" in path or "#" in path or not path.startswith("/"):
            return None
        head, slash, rest = path[1:].partition("/")
        if not slash or not hmac.compare_digest(head.encode(), self.server.prefix.encode()):
            return None
        return urllib.parse.unquote(rest, errors="strict") if "%" in rest else rest

    def _send(self, body: bytes, length: int, handle: BinaryIO | None) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(length))
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if handle is None:
            self.wfile.write(body)
        else:
            shutil.copyfileobj(handle, self.wfile, _CHUNK)

    def _refuse(self, code: int, reason: str) -> None:
        body = f"{code} {reason}\n".encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        if code == 405:
            self.send_header("Allow", "GET")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def _not_allowed(self) -> None:
        self._refuse(405, "Method Not Allowed")

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed
    do_TRACE = do_CONNECT = _not_allowed

    def log_message(self, format: str, *args: object) -> None:
        # Never the path: it holds the prefix. Method and status are enough to debug a build.
        status = args[1] if format.startswith('"%s" %s') and len(args) > 1 else "-"
        log.debug("build server: %s %s", getattr(self, "command", "-"), status)


@contextmanager
def serve(address: str, files: Mapping[str, Path | bytes]) -> Iterator[str]:
    """Serve `files` on `address` (one address, a random port) under a random prefix while the
    block runs; yield the base URL (ending in "/"). The server is closed however the block ends."""
    prefix = secrets.token_urlsafe(32)
    try:
        server = _Server(address, prefix, files)
    except (OSError, ValueError) as exc:
        msg = (
            f"cannot serve the build's files on {shown(address)}, the gateway of the build's "
            f"Docker network ({getattr(exc, 'strerror', None) or exc}); the classic builder needs "
            "the engine on this host with that address on a local bridge: use --builder buildkit"
        )
        raise BuildFailed(msg) from exc
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="envbuild-serve",
        daemon=True,
    )  # fmt: skip
    thread.start()
    host = f"[{address}]" if ":" in address else address
    try:
        yield f"http://{host}:{server.server_address[1]}/{prefix}/"
    finally:
        server.shutdown()
        server.server_close()
        server.close_connections()
        thread.join(timeout=5)


@contextmanager
def serve_build(address: str, served: ServedInputs) -> Iterator[str]:
    """Serve one build's inputs (`build_files`) on `address`; yield the URL for ENVBUILD_SERVE."""
    with serve(address, build_files(served, served.uv or find_uv())) as url:
        yield url


def write_mounted(context: BuildContext, folder: Path, secrets_dir: Path) -> dict[str, Path]:
    """Lay out a BuildKit build's inputs: uv, the wheelhouse's wheels of the lock's packages
    (hard links where the file system allows) and an oversized CA bundle in the context's
    INPUTS_DIR, and the same for the lock's framework part alone in FRAMEWORK_INPUTS_DIR (what
    the framework's RUNs bind); config.json and the CA bundle as files in `secrets_dir` (made
    0700). Return the secrets by id, for `docker build --secret`."""
    served = context.served
    wanted = pins(context.lock.text) if context.lock else None
    if wanted is not None and context.framework_image is not None:
        # The entry's RUN stands on its framework image: it needs the team's wheels alone.
        framework = pins(context.framework_lock)
        wanted = {name: version for name, version in wanted.items() if name not in framework}
    _lay_inputs(folder / INPUTS_DIR, served, wanted)
    if context.framework_lock:
        _lay_inputs(folder / FRAMEWORK_INPUTS_DIR, served, pins(context.framework_lock))
    inputs = folder / INPUTS_DIR
    secrets_dir.mkdir(mode=0o700)
    secrets = {CONFIG_SECRET: secrets_dir / CONFIG_NAME}
    _write_private(secrets[CONFIG_SECRET], config_document(served))
    if served.ca_bundle is not None:
        if served.ca_bundle.stat().st_size <= SECRET_MAX_BYTES:
            secrets[CA_SECRET] = secrets_dir / CA_NAME
            _write_private(secrets[CA_SECRET], served.ca_bundle.read_bytes())
        else:
            for bound in (inputs, folder / FRAMEWORK_INPUTS_DIR):
                if bound.is_dir():
                    _place(served.ca_bundle, bound / CA_NAME)
    return secrets


@contextlib.contextmanager
def kept_context(entry_id: str, scratch: Path) -> Iterator[Path]:
    """An empty folder for the BuildKit context of the entry `entry_id`, at the same path each
    time (the contexts folder of envbuild's cache), removed when the build ends; `scratch`/context
    where that path cannot be used: the cache cannot be written, or another run is building the
    same entry (a lock file beside the folder says so)."""
    name = hashlib.sha256(entry_id.encode()).hexdigest()[:20]
    try:
        home = contexts_dir()
        home.mkdir(parents=True, exist_ok=True)
        lock = (home / f"{name}.lock").open("a")
    except (OSError, BadInput) as exc:
        log.debug("BuildKit context in a scratch folder: %s", exc)
        yield _fresh(scratch / "context")
        return
    with lock:
        folder = home / name
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _fresh(folder)
        except OSError as exc:  # another run builds this entry now, or the folder is stuck
            log.debug("BuildKit context in a scratch folder: %s", exc)
            yield _fresh(scratch / "context")
            return
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def _fresh(folder: Path) -> Path:
    """`folder`, made empty: what an interrupted build left is removed, a link planted in its
    place too (never followed)."""
    if folder.is_symlink():
        folder.unlink()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def _lay_inputs(inputs: Path, served: ServedInputs, wanted: dict[str, str] | None) -> None:
    """uv and the wheelhouse's wheels of the `wanted` packages (all for None) in `inputs`."""
    (inputs / WHEELS_NAME).mkdir(parents=True)
    _place(served.uv or find_uv(), inputs / UV_NAME)
    for wheel in served.wheels:
        name = canonicalize_name(wheel.name.split("-", 1)[0])
        if wanted is None or name in wanted or not wheel.name.endswith(".whl"):
            _place(wheel, inputs / WHEELS_NAME / wheel.name)


def _place(source: Path, target: Path) -> None:
    """`source` at `target`: a hard link when the file system allows, else a copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
