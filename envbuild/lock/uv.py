"""Resolving one entry with uv: the command line (the image's Python and platform, indexes in
the environment, never on a command line `ps` shows), bounded in time and output, and uv's
failures reduced to one redacted line. `envbuild/lock/lockfile.py` writes what comes back as a lock."""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from envbuild.core.errors import BadInput, EnvbuildError
from envbuild.core.models import BuildOptions, Entry, Knowledge
from envbuild.core.places import uv_cache_dir
from envbuild.core.platforms import MACHINE
from envbuild.core.redact import redact
from envbuild.lock.reach import Reachability
from envbuild.lock.wheelhouse import framework_index
from envbuild.net.trust import trust_session

UV_TIMEOUT_S = 300
MAX_LOCK_BYTES = 16 << 20  # a lock with hashes of a large environment is well under 1 MiB
MAX_UV_MESSAGE_BYTES = 64 << 10
MAX_REASON_CHARS = 600

_USERINFO = re.compile(r"(://)[^/\s@]*@")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def platform_tag(entry: Entry, knowledge: Knowledge) -> str:
    """uv's --python-platform for the entry's image: <its machine>-manylinux_<glibc of its OS>
    (x86_64-manylinux_2_36; aarch64-manylinux_2_36 for linux/arm64)."""
    base = knowledge.os_bases.get(entry.os)
    if base is None or base.glibc is None:
        msg = (
            f"matrices/knowledge/os.yaml: bases.{entry.os}.glibc: missing; add the glibc "
            "version of that OS (e.g. '2.36') with its glibc_source"
        )
        raise BadInput(msg)
    return f"{MACHINE[entry.platform]}-manylinux_" + base.glibc.replace(".", "_")


def clean(text: str) -> str:
    """uv's text with secrets and URL user-info taken out."""
    return _USERINFO.sub(r"\1***@", redact(_ANSI.sub("", text)))


def one_line_reason(message: str) -> tuple[bool, str]:
    """(the resolver found no solution, uv's reason in one line) from uv's stderr.

    A conflict keeps the resolver's own explanation ("Because transformers==4.50.0 depends on
    torch>=2.6 and you require torch==2.4.1, ..."); any other failure its first line and the
    innermost cause (e.g. the DNS error behind a failed fetch).
    """
    lines = [line.strip() for line in clean(message).splitlines() if line.strip()]
    unsatisfiable = any("No solution found" in line for line in lines)
    causes: list[list[str]] = []
    for line in lines:
        if line.startswith(("hint:", "help:")):
            break
        if line.startswith(("cause:", "╰─▶")):
            causes.append([line.removeprefix("cause:").removeprefix("╰─▶")])
        elif causes:
            causes[-1].append(line)
    first = lines[0].removeprefix("error:").strip() if lines else "uv failed without a message"
    if unsatisfiable and causes:
        picked = causes[0]
    elif causes:  # what failed, what it was doing, and the innermost cause
        outer = causes[0] if len(causes) > 1 else []
        picked = [first + ":", *outer, *([":"] if outer else []), *causes[-1]]
    else:
        picked = [first]
    reason = re.sub(r"\s+", " ", " ".join(picked)).strip(" :")
    if len(reason) > MAX_REASON_CHARS:
        reason = reason[: MAX_REASON_CHARS - 3] + "..."
    return unsatisfiable, reason


_uv_lock = threading.Lock()
_UV_KEPT = frozenset(
    [
        "UV_CACHE_DIR",
        "UV_HTTP_TIMEOUT",
        "UV_HTTP_CONNECT_TIMEOUT",
        "UV_HTTP_RETRIES",
        "UV_NATIVE_TLS",
        "UV_CONCURRENT_DOWNLOADS",
        "UV_NO_CACHE",
    ]
)


def uv_binary() -> str:
    """uv's executable, found under a lock: sysconfig's first use is not thread-safe."""
    import uv

    with _uv_lock:
        return str(uv.find_uv_bin())


