"""Install envbuild.lock into a fresh venv, inside the image's one install RUN (stdlib only).

envbuild serves what the install needs but the image must never hold (the uv binary, the CA
bundle, the index URLs with their credentials, the wheelhouse) from the host for the duration
of the build; the build argument ENVBUILD_SERVE is that server's URL. This script fetches uv,
the CA bundle and config.json from it into a private temporary folder, creates the venv
(`python3 -m venv`, pip included), runs

    uv pip install --python VENV/bin/python --require-hashes --no-deps --no-cache -r LOCK

with the CA bundle in SSL_CERT_FILE and the indexes in uv's environment variables (never on a
command line), and removes the temporary folder whatever happens. Usage:

    ENVBUILD_SERVE=http://GATEWAY:PORT/PREFIX/ python3 install_env.py VENV LOCK
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

SERVE_VARIABLE = "ENVBUILD_SERVE"
CONFIG_NAME = "config.json"
UV_NAME = "uv"
CA_NAME = "ca.crt"
WHEELS_NAME = "wheels/"
FETCH_TIMEOUT = 120.0  # seconds without a byte from the host's server
_CONFIG_KEYS = {"index_url", "extra_index_urls", "find_links", "offline", "ca_bundle"}


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


def uv_command(uv: str, config: Config, serve: str, venv: str, lock: str) -> list[str]:
    """uv's command line: no index URL on it (they may hold credentials)."""
    command = [
        uv, "pip", "install", "--python", os.path.join(venv, "bin", "python"),
        "--require-hashes", "--no-deps", "--no-cache", "--compile-bytecode", "--no-progress",
    ]  # fmt: skip
    if config.find_links:
        command += ["--find-links", serve + WHEELS_NAME]
    if config.offline:
        command.append("--no-index")
    return [*command, "-r", lock]


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
    return env


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


def make_venv(uv: str, venv: str, environment: dict[str, str]) -> None:
    """A venv with pip, as `python3 -m venv` makes it, in a third of the time: ensurepip runs
    pip to install pip (about 3 s); uv installs the same wheels from the same folder."""
    wheels = seed_wheels()
    if not wheels:  # no seed wheels where we look: let ensurepip find its own
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
        return
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    command = [
        uv, "pip", "install", "--python", os.path.join(venv, "bin", "python"), "--offline",
        "--no-index", "--no-deps", "--no-cache", "--compile-bytecode", "--quiet", *wheels,
    ]  # fmt: skip
    result = subprocess.run(command, env=environment, check=False)
    if result.returncode != 0:
        msg = f"uv could not seed the venv with {', '.join(map(os.path.basename, wheels))}"
        raise InstallError(msg)


def install(serve: str, venv: str, lock: str, scratch: str) -> None:
    """Fetch into `scratch`, create the venv, install the lock; `scratch` is the caller's to remove."""
    clock = Phases()
    config = parse_config(fetch(serve + CONFIG_NAME))
    uv = os.path.join(scratch, UV_NAME)
    fetch(serve + UV_NAME, uv)
    os.chmod(uv, 0o700)
    ca_path = None
    if config.ca_bundle:
        ca_path = os.path.join(scratch, CA_NAME)
        fetch(serve + CA_NAME, ca_path)
    clock.done("fetch uv")
    environment = uv_environment(config, dict(os.environ), ca_path)
    # uv's own temporary files go to scratch too, so they leave with it.
    environment["TMPDIR"] = scratch
    make_venv(uv, venv, environment)
    clock.done("venv")
    result = subprocess.run(uv_command(uv, config, serve, venv, lock), env=environment, check=False)
    if result.returncode != 0:
        msg = f"uv could not install {lock} (exit {result.returncode}); see its output above"
        raise InstallError(msg)
    clock.done("install")
    print(f"envbuild install: {clock}", file=sys.stderr)
    # uv's own lock file of the environment (empty, world-writable): nothing the image needs.
    uv_lock = os.path.join(venv, ".lock")
    if os.path.isfile(uv_lock) and os.path.getsize(uv_lock) == 0:
        os.remove(uv_lock)


def main(argv: list[str]) -> int:
    """Install, then remove every fetched file, the config and the temporary folder."""
    if len(argv) != 2:
        print("usage: ENVBUILD_SERVE=URL install_env.py VENV LOCK", file=sys.stderr)
        return 2
    serve = os.environ.get(SERVE_VARIABLE, "")
    if not serve.startswith("http://") or not serve.endswith("/"):
        print(
            f"envbuild install: {SERVE_VARIABLE} is not set to envbuild's build server; "
            "build with `envbuild build`, not with `docker build`",
            file=sys.stderr,
        )
        return 2
    scratch = tempfile.mkdtemp(prefix="envbuild-install-")
    try:
        install(serve, argv[0], argv[1], scratch)
    except (InstallError, subprocess.CalledProcessError) as exc:
        print(f"envbuild install: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
