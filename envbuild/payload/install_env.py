"""Install envbuild.lock into a fresh venv, inside the image's install RUN (stdlib only).

envbuild serves what the install needs but the image must never hold (the uv binary, the CA
bundle, the index URLs with their credentials, the wheelhouse) from the host for the duration
of the build; the build argument ENVBUILD_SERVE is that server's URL. This script fetches uv,
the CA bundle, config.json and the wheelhouse's wheels of the lock's pins from it into a private
temporary folder, creates the venv (`python3 -m venv --without-pip`), checks the wheelhouse's
wheels against the lock's hashes itself and runs

    uv pip install --python VENV/bin/python --no-deps --no-cache --offline --no-index
                   --find-links VERIFIED -r LOCAL -r SEEDS
    uv pip install --python VENV/bin/python --require-hashes --no-deps --no-cache
                   [--find-links WHEELS] -r REST

(LOCAL: the pins of which VERIFIED, a folder of links to the wheelhouse's wheels whose sha256 the
lock gives for them, holds one for this machine, without their hashes; REST: the other pins, with
theirs; SEEDS: the OS's own pip and setuptools wheels, those the lock does not pin, which
`python3 -m venv` would have installed, with their hashes, in the second run when there is no
first; see split_verified), then byte-compiles what those runs installed (see Compiler: the
first run's files compile while the second downloads) unless told `--no-bytecode`

with the CA bundle in SSL_CERT_FILE and the indexes in uv's environment variables (never on a
command line), and removes the temporary folder whatever happens. uv's network limits are set
here, not left to its defaults: an index that dies fails the install in about a minute, with one
line naming it, while a slow but steady download never trips them. Usage:

    ENVBUILD_SERVE=http://GATEWAY:PORT/PREFIX/ python3 install_env.py [--only PATTERN]
        [--epoch SECONDS] [--no-bytecode] VENV LOCK
    python3 install_env.py --mounted /run/envbuild [--only PATTERN] [--epoch SECONDS]
        [--no-bytecode] VENV LOCK

With BuildKit nothing is served: the install RUN mounts what it needs (MOUNTED_LAYOUT) and
`--mounted` names where. config.json and ca.crt come as secret mounts (never cached, never in a
layer), uv, the wheelhouse and a CA bundle too large for a secret as a read-only bind mount of the
build context, and uv's cache as a cache mount kept between builds (so a rebuild downloads only
what changed; it holds packages, never the index settings, which travel in uv's environment).

`--only 'nvidia-*'` installs the lock's packages of that name (fnmatch) into the venv, made if
missing: a step of its own, so that they get a layer of their own (templates/partials/install.j2);
the step after it installs the whole lock, in which uv finds them installed already.

`--epoch SECONDS` makes the step's layer the same bytes whenever it is built from the same lock on
the same layers: every file and folder the step changed (since the RUN's first process started)
gets that modification time, before the bytecode is compiled (so each .pyc records it) and again
at the end (see clamp_times). A layer's digest is the hash of a tar that holds each file's time.
It walks the whole file system, so it runs only as a build step's /install_env.py (STEP_PATH).
"""

from __future__ import annotations

import base64
import collections
import concurrent.futures
import contextlib
import csv
import fnmatch
import functools
import glob
import hashlib
import html
import json
import os
import platform
import py_compile
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

SERVE_VARIABLE = "ENVBUILD_SERVE"
CONFIG_NAME = "config.json"
UV_NAME = "uv"
CA_NAME = "ca.crt"
WHEELS_NAME = "wheels/"
# With BuildKit (`--mounted ROOT`), what the install RUN mounts under ROOT (templates/partials/install.j2).
SECRETS_DIR = "secrets"  # config.json and ca.crt: secret mounts
INPUTS_DIR = "inputs"  # uv, wheels/ and a CA bundle too large for a secret: the context, bound
CACHE_DIR = "cache"  # uv's cache: a cache mount
SEEDS_NAME = "seeds.txt"  # in the scratch folder: the venv's pip, for uv's first run
PART_NAME = "part.txt"  # in the scratch folder: the lock's pins an --only step installs
VERIFIED_NAME = "verified"  # in the scratch folder: links to the wheels split_verified checked
LOCAL_NAME = "local.txt"  # in the scratch folder: the pins those wheels install, without hashes
REST_NAME = "rest.txt"  # in the scratch folder: the lock's other pins, with their hash lines
FETCH_TIMEOUT = 120.0  # seconds without a byte from the host's server
# uv's limits per request. The connect timeout (TCP, TLS and any proxy tunnel of one attempt)
# is short: a dead address never answers a SYN, and every retry waits for it again. The read
# timeout counts seconds without a byte, not the whole download: a multi-GB CUDA wheel at a
# slow but steady rate never meets it. A dead index thus fails the install within about
# HTTP_READ_TIMEOUT_S + HTTP_RETRIES * HTTP_CONNECT_TIMEOUT_S plus uv's backoff (~1 minute);
# one that completes the TLS handshake and then says nothing, within
# (1 + HTTP_RETRIES) * HTTP_READ_TIMEOUT_S (~2 minutes).
HTTP_CONNECT_TIMEOUT_S = 5  # UV_HTTP_CONNECT_TIMEOUT (uv >= 0.10; older uv uses the read timeout)
HTTP_READ_TIMEOUT_S = 30  # UV_HTTP_TIMEOUT
HTTP_RETRIES = 3  # UV_HTTP_RETRIES: a reset in the middle of a large download is retried
UV_TAIL_LINES = 200  # the last lines of uv's output kept to explain its failure
MAX_LINE_BYTES = 4096
# Folders of a distribution that hold its own test suite: never imported by a training job, so
# not byte-compiled in the build (sympy's, networkx's and numpy's are a fifth of a torch
# image's Python); one imported anyway compiles then, as without bytecode.
TEST_FOLDERS = frozenset({"tests", "test"})
COMPILE_CHUNK = 64  # files per task of the compile pool
# What clamp_times never walks into or touches: the kernel's own file systems, and what the
# engine makes for each container (mount points besides, read from /proc/self/mountinfo:
# BuildKit's secret, bind and cache mounts, /etc/hosts). Touched, a file of the container's own
# would be copied into the step's layer, or not, by when the container was made.
CONTAINER_PATHS = ("/proc", "/sys", "/dev", "/.dockerenv", "/etc/mtab", "/run/.containerenv")
MAX_REASON_CHARS = 240
# A lock's requirement line: name[extras]==version.
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")
_CONFIG_KEYS = {"index_url", "extra_index_urls", "find_links", "offline", "ca_bundle"}
_HASH = re.compile(r"--hash=sha256:([0-9a-fA-F]{64})\b")
# Wheel platform tags of the manylinux policies named before PEP 600, and their glibc.
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