def _uv_command(
    entry: Entry, options: BuildOptions, knowledge: Knowledge, output: Path
) -> list[str]:
    command = [
        uv_binary(), "pip", "compile", "-", "--generate-hashes", "--no-header",
        "--no-config", "--quiet", "--color", "never",
        "--python-version", entry.python,
        "--python-platform", platform_tag(entry, knowledge),
        "--output-file", str(output),
    ]  # fmt: skip
    if framework_index(entry, options) is not None or options.extra_index_urls:
        # As pip does at build time: the best version across all indexes. uv's default takes a
        # package only from the first index that has it, and torch's own index also serves
        # (older) numpy, jinja2 and the like.
        command += ["--index-strategy", "unsafe-best-match"]
    if options.wheelhouse is not None:
        command += ["--find-links", str(options.wheelhouse)]
    if options.offline:
        command += ["--offline", "--no-index"]
    return command


def fetch_uv(machine: str, options: BuildOptions, target: Path) -> Path:
    """Install this uv's own version, built for `machine` (aarch64), into `target` from the
    indexes and wheelhouse `options` name; the binary's path. A build for another platform runs
    that one: the host's cannot run in the image. EnvbuildError (one line) when it cannot."""
    import importlib.metadata

    version = importlib.metadata.version("uv")
    command = [
        uv_binary(), "pip", "install", "--no-config", "--quiet", "--color", "never",
        "--target", str(target), "--python-version", "3.11",
        "--python-platform", f"{machine}-manylinux_2_28",
        "--only-binary", ":all:", "--no-deps", f"uv=={version}",
    ]  # fmt: skip
    if options.wheelhouse is not None:
        command += ["--find-links", str(options.wheelhouse)]
    if options.offline:
        command += ["--offline", "--no-index"]
    environment = _index_environment(options, list(options.extra_index_urls))
    try:
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, env=environment,
            timeout=UV_TIMEOUT_S, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        msg = f"uv {version} for {machine}: not fetched within {UV_TIMEOUT_S} s; check the index"
        raise EnvbuildError(msg) from exc
    binary = target / "bin" / "uv"
    if done.returncode != 0 or not binary.is_file():
        message = done.stderr[:MAX_UV_MESSAGE_BYTES].decode("utf-8", errors="replace")
        reason = one_line_reason(message)[1] if done.returncode != 0 else "no bin/uv in its wheel"
        msg = (
            f"cannot fetch uv {version} for {machine}, which builds for that platform run: "
            f"{reason}; put its wheel (uv-{version}-*{machine}*.whl) in --wheelhouse"
        )
        raise EnvbuildError(msg)
    return binary


def _uv_environment(entry: Entry, options: BuildOptions) -> dict[str, str]:
    extra = [*options.extra_index_urls]
    own = framework_index(entry, options)
    if own is not None:
        extra.append(own)
    return _index_environment(options, extra)


def _index_environment(options: BuildOptions, extra: list[str]) -> dict[str, str]:
    # Index URLs travel in the environment: a command line is visible to `ps`. The user's own
    # UV_* settings are left out, bar a few that cannot change the result, so that the lock
    # depends on envbuild's inputs alone.
    env = {k: v for k, v in os.environ.items() if not k.startswith("UV_") or k in _UV_KEPT}
    if not options.proxy.empty:
        # The chosen proxy (--proxy, the environment or Docker's config), in both cases: uv
        # would otherwise prefer a variable the choice overrode.
        proxy_names = {"http_proxy", "https_proxy", "no_proxy", "all_proxy"}
        env = {k: v for k, v in env.items() if k.lower() not in proxy_names}
        env.update(options.proxy.environment())
    env["NO_COLOR"] = "1"
    if options.index_url is not None:
        env["UV_INDEX_URL"] = options.index_url
    if extra:
        env["UV_EXTRA_INDEX_URL"] = " ".join(extra)
    if options.ca_bundle is not None:
        env["SSL_CERT_FILE"] = str(options.ca_bundle)
    if "UV_NO_CACHE" not in env:
        # uv's own default, ~/.cache/uv, fails the whole resolution when HOME cannot hold it.
        cache = uv_cache_dir()
        if cache is None:
            env["UV_NO_CACHE"] = "1"  # uv keeps a temporary cache for the run
        else:
            env["UV_CACHE_DIR"] = str(cache)
    return env


@dataclass(frozen=True, kw_only=True)
class Resolution:
    """What uv made of an entry: the pinned requirements, or why there are none."""

    body: str  # uv's requirements with hashes; empty when unresolvable
    unresolvable: str | None