class InstallError(Exception):
    """One line for the build log; the script exits 1."""


@dataclass(frozen=True)
class Config:
    """What config.json says about where packages come from."""

    index_url: str | None
    extra_index_urls: tuple[str, ...]
    find_links: bool  # the server offers a wheelhouse listing at wheels/
    offline: bool  # no index at all: only the served wheels
    ca_bundle: bool  # the server offers ca.crt


def parse_config(data: bytes) -> Config:
    """config.json as served; InstallError for anything but the exact shape envbuild writes."""
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        msg = f"{CONFIG_NAME} is not JSON ({exc.__class__.__name__})"
        raise InstallError(msg) from exc
    if not isinstance(raw, dict) or set(raw) != _CONFIG_KEYS:
        keys = sorted(raw) if isinstance(raw, dict) else type(raw).__name__
        msg = f"{CONFIG_NAME} must hold exactly the keys {sorted(_CONFIG_KEYS)}, not {keys}"
        raise InstallError(msg)
    index_url, extras = raw["index_url"], raw["extra_index_urls"]
    if index_url is not None and not _is_url(index_url):
        msg = f"{CONFIG_NAME}: index_url is not an http(s) URL"
        raise InstallError(msg)
    if not isinstance(extras, list) or not all(_is_url(url) for url in extras):
        msg = f"{CONFIG_NAME}: extra_index_urls is not a list of http(s) URLs"
        raise InstallError(msg)
    flags = {key: raw[key] for key in ("find_links", "offline", "ca_bundle")}
    for key, value in flags.items():
        if not isinstance(value, bool):
            msg = f"{CONFIG_NAME}: {key} is not true or false"
            raise InstallError(msg)
    if flags["offline"] and not flags["find_links"]:
        msg = f"{CONFIG_NAME}: offline without a wheelhouse leaves nowhere to install from"
        raise InstallError(msg)
    return Config(
        index_url=index_url,
        extra_index_urls=tuple(extras),
        find_links=flags["find_links"],
        offline=flags["offline"],
        ca_bundle=flags["ca_bundle"],
    )


def _is_url(value: object) -> bool:
    # No whitespace: uv splits UV_EXTRA_INDEX_URL on spaces.
    return (
        isinstance(value, str)
        and value.startswith(("http://", "https://"))
        and not any(c.isspace() for c in value)
    )


def _uv_install(uv: str, venv: str, cache: str | None) -> list[str]:
    """The start of every uv command line: install into `venv`'s Python, no dependencies but
    the pinned ones, in `cache` (None: no cache)."""
    caching = ["--cache-dir", cache] if cache is not None else ["--no-cache"]
    python = os.path.join(venv, "bin", "python")
    return [uv, "pip", "install", "--python", python, "--no-deps", *caching, "--no-progress"]


def uv_command(
    uv: str,
    config: Config,
    wheels: str,
    venv: str,
    lock: str | None,
    seeds: str | None = None,
    cache: str | None = None,
) -> list[str]:
    """uv's command line for what it checks against the lock's hashes itself: no index URL
    on it (they may hold credentials); `wheels`, the folder of the wheelhouse's wheels
    (fetch_wheels, or mounted); `seeds`, the venv's own pip (make_venv), installed in the same
    run; `cache`, uv's cache folder (None: no cache)."""
    command = [*_uv_install(uv, venv, cache), "--require-hashes"]
    if config.find_links:
        command += ["--find-links", wheels]
    if config.offline:
        command.append("--no-index")
    return [*command, *(("-r", lock) if lock else ()), *(("-r", seeds) if seeds else ())]


def uv_local_command(
    uv: str, verified: str, venv: str, local: str, seeds: str | None, cache: str | None
) -> list[str]:
    """uv's command line for the pins split_verified found in the wheelhouse: from the folder
    `verified` alone, no index, nothing downloaded; their hashes were checked already. `seeds`
    (make_venv), local files too, carry their own hashes, which uv checks."""
    return [
        *_uv_install(uv, venv, cache), "--offline", "--no-index", "--find-links", verified,
        "-r", local, *(("-r", seeds) if seeds else ()),
    ]  # fmt: skip


def uv_environment(config: Config, base: dict[str, str], ca_path: str | None) -> dict[str, str]:
    """uv's environment: the indexes and the CA bundle; nothing of the caller's uv settings."""
    env = {k: v for k, v in base.items() if not k.startswith(("UV_", "PIP_"))}
    env.pop("SSL_CERT_FILE", None)
    env.pop(SERVE_VARIABLE, None)
    # Exact pins with required hashes: consider every index, as pip does, so a package the
    # framework's index lacks still comes from the main one.
    env["UV_INDEX_STRATEGY"] = "unsafe-best-match"
    env["UV_NO_CONFIG"] = "1"
    if config.index_url is not None:
        env["UV_INDEX_URL"] = config.index_url
    if config.extra_index_urls:
        env["UV_EXTRA_INDEX_URL"] = " ".join(config.extra_index_urls)
    if ca_path is not None:
        env["SSL_CERT_FILE"] = ca_path
    env["UV_HTTP_CONNECT_TIMEOUT"] = str(HTTP_CONNECT_TIMEOUT_S)
    env["UV_HTTP_TIMEOUT"] = str(HTTP_READ_TIMEOUT_S)
    env["UV_HTTP_RETRIES"] = str(HTTP_RETRIES)
    return env