def resolve(
    entry: Entry,
    options: BuildOptions,
    knowledge: Knowledge,
    *,
    previous: str | None = None,
    upgrade: bool = False,
    reachability: Reachability | None = None,
) -> Resolution:
    """Resolve the entry with uv, keeping `previous`'s pins where they still fit (unless
    `upgrade`); EnvbuildError (one line) when uv fails for any reason but the requirements,
    and at once when an index it needs cannot be reached (`reachability`: what the run knows)."""
    requirements = "\n".join([entry.install.requirement, *entry.packages]) + "\n"
    environment = _uv_environment(entry, options)  # a cache that cannot be used says so first
    unreachable = (reachability or Reachability()).unreachable_index(entry, options)
    if unreachable is not None:
        raise EnvbuildError(unreachable)
    try:
        with tempfile.TemporaryDirectory(prefix="envbuild-lock-") as scratch:
            output = Path(scratch) / "lock.txt"
            if previous and not upgrade:
                output.write_text(previous, encoding="utf-8")  # uv prefers its pins
            errors = Path(scratch) / "uv.err"
            with errors.open("wb") as err:
                done = subprocess.run(
                    _uv_command(entry, options, knowledge, output),
                    input=requirements.encode(),
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                    env=environment,
                    timeout=UV_TIMEOUT_S,
                    check=False,
                )
            with errors.open("rb") as handle:
                message = handle.read(MAX_UV_MESSAGE_BYTES).decode("utf-8", errors="replace")
            if done.returncode != 0:
                refused = refused_index(entry, options)
                if refused is not None:
                    msg = f"{entry.id}: {refused}"
                    raise EnvbuildError(msg)
                unsatisfiable, reason = one_line_reason(message)
                if unsatisfiable:
                    return Resolution(body="", unresolvable=reason)
                msg = f"{entry.id}: uv could not resolve its lock: {reason}"
                raise EnvbuildError(msg)
            if output.stat().st_size > MAX_LOCK_BYTES:
                msg = f"{entry.id}: uv wrote a lock over {MAX_LOCK_BYTES >> 20} MiB; list fewer packages"
                raise EnvbuildError(msg)
            body = output.read_text(encoding="utf-8", errors="replace")
    except subprocess.TimeoutExpired as exc:
        msg = (
            f"{entry.id}: uv did not finish resolving within {UV_TIMEOUT_S} s; "
            "check that the index is reachable (--index-url, --ca-bundle, --offline)"
        )
        raise EnvbuildError(msg) from exc
    except (OSError, ModuleNotFoundError) as exc:
        msg = f"{entry.id}: cannot run uv ({getattr(exc, 'strerror', None) or exc}); pip install 'uv>=0.5'"
        raise EnvbuildError(msg) from exc
    return Resolution(body=clean(body), unresolvable=None)


def refused_index(entry: Entry, options: BuildOptions) -> str | None:
    """Why uv failed, when an index refused it: uv takes an index's 401 or 403 for "no such
    package", which hides a wrong token. Asks each index for the framework's page, through the
    same proxy and CA bundle; the message names the index's origin, never its credentials."""
    import requests

    from envbuild.net.proxy import route_session
    from envbuild.payload.install_env import refused_line

    name = re.split(r"[=<>!~\[; ]", entry.install.requirement, maxsplit=1)[0]
    urls = [options.index_url, *options.extra_index_urls, framework_index(entry, options)]
    with requests.Session() as session:
        session.trust_env = False  # the chosen proxy only, and no .netrc
        route_session(session, options.proxy)
        trust_session(session, options.ca_bundle)
        for url in filter(None, urls):
            parts = urlsplit(url)
            origin = f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"  # [::1]:port kept
            path = f"{parts.path.rstrip('/')}/{name}/"
            auth = (
                (unquote(parts.username), unquote(parts.password or "")) if parts.username else None
            )
            try:
                answer = session.get(
                    origin + path, auth=auth, timeout=10, allow_redirects=False, stream=True
                )
                answer.close()
            except (requests.RequestException, ValueError):
                continue
            if answer.status_code in (401, 403):
                return refused_line(origin, path, answer.status_code, credentials=auth is not None)
    return None