def run_uv(command: list[str], environment: dict[str, str]) -> tuple[int, list[str]]:
    """Run uv with its stderr passed on to the build log as it comes: (exit code, last lines)."""
    tail: collections.deque[str] = collections.deque(maxlen=UV_TAIL_LINES)
    with subprocess.Popen(command, env=environment, stderr=subprocess.PIPE) as process:
        stream = process.stderr
        assert stream is not None
        # readline with a limit: a line without end is read in pieces, never all at once.
        for raw in iter(lambda: stream.readline(MAX_LINE_BYTES), b""):
            line = raw.decode("utf-8", errors="replace")
            sys.stderr.write(line)
            sys.stderr.flush()
            tail.append(line.rstrip("\n"))
    return process.returncode, list(tail)


_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_URL = re.compile(r"https?://[^\s`'\"()<>]+")
_CAUSE = re.compile(r"^\s*(?:error|cause|caused by):\s*", re.IGNORECASE)
_PACKAGE = re.compile(r"Failed to download `([^`]+)`")
# What uv says when a request, not the lock or the venv, failed.
_NETWORK = ("Failed to fetch", "error sending request", "Request failed after")


def origin(url: str) -> str:
    """scheme://host[:port] of `url`: never its credentials, path or query."""
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def network_failure(tail: list[str], serve: str) -> str | None:
    """One line for an install that failed on a request (where to, why), from the last lines of
    uv's output; None when uv failed for another reason (a hash, a missing wheel, the venv)."""
    lines = [_ANSI.sub("", line) for line in tail]
    starts = [i for i, line in enumerate(lines) if line.lower().startswith("error:")]
    block = lines[starts[-1] :] if starts else lines
    text = "\n".join(block)
    if not any(marker in text for marker in _NETWORK):
        return None
    said = [_CAUSE.sub("", line).strip() for line in block if _CAUSE.match(line)]
    said = [_URL.sub(lambda m: origin(m.group(0)), part) for part in said if part]
    reasons = [part for part in said if part.startswith("Request failed after")]
    # The innermost two causes: `tcp connect error: deadline has elapsed`.
    innermost = [part for part in said[-2:] if part not in reasons]
    if innermost:
        reasons.append(": ".join(innermost))
    reason = "; ".join(reasons) or "no reason given"
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[: MAX_REASON_CHARS - 3] + "..."
    url = _URL.search(text)
    if url is None:
        where = "the package index"
    elif origin(url.group(0)) == origin(serve):
        where = "envbuild's build server (the wheelhouse)"
    else:
        where = f"the package index at {origin(url.group(0))}"
    package = _PACKAGE.search(text)
    what = f"{package.group(1)} " if package else ""
    line = (
        f"uv could not download {what}from {where} ({reason}); check that it is up and "
        "reachable from the build (its URL, the proxy, the CA bundle), then build again"
    )
    return "".join(c if c.isprintable() else "?" for c in line)


def first_package(lock: str) -> str:
    """The name of the lock's first pinned package (its index page is what gets asked)."""
    with open(lock, encoding="utf-8") as handle:
        for line in handle:
            match = _PIN.match(line)
            if match:
                return match.group(1)
    return "pip"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as it stands (its 3xx), never followed: urllib would send the
    index's Authorization header to wherever the index points."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def refused_index(config: Config, package: str, ca_path: str | None) -> str | None:
    """One line when an index answers 401 or 403 (uv takes those for "no such package", which
    hides a wrong token): each index is asked for `package`'s page, through the build's proxy
    and CA bundle. The line names the index's origin, never its credentials."""
    import base64
    import ssl

    try:
        context = ssl.create_default_context(cafile=ca_path) if ca_path else None
    except (OSError, ValueError):  # a bundle ssl cannot load: uv's own failure says more
        return None
    opener = urllib.request.build_opener(_NoRedirect, urllib.request.HTTPSHandler(context=context))
    for url in (config.index_url, *config.extra_index_urls):
        if url is None:
            continue
        parts = urllib.parse.urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
        page = f"{parts.scheme}://{host}{parts.path.rstrip('/')}/{package}/"
        request = urllib.request.Request(page, method="GET")
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            password = urllib.parse.unquote(parts.password or "")
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with opener.open(request, timeout=10):
                continue
        except urllib.error.HTTPError as exc:
            status = exc.code
        except (OSError, ValueError):
            continue
        if status in (401, 403):
            return refused_line(
                f"{parts.scheme}://{host}", f"{parts.path.rstrip('/')}/{package}/", status,
                credentials=parts.username is not None,
            )  # fmt: skip
    return None


def refused_line(origin: str, path: str, status: int, *, credentials: bool) -> str:
    """The line for an index that answered `status` (401 or 403) to `path`: the same from the
    build and from `envbuild lock` on the host (uv_resolve)."""
    said = "it refused the credentials" if credentials else "it wants credentials"
    return (
        f"the package index at {origin} answered HTTP {status} to {path}: {said}; check the "
        "user and token in its URL (--index-url, --extra-index-url) and that they may read "
        "that index"
    )


class Phases:
    """Seconds per phase of the install, for the build log: `fetch uv 0.3 s, venv 2.8 s, …`."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.phases: list[tuple[str, float]] = []

    def done(self, name: str) -> None:
        now = time.monotonic()
        self.phases.append((name, now - self.last))
        self.last = now

    def __str__(self) -> str:
        return ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.phases)


def fetch(url: str, destination: str | None = None) -> bytes:
    """GET `url` from envbuild's server: its body, or written to `destination` (0600)."""
    try:
        with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT) as response:
            if destination is None:
                return bytes(response.read())
            fd = os.open(destination, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as handle:
                shutil.copyfileobj(response, handle, 1024 * 1024)
            return b""
    except (OSError, urllib.error.URLError) as exc:
        name = url.rsplit("/", 1)[-1]
        msg = (
            f"cannot fetch {name} from envbuild's build server ({exc}); the server lives only "
            "while `envbuild build` runs: build with envbuild, not with `docker build`"
        )
        raise InstallError(msg) from exc


def seed_wheels() -> list[str]:
    """The wheels `python3 -m venv` would seed a venv with: the OS's own (Debian's
    python3-pip-whl) or those bundled with ensurepip; pip, and setuptools before Python 3.12."""
    names = ["pip"] if sys.version_info >= (3, 12) else ["pip", "setuptools"]
    folders = ["/usr/share/python-wheels"]
    try:
        import ensurepip

        folders.append(os.path.join(os.path.dirname(ensurepip.__file__), "_bundled"))
    except ImportError:
        pass
    for folder in folders:
        found = [glob.glob(os.path.join(folder, f"{name}-*.whl")) for name in names]
        if all(len(wheels) == 1 for wheels in found):
            return [wheels[0] for wheels in found]
    return []


def fetch_wheels(serve: str, lock: str, scratch: str, venv: str = "") -> str:
    """The served wheels of the lock's pins (name and version), fetched into a folder of
    `scratch`, for uv's --find-links; the folder's path. Not those `venv` holds already (the
    framework's, when the team's packages are installed above them)."""
    # uv unpacks a wheel it reads from a file on every core, and one it downloads as the bytes
    # come, on one: a 183 MB torch wheel took 11 s from the server and 5 s from a file here.
    pinned = set(lock_pins(lock)) - (installed(venv) if venv else set())
    folder = os.path.join(scratch, WHEELS_NAME.rstrip("/"))
    os.mkdir(folder, 0o700)
    page = fetch(serve + WHEELS_NAME).decode("utf-8", errors="replace")
    for link in re.findall(r'href="([^"]*)"', page):
        name = urllib.parse.unquote(html.unescape(link))
        parts = name.split("-")
        # Only a plain file name of a wheel: the name becomes a path in `folder`.
        if "/" in name or name.startswith(".") or not name.endswith(".whl") or len(parts) < 5:
            continue
        if (canonical(parts[0]), parts[1].lower()) in pinned:
            fetch(serve + WHEELS_NAME + urllib.parse.quote(name), os.path.join(folder, name))
    return folder


def sha256_of(path: str) -> str:
    """The hex sha256 of the file at `path`, read a block at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:  # the image's Python: file_digest is 3.11's
        for block in iter(lambda: handle.read(1024 * 1024), b""):
            digest.update(block)
    return digest.hexdigest()


def fits_here(wheel: str) -> bool:
    """Whether a wheel's file name says it installs on this Python and machine: a Python tag
    of this version (or abi3 of an earlier CPython 3), and a platform tag `any` or of this
    machine (manylinux of this glibc or older, musllinux where there is no glibc). What it
    cannot tell is left to uv (split_verified)."""
    parts = wheel[: -len(".whl")].split("-") if wheel.endswith(".whl") else []
    if len(parts) < 5:
        return False
    pythons, abi, platforms = parts[-3].split("."), parts[-2], parts[-1].split(".")
    major, minor = sys.version_info[:2]
    own = f"cp{major}{minor}"

    def python_fits(tag: str) -> bool:
        if tag in (f"py{major}", f"py{major}{minor}", own):
            return abi in ("none", "abi3", own)
        found = re.fullmatch(r"cp(\d)(\d+)", tag)
        return (
            abi == "abi3" and found is not None and (int(found[1]), int(found[2])) <= (major, minor)
        )

    libc, version = platform.libc_ver()
    glibc = tuple(int(n) for n in version.split(".")[:2] if n.isdigit()) if libc == "glibc" else ()

    def platform_fits(tag: str) -> bool:
        if tag == "any":
            return True
        if not tag.endswith("_" + platform.machine()):
            return False
        if tag.startswith("musllinux_"):
            return not glibc
        if not glibc:
            return False
        if tag.startswith("linux_"):  # built on such a machine, with no policy: pip takes it
            return True
        policy = re.match(r"manylinux_(\d+)_(\d+)_", tag)
        needs = (
            (int(policy[1]), int(policy[2])) if policy else _LEGACY_MANYLINUX.get(tag.split("_")[0])
        )
        return needs is not None and needs <= glibc

    return any(map(python_fits, pythons)) and any(map(platform_fits, platforms))


def lock_requirements(lock: str) -> list[tuple[str, str, list[str]]]:
    """The lock's requirements: (canonical name, version in lower case, its lines: the pin and
    the hash lines that continue it). Comments and blank lines are left out."""
    found: list[tuple[str, str, list[str]]] = []
    continued = False
    with open(lock, encoding="utf-8") as handle:
        for line in handle:
            match = None if continued else _PIN.match(line)
            if match:
                found.append((canonical(match.group(1)), match.group(2).lower(), [line]))
            elif continued and found:
                found[-1][2].append(line)
            continued = line.rstrip("\n").endswith("\\")
    return found


def split_verified(
    lock: str, wheels: str, scratch: str, venv: str
) -> tuple[tuple[str, str] | None, str | None]:
    """Split `lock` for uv's two runs: ((VERIFIED, LOCAL), REST), each None when it holds no pin.
    VERIFIED, a folder of `scratch`, links to the wheels of `wheels` whose sha256 is one of the
    hashes the lock gives for their pin and whose names fit this machine (fits_here); LOCAL
    names those pins without hashes; REST is the lock's other pins with their hash lines (the
    lock itself when no pin is LOCAL's).
    Checked here, not by uv: uv unpacks a wheel whose hash it must check as it reads it, on one
    core, and one it need not check on every core (the torch CPU wheel: 6.7 to 8.5 s against
    3.5 to 5.2 s here; its sha256 0.1 to 0.5 s). A wheel of the wheelhouse no hash of the lock
    names is never linked: its pin stays in REST, where uv refuses it or takes the index's.
    Pins `venv` holds already (the framework's, under the team's packages) stay in REST unread."""
    folder = os.path.join(scratch, VERIFIED_NAME)
    have = installed(venv)
    offered: dict[tuple[str, str], list[str]] = {}  # (name, version) -> the wheels named so
    for wheel in sorted(os.listdir(wheels)) if os.path.isdir(wheels) else []:
        parts = wheel.split("-")
        if len(parts) >= 5:
            offered.setdefault((canonical(parts[0]), parts[1].lower()), []).append(wheel)
    local: list[str] = []
    rest: list[str] = []
    for name, version, lines in lock_requirements(lock):
        # A pin under an environment marker is uv's to decide; one the venv holds stays unread.
        marked = ";" in lines[0]
        candidates = [] if marked or (name, version) in have else offered.get((name, version), [])
        hashes = {h.lower() for line in lines for h in _HASH.findall(line)}
        good = [
            wheel
            for wheel in candidates
            if fits_here(wheel)
            and os.path.isfile(os.path.join(wheels, wheel))
            and sha256_of(os.path.join(wheels, wheel)) in hashes
        ]
        if not good:
            rest.extend(lines)
            continue
        os.makedirs(folder, mode=0o700, exist_ok=True)
        for wheel in good:
            os.symlink(os.path.join(os.path.abspath(wheels), wheel), os.path.join(folder, wheel))
        local.append(f"{name}=={version}\n")
    if not local:
        return None, lock
    rested = write_requirements(scratch, REST_NAME, rest) if rest else None
    return (folder, write_requirements(scratch, LOCAL_NAME, local)), rested


def write_requirements(scratch: str, name: str, lines: list[str]) -> str:
    """A requirements file of `lines` in `scratch`: its path."""
    path = os.path.join(scratch, name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.writelines(lines)
    return path


def installed(venv: str) -> set[tuple[str, str]]:
    """(canonical name, version in lower case) of each distribution in `venv`'s site-packages."""
    found = set()
    for info in glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "*.dist-info")):
        name, _, version = os.path.basename(info)[: -len(".dist-info")].partition("-")
        found.add((canonical(name), version.lower()))
    return found


def dist_infos(venv: str) -> set[str]:
    """The paths of the .dist-info folders in `venv`'s site-packages."""
    return set(glob.glob(os.path.join(venv, "lib", "python3*", "site-packages", "*.dist-info")))


def recorded_sources(dist_info: str) -> list[str]:
    """The .py files a distribution's RECORD lists inside its site-packages, but none in its
    test folders (TEST_FOLDERS)."""
    site = os.path.dirname(dist_info)
    try:
        with open(os.path.join(dist_info, "RECORD"), encoding="utf-8", errors="replace") as handle:
            paths = [row[0] for row in csv.reader(handle) if row]
    except (OSError, csv.Error):
        return []
    found = []
    for path in paths:
        parts = os.path.normpath(path).split(os.sep)
        if not parts[-1].endswith(".py") or parts[0] in ("..", "") or TEST_FOLDERS & set(parts):
            continue
        found.append(os.path.join(site, *parts))
    return found


def _compile(paths: list[str], clamp: tuple[int, int] | None = None) -> int:
    """Byte-compile `paths` (in a worker process): how many did not compile. With `clamp`
    (since_ns, epoch), each source this step wrote gets the epoch first (clamp_time), so that
    its .pyc records that time."""
    failed = 0
    # Timestamp-based whatever the environment says (SOURCE_DATE_EPOCH would make it a checked
    # hash, which hashes every source at every import); clamped times keep the .pyc the same.
    timestamp = py_compile.PycInvalidationMode.TIMESTAMP
    now_ns = time.time_ns() + 1_000_000_000
    for path in paths:
        try:
            if clamp is not None:
                since_ns, epoch = clamp
                clamp_time(path, os.lstat(path), since_ns, epoch * 1_000_000_000, now_ns)
            py_compile.compile(path, doraise=True, invalidation_mode=timestamp)
        except (py_compile.PyCompileError, OSError, ValueError):
            failed += 1
    return failed


class Compiler:
    """Byte-compiles the sources of the distributions it is given on every core, in the
    background: `add` the dist-infos a uv run installed and go on (uv's next run downloads
    while this one's files compile); `finish` waits: (files compiled, files that did not
    compile). Only what a step installed: uv's --compile-bytecode walks the whole venv again in
    every step, and a folder of tests nothing imports is left out (TEST_FOLDERS). A file that
    does not compile (a package's deliberately broken fixture, Python 2 leftovers) is counted,
    not fatal, as with pip and uv. Each .pyc is the one Python would write on import
    (timestamp-based). `clamp` (since_ns, epoch): each source is given the epoch as it is
    compiled (_compile), as the step's last clamp_step would, and no walk of the whole file
    system is needed first. Where no process pool can be made (no /dev/shm), `add` compiles
    before it returns. Leaving its `with` block cancels what has not started."""

    def __init__(self, clamp: tuple[int, int] | None = None) -> None:
        self._task = functools.partial(_compile, clamp=clamp)
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None  # None: compile inline
        with contextlib.suppress(OSError, NotImplementedError):  # no semaphores (no /dev/shm)
            # Its worker processes start with the first batch, not here.
            self._pool = concurrent.futures.ProcessPoolExecutor(max_workers=os.cpu_count())
        self._pending: list[concurrent.futures.Future[int]] = []
        self._sources = 0
        self._failed = 0

    def __enter__(self) -> Compiler:
        return self

    def __exit__(self, *exc: object) -> None:
        for future in self._pending:
            future.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def add(self, infos: set[str]) -> None:
        sources = [path for info in sorted(infos) for path in recorded_sources(info)]
        chunks = [sources[i : i + COMPILE_CHUNK] for i in range(0, len(sources), COMPILE_CHUNK)]
        self._sources += len(sources)
        if self._pool is None:
            self._failed += sum(map(self._task, chunks))
            return
        self._pending += [self._pool.submit(self._task, chunk) for chunk in chunks]

    def finish(self) -> tuple[int, int]:
        failed = self._failed + sum(future.result() for future in self._pending)
        self._pending = []
        return self._sources - failed, failed


def compile_bytecode(
    venv: str, before: set[str], clamp: tuple[int, int] | None = None
) -> tuple[int, int]:
    """Byte-compile the sources of the distributions installed in `venv` since `before` (its
    dist_infos then), on every core (Compiler): (files compiled, files that did not compile)."""
    with Compiler(clamp) as compiler:
        compiler.add(dist_infos(venv) - before)
        return compiler.finish()


def step_started() -> int:
    """When this RUN's first process (PID 1 of the build's container) started, in nanoseconds
    since the epoch: every file with a later modification time was changed by this step."""
    with open("/proc/1/stat", encoding="ascii") as handle:
        # The command may hold spaces and parentheses: the fields after its last ')'.
        fields = handle.read().rpartition(")")[2].split()
    ticks = int(fields[19])  # starttime, field 22: clock ticks after boot
    # When the machine booted, to the nanosecond (/proc/stat's btime is whole seconds, which
    # would take in what the engine made for the container just before it started).
    boot = time.time_ns() - time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    return boot + ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def mount_points() -> set[str]:
    """The mount points this process sees, but the root."""
    found = set()
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) > 4:
                    found.add(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4]))
    except OSError:
        pass
    found.discard("/")
    return found


def clamp_time(path: str, info: os.stat_result, since_ns: int, epoch_ns: int, now_ns: int) -> int:
    """Give `path` (`info`, its lstat) the time `epoch_ns` if it was modified at or after
    `since_ns` but not after `now_ns`, without following a link: 1 if it was, else 0."""
    if not since_ns <= info.st_mtime_ns <= now_ns:
        return 0
    os.utime(path, ns=(epoch_ns, epoch_ns), follow_symlinks=False)
    return 1


def clamp_times(
    root: str, since_ns: int, epoch: int, skip: set[str] | frozenset[str] = frozenset()
) -> int:
    """Give every file, link and folder under `root` modified at or after `since_ns` (but not
    after now) the modification time `epoch`, without following links or entering `skip`:
    how many. A file an earlier layer holds keeps its time unless this step changed it, so the
    step's layer neither grows nor holds the time it was built at."""
    epoch_ns = epoch * 1_000_000_000
    now_ns = time.time_ns() + 1_000_000_000

    def clamp(path: str, info: os.stat_result) -> int:
        return clamp_time(path, info, since_ns, epoch_ns, now_ns)

    clamped = 0
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            if entry.path in skip:
                continue
            try:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                clamped += clamp(entry.path, entry.stat(follow_symlinks=False))
            except OSError:
                continue
    with contextlib.suppress(OSError):  # the root last: clamping what it holds dates no folder
        clamped += clamp(root, os.stat(root, follow_symlinks=False))
    return clamped


UV_CACHE_INFO = "uv_cache.json"


def stamp_uv_cache_info(venv: str, before: set[str], epoch: int) -> int:
    """Give the uv_cache.json of each distribution installed since `before` (its dist_infos
    then) the time `epoch`, and its RECORD the new file's hash: how many. uv writes the time of
    the local wheel it installed from there (a wheelhouse's, the OS's pip), which is the time it
    was fetched or copied; the file serves uv's own cache, which an image never reaches."""
    stamped = 0
    for info in sorted(dist_infos(venv) - before):
        path = os.path.join(info, UV_CACHE_INFO)
        try:
            with open(path, encoding="utf-8") as handle:
                cached = json.load(handle)
        except (OSError, ValueError, RecursionError):  # not uv's: left as it is
            continue
        if not isinstance(cached, dict) or not isinstance(cached.get("timestamp"), dict):
            continue
        cached["timestamp"] = {"secs_since_epoch": epoch, "nanos_since_epoch": 0}
        data = json.dumps(cached, separators=(",", ":")).encode()
        with open(path, "wb") as handle:
            handle.write(data)
        _rerecord(info, f"{os.path.basename(info)}/{UV_CACHE_INFO}", data)
        stamped += 1
    return stamped


def _rerecord(info: str, name: str, data: bytes) -> None:
    """The row of `name` in the RECORD of `info` with the hash and size of `data`."""
    record = os.path.join(info, "RECORD")
    try:
        with open(record, encoding="utf-8", newline="") as handle:
            rows = list(csv.reader(handle))
    except (OSError, csv.Error):
        return
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    rows = [
        [name, f"sha256={digest}", str(len(data))] if row[:1] == [name] else row for row in rows
    ]
    with open(record, "w", encoding="utf-8", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerows(rows)


def clamp_step(epoch: int, since_ns: int) -> int:
    """clamp_times over the whole file system of the build's container, for `--epoch`."""
    skip = mount_points() | set(CONTAINER_PATHS)
    return clamp_times("/", since_ns, epoch, skip)


def make_venv(venv: str, lock: str | None, scratch: str) -> str | None:
    """The venv, made without pip unless it is there; and for a `lock`, the requirements file
    (in `scratch`) that seeds it as `python3 -m venv` would: the seed wheels the lock does not
    pin, with their hashes. None when ensurepip made the venv (no seed wheels found), when
    there is no `lock` to seed with, or when the lock pins every seed."""
    # uv installs the seeds in the lock's first run, in one bytecode pass: ensurepip runs pip to
    # install pip (3.0 s here), a uv run of their own took 1.4 s, and a seed the lock pins
    # again (torch's setuptools) was installed, compiled and replaced.
    wheels = seed_wheels()
    if not os.path.exists(os.path.join(venv, "bin", "python")):  # an --only step made it
        without_pip = ["--without-pip"] if wheels else []  # else ensurepip brings its own
        subprocess.run([sys.executable, "-m", "venv", *without_pip, venv], check=True)
    if not wheels or lock is None:
        return None
    # Nor those an earlier step installed: a seed is a local file, which uv installs again
    # when its time differs from the one the installed copy recorded (see stamp_uv_cache_info).
    pinned = set(lock_names(lock)) | {name for name, _ in installed(venv)}
    lines = []
    for wheel in wheels:
        name = canonical(os.path.basename(wheel).split("-", 1)[0])
        if name in pinned:
            continue
        url = "file://" + urllib.parse.quote(os.path.abspath(wheel))
        lines.append(f"{name} @ {url} --hash=sha256:{sha256_of(wheel)}\n")
    return write_requirements(scratch, SEEDS_NAME, lines) if lines else None


def lock_part(lock: str, pattern: str, scratch: str) -> str:
    """A requirements file (in `scratch`) of the lock's pins whose canonical names match
    `pattern` (fnmatch), each with its hash lines."""
    kept = [
        line
        for name, _, lines in lock_requirements(lock)
        if fnmatch.fnmatchcase(name, pattern)
        for line in lines
    ]
    if not kept:
        msg = f"{lock} pins no package named {pattern}; nothing to install in this step"
        raise InstallError(msg)
    return write_requirements(scratch, PART_NAME, kept)


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares it."""
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_names(lock: str) -> list[str]:
    """The canonical names of the lock's pinned packages."""
    return [name for name, _ in lock_pins(lock)]


def lock_pins(lock: str) -> list[tuple[str, str]]:
    """The lock's pins: (canonical name, version in lower case)."""
    return [(name, version) for name, version, _ in lock_requirements(lock)]


@dataclass(frozen=True)
class Inputs:
    """What the install uses and the image must not keep, where this RUN finds it."""

    config: Config
    uv: str
    ca: str | None
    wheels: str  # the wheelhouse's folder for --find-links, "" without one
    cache: str | None  # uv's cache folder, None for none
    served: str  # the build server's URL, "" when mounted


def served_inputs(serve: str, lock: str, scratch: str, venv: str = "") -> Inputs:
    """Fetch what the build server offers into `scratch` (the classic builder's way); not the
    wheels of what `venv` holds already."""
    config = parse_config(fetch(serve + CONFIG_NAME))
    uv = os.path.join(scratch, UV_NAME)
    fetch(serve + UV_NAME, uv)
    os.chmod(uv, 0o700)
    ca_path = None
    if config.ca_bundle:
        ca_path = os.path.join(scratch, CA_NAME)
        fetch(serve + CA_NAME, ca_path)
    wheels = fetch_wheels(serve, lock, scratch, venv) if config.find_links else ""
    return Inputs(config=config, uv=uv, ca=ca_path, wheels=wheels, cache=None, served=serve)


def mounted_inputs(root: str) -> Inputs:
    """What BuildKit mounted under `root` (see SECRETS_DIR, INPUTS_DIR, CACHE_DIR)."""
    config_path = os.path.join(root, SECRETS_DIR, CONFIG_NAME)
    try:
        with open(config_path, "rb") as handle:
            config = parse_config(handle.read(1024 * 1024))
    except OSError as exc:
        msg = (
            f"no {config_path} ({exc.strerror}): the build's secret was not mounted; "
            "build with `envbuild build`, not with `docker build`"
        )
        raise InstallError(msg) from exc
    inputs = os.path.join(root, INPUTS_DIR)
    ca_path = None
    if config.ca_bundle:
        found = [
            path
            for path in (os.path.join(root, SECRETS_DIR, CA_NAME), os.path.join(inputs, CA_NAME))
            if os.path.isfile(path)
        ]
        if not found:
            msg = f"config.json names a CA bundle, but none is mounted at {root}"
            raise InstallError(msg)
        ca_path = found[0]
    cache = os.path.join(root, CACHE_DIR)
    return Inputs(
        config=config,
        uv=os.path.join(inputs, UV_NAME),
        ca=ca_path,
        wheels=os.path.join(inputs, WHEELS_NAME.rstrip("/")) if config.find_links else "",
        cache=cache if os.path.isdir(cache) else None,
        served="",
    )


def install(
    source: str,
    venv: str,
    lock: str,
    scratch: str,
    only: str | None,
    *,
    mounted: bool = False,
    epoch: int | None = None,
    since_ns: int = 0,
    bytecode: bool = True,
) -> Phases:
    """Gather the inputs (fetched from the server at `source` into `scratch`, or mounted under
    `source`), create the venv unless it is there, install the lock (`only`: the lock's
    packages whose names match that pattern) and byte-compile it unless not `bytecode`;
    `scratch` is the caller's to remove. With an `epoch`, what the step changed since
    `since_ns` gets that time before it is compiled."""
    clock = Phases()
    wanted = lock if only is None else lock_part(lock, only, scratch)
    inputs = mounted_inputs(source) if mounted else served_inputs(source, wanted, scratch, venv)
    clock.done("inputs")
    config = inputs.config
    environment = uv_environment(config, dict(os.environ), inputs.ca)
    # uv's own temporary files go to scratch too, so they leave with it.
    environment["TMPDIR"] = scratch
    if inputs.cache is not None:
        # The cache is another file system than the venv's: copy, and say nothing about it.
        environment["UV_LINK_MODE"] = "copy"
    seeds = make_venv(venv, lock if only is None else None, scratch)
    before = dist_infos(venv)
    clock.done("venv")
    local, rest = (
        split_verified(wanted, inputs.wheels, scratch, venv) if inputs.wheels else (None, wanted)
    )
    clock.done("hashes")
    # The sources get the epoch as they are compiled; the rest of what the step changed gets it
    # at its end (main's clamp_step), in the one walk of the whole file system a step needs.
    with Compiler(None if epoch is None else (since_ns, epoch)) as compiler:
        if local is not None:
            verified, requirements = local
            # The seeds go with the wheelhouse's: their bytecode is made while the index's
            # packages download, not after the last run (pip's and setuptools' 1.6 s of CPU).
            code, _ = run_uv(
                uv_local_command(inputs.uv, verified, venv, requirements, seeds, inputs.cache),
                environment,
            )
            seeds = None
            if code != 0:
                msg = (
                    f"uv could not install the wheelhouse's wheels of {lock} (exit {code}); "
                    "see its output above"
                )
                raise InstallError(msg)
            installed_locally = dist_infos(venv)
            if bytecode:
                compiler.add(installed_locally - before)  # compiles while the next run downloads
        else:
            installed_locally = before
        if rest is not None or seeds is not None:
            command = uv_command(inputs.uv, config, inputs.wheels, venv, rest, seeds, inputs.cache)
            code, tail = run_uv(command, environment)
            if code != 0:
                msg = (
                    refused_index(config, first_package(rest or wanted), inputs.ca)
                    or network_failure(tail, inputs.served)
                    or f"uv could not install {lock} (exit {code}); see its output above"
                )
                raise InstallError(msg)
        clock.done("install")
        if bytecode:
            compiler.add(dist_infos(venv) - installed_locally)
        if epoch is not None:
            stamp_uv_cache_info(venv, before, epoch)
        compiled, failed = compiler.finish()
    clock.done("bytecode")
    print(
        f"envbuild install: {compiled} files byte-compiled"
        + (
            f", {failed} did not compile (they compile on import, if ever imported)"
            if failed
            else ""
        )
        + ("" if bytecode else " (--no-bytecode)"),
        file=sys.stderr,
    )
    # uv's own lock file of the environment (empty, world-writable): nothing the image needs.
    uv_lock = os.path.join(venv, ".lock")
    if os.path.isfile(uv_lock) and os.path.getsize(uv_lock) == 0:
        os.remove(uv_lock)
    return clock


USAGE = (
    "usage: ENVBUILD_SERVE=URL install_env.py [--only PATTERN] [--epoch SECONDS] [--no-bytecode]"
    " VENV LOCK\n"
    "       install_env.py --mounted ROOT [--only PATTERN] [--epoch SECONDS] [--no-bytecode]"
    " VENV LOCK"
)
OPTIONS = ("--only", "--mounted", "--epoch")  # each with a value
FLAGS = ("--no-bytecode",)
STEP_PATH = "/install_env.py"  # where the Dockerfile's COPY puts the installer (install.j2)


def main(argv: list[str]) -> int:
    """Install, then remove every fetched file, the config and the temporary folder."""
    options: dict[str, str] = {}
    while argv and argv[0] not in options:
        if argv[0] in FLAGS:
            options[argv[0]], argv = "", argv[1:]
        elif len(argv) >= 2 and argv[0] in OPTIONS:
            options[argv[0]], argv = argv[1], argv[2:]
        else:
            break
    epoch = options.get("--epoch")
    if len(argv) != 2 or not (epoch is None or epoch.isdigit()):
        print(USAGE, file=sys.stderr)
        return 2
    mounted = "--mounted" in options
    source = options.get("--mounted") or os.environ.get(SERVE_VARIABLE, "")
    if not mounted and (not source.startswith("http://") or not source.endswith("/")):
        print(
            f"envbuild install: {SERVE_VARIABLE} is not set to envbuild's build server; "
            "build with `envbuild build`, not with `docker build`",
            file=sys.stderr,
        )
        return 2
    here = os.path.abspath(__file__)
    if epoch is not None and here != STEP_PATH:
        # clamp_step walks "/" and dates what changed since PID 1 started: on a host, that is
        # every file changed since the machine booted.
        print(
            f"envbuild install: --epoch dates every file changed since PID 1 started, across the "
            f"whole file system; it runs only as a build step's {STEP_PATH}, not as {here}",
            file=sys.stderr,
        )
        return 2
    since_ns = step_started() if epoch is not None else 0
    at = None if epoch is None else int(epoch)
    scratch = tempfile.mkdtemp(prefix="envbuild-install-")
    try:
        clock = install(
            source, argv[0], argv[1], scratch, options.get("--only"),
            mounted=mounted, epoch=at, since_ns=since_ns, bytecode="--no-bytecode" not in options,
        )  # fmt: skip
    except (InstallError, subprocess.CalledProcessError) as exc:
        print(f"envbuild install: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    clock.done("clean-up")
    if at is not None:  # the .pyc files, and the folders the clean-up changed
        clock.done(f"times of {clamp_step(at, since_ns)} paths")
    print(f"envbuild install: {clock}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
