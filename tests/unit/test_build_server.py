"""The build server (a real one, on loopback) and the installer that runs against it in the image.

The server must hand out its fixed files under its random prefix and nothing else, to GET only,
on the one address it was given, and be gone when its block ends, however it ends.
"""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import http.client
import json
import multiprocessing
import os
import random
import socket
import struct
import subprocess
import sys
import time
import urllib.parse
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from envbuild.build import render
from envbuild.build import server as build_server
from envbuild.build.server import build_files, config_document, listing, serve
from envbuild.core.errors import BuildFailed
from envbuild.core.interrupt import Terminated
from envbuild.core.models import ServedInputs
from envbuild.lock.uv import uv_binary
from envbuild.payload import install_env

LOOPBACK = "127.0.0.1"
CA = b"-----BEGIN CERTIFICATE-----\nthe team's CA\n-----END CERTIFICATE-----\n"
WHEEL = "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"


def make_inputs(tmp_path: Path) -> ServedInputs:
    (tmp_path / "ca.pem").write_bytes(CA)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / WHEEL).write_bytes(b"torch wheel bytes")
    (tmp_path / "secret.txt").write_bytes(b"host secret")
    return ServedInputs(
        ca_bundle=tmp_path / "ca.pem",
        wheels=(wheels / WHEEL,),
        index_url="https://team:pw-1@mirror.example/simple",
        extra_index_urls=("https://download.pytorch.org/whl/cpu",),
    )


@pytest.fixture
def inputs(tmp_path: Path) -> ServedInputs:
    return make_inputs(tmp_path)


@pytest.fixture(scope="module")
def shared_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One server for the read-only probes: starting one per case costs its shutdown each."""
    folder = tmp_path_factory.mktemp("served")
    (folder / "uv").write_bytes(b"uv binary")
    with serve(LOOPBACK, build_files(make_inputs(folder), folder / "uv")) as base:
        yield base


@pytest.fixture
def uv(tmp_path: Path) -> Path:
    path = tmp_path / "uv"
    path.write_bytes(b"uv binary")
    return path


@pytest.fixture
def url(inputs: ServedInputs, uv: Path) -> Iterator[str]:
    with serve(LOOPBACK, build_files(inputs, uv)) as base:
        yield base


def request(
    base: str, path: str, method: str = "GET", body: bytes | None = None
) -> tuple[int, bytes]:
    """Send `path` exactly as written (no client-side normalisation)."""
    parsed = urllib.parse.urlsplit(base)
    connection = http.client.HTTPConnection(parsed.hostname or "", parsed.port, timeout=10)
    try:
        connection.putrequest(method, path, skip_host=False, skip_accept_encoding=True)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def prefix_of(base: str) -> str:
    return urllib.parse.urlsplit(base).path  # "/<prefix>/"


def test_it_serves_its_files_under_its_prefix(url: str, inputs: ServedInputs) -> None:
    prefix = prefix_of(url)
    assert request(url, prefix + "ca.crt") == (200, CA)
    assert request(url, prefix + "uv") == (200, b"uv binary")
    status, config = request(url, prefix + "config.json")
    assert status == 200
    assert install_env.parse_config(config) == install_env.Config(
        index_url=inputs.index_url, extra_index_urls=inputs.extra_index_urls,
        find_links=True, offline=False, ca_bundle=True,
    )  # fmt: skip
    assert request(url, prefix + "wheels/" + urllib.parse.quote(WHEEL)) == (
        200,
        b"torch wheel bytes",
    )
    assert len(prefix) > 40  # token_urlsafe(32): not guessable


def test_the_wheelhouse_listing_works_as_find_links(url: str) -> None:
    status, page = request(url, prefix_of(url) + "wheels/")
    assert status == 200
    assert f'<a href="{urllib.parse.quote(WHEEL)}">' in page.decode()
    assert "%2B" in urllib.parse.quote(WHEEL)  # the local version's "+" survives the trip


def hostile_paths() -> list[str]:
    """Paths that try to leave the served set; {p} is the real prefix."""
    targets = [
        "../secret.txt",
        "../ca.pem",
        "../../etc/passwd",
        "wheels/../ca.crt/../../secret.txt",
    ]
    encodings = [
        lambda t: t,
        lambda t: t.replace("/", "%2f"),
        lambda t: t.replace(".", "%2e"),
        lambda t: t.replace("/", "%252f").replace(".", "%252e"),
        lambda t: t.replace("/", "\\"),
        lambda t: t.replace("/", "%5c"),
    ]
    paths = [f"{{p}}{encode(t)}" for t in targets for encode in encodings]
    paths += [f"{{p}}wheels/{encode(t)}" for t in targets for encode in encodings]
    paths += [
        "/", "/ca.crt", "/wrong-prefix/ca.crt", "{p}", "{p}wheels", "{p}ca.crt?x=1", "{p}ca.crt#x",
        "{p}CA.CRT", "{p}/ca.crt", "{p}./ca.crt", "{p}ca.crt%00", "{p}%63a.crt/..", "*",
        "http://evil.example{p}ca.crt",
    ]  # fmt: skip
    return paths


@pytest.mark.parametrize("path", hostile_paths())
def test_nothing_outside_its_files_is_served(shared_url: str, path: str) -> None:
    status, body = request(shared_url, path.format(p=prefix_of(shared_url)))
    assert status in (400, 404)
    assert b"host secret" not in body
    assert CA not in body


def test_a_wrong_prefix_of_the_right_length_is_refused(url: str) -> None:
    prefix = prefix_of(url)
    wrong = prefix[:-2] + ("A" if prefix[-2] != "A" else "B") + "/"
    assert request(url, wrong + "ca.crt")[0] == 404


def test_a_link_planted_in_the_wheelhouse_is_not_followed(url: str, inputs: ServedInputs) -> None:
    wheel = inputs.wheels[0]
    wheel.unlink()
    wheel.symlink_to(wheel.parent.parent / "secret.txt")  # swapped after the server started
    status, body = request(url, prefix_of(url) + "wheels/" + urllib.parse.quote(WHEEL))
    assert (status, b"host secret" in body) == (404, False)


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
def test_only_get_is_answered(url: str, method: str) -> None:
    status, _ = request(url, prefix_of(url) + "ca.crt", method, b"new contents")
    assert status in (405, 501)
    assert request(url, prefix_of(url) + "ca.crt") == (200, CA)


def refused(base: str) -> bool:
    parsed = urllib.parse.urlsplit(base)
    try:
        socket.create_connection((parsed.hostname, parsed.port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_it_is_gone_when_its_block_ends(inputs: ServedInputs, uv: Path) -> None:
    with serve(LOOPBACK, build_files(inputs, uv)) as base:
        parsed = urllib.parse.urlsplit(base)
        kept = http.client.HTTPConnection(parsed.hostname or "", parsed.port, timeout=10)
        kept.request("GET", prefix_of(base) + "uv")
        assert kept.getresponse().read() == b"uv binary"  # a kept-alive connection
    assert refused(base)

    def again() -> bytes:
        kept.request("GET", prefix_of(base) + "ca.crt")
        return kept.getresponse().read()

    with pytest.raises((OSError, http.client.HTTPException)):
        again()
    kept.close()


@pytest.mark.parametrize("error", [Terminated, KeyboardInterrupt, BuildFailed])
def test_it_is_gone_when_the_build_fails_or_is_interrupted(
    inputs: ServedInputs, uv: Path, error: type[BaseException]
) -> None:
    seen: list[str] = []

    def build() -> None:
        with serve(LOOPBACK, build_files(inputs, uv)) as base:
            seen.append(base)
            assert request(base, prefix_of(base) + "uv")[0] == 200
            raise error("build failed") if error is BuildFailed else error()

    with pytest.raises(error):
        build()
    assert refused(seen[0])


def test_it_listens_on_the_given_address_only(url: str) -> None:
    port = urllib.parse.urlsplit(url).port
    with socket.create_connection((LOOPBACK, port), timeout=5) as connection:
        assert connection.getpeername() == (LOOPBACK, port)
    with pytest.raises(ConnectionRefusedError):  # another address of this host, same port
        socket.create_connection(("127.0.0.2", port), timeout=5).close()


def test_an_address_that_is_not_this_hosts_is_one_line(inputs: ServedInputs, uv: Path) -> None:
    served = serve("192.0.2.1", build_files(inputs, uv))
    with pytest.raises(BuildFailed, match=r"cannot serve the build's files on '192\.0\.2\.1'.*"):
        served.__enter__()


def test_a_silent_connection_is_closed(
    inputs: ServedInputs, uv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(build_server._Handler, "timeout", 0.5)
    with serve(LOOPBACK, build_files(inputs, uv)) as base:
        parsed = urllib.parse.urlsplit(base)
        with socket.create_connection((parsed.hostname, parsed.port), timeout=30) as silent:
            assert silent.recv(1) == b""  # closed by the server, long before the hang guard


def test_the_config_names_no_file_and_no_index_when_offline(tmp_path: Path) -> None:
    wheel = tmp_path / WHEEL
    wheel.write_bytes(b"w")
    served = ServedInputs(wheels=(wheel,), offline=True)
    config = install_env.parse_config(config_document(served))
    assert config == install_env.Config(
        index_url=None, extra_index_urls=(), find_links=True, offline=True, ca_bundle=False
    )
    assert "ca.crt" not in build_files(served, wheel)


def listing_names() -> list[str]:
    return [WHEEL, 'a"b<c>.whl', "x&y.whl", "sp ace.whl"]


@pytest.mark.parametrize("name", listing_names())
def test_listing_links_are_escaped(name: str) -> None:
    page = listing((name,)).decode()
    href = page.split('href="', 1)[1].split('"', 1)[0]
    assert urllib.parse.unquote(href.replace("&amp;", "&")) == name
    assert "<c>" not in page


# -- the installer (envbuild/payload/install_env.py) -----------------------------------------


def bad_configs() -> list[object]:
    good = json.loads(config_document(ServedInputs(index_url="https://m.example/simple")))
    cases: list[object] = [[], "x", None, {}, {**good, "extra": 1}]
    for key in good:
        cases.append({k: v for k, v in good.items() if k != key})
        for value in (1, "yes", ["x"], {"a": 1}, "ftp://x", "https://a b"):
            if value != good[key]:
                cases.append({**good, key: value})
    cases.append({**good, "offline": True, "find_links": False})
    return [c for c in cases if not _valid(c)]


def _valid(raw: object) -> bool:
    try:
        install_env.parse_config(json.dumps(raw).encode())
    except install_env.InstallError:
        return False
    return True


@pytest.mark.parametrize("raw", bad_configs())
def test_the_installer_refuses_a_config_of_another_shape(raw: object) -> None:
    with pytest.raises(install_env.InstallError, match=r"config\.json"):
        install_env.parse_config(json.dumps(raw).encode())


@pytest.mark.parametrize("data", [b"\xff\xfe", b"{", b"[1,"])
def test_the_installer_refuses_a_config_that_is_not_json(data: bytes) -> None:
    with pytest.raises(install_env.InstallError, match=r"config\.json is not JSON"):
        install_env.parse_config(data)


def test_index_urls_travel_in_uv_environment_never_on_its_command_line() -> None:
    config = install_env.Config(
        index_url="https://team:pw-1@mirror.example/simple",
        extra_index_urls=("https://bot:pw-2@extra.example/simple", "https://x.example/cpu"),
        find_links=True, offline=False, ca_bundle=True,
    )  # fmt: skip
    serve_url = "http://172.17.0.1:4000/prefix/"
    command = install_env.uv_command(
        "/tmp/s/uv", config, "/tmp/s/wheels", "/opt/venv", "/opt/venv/envbuild.lock"
    )
    assert command[:3] == ["/tmp/s/uv", "pip", "install"]
    assert {"--require-hashes", "--no-deps", "--no-cache"} <= set(command)
    assert command[-2:] == ["-r", "/opt/venv/envbuild.lock"]
    assert command[command.index("--find-links") + 1] == "/tmp/s/wheels"  # fetched, unpacked there
    assert "--no-index" not in command
    assert not any("pw-" in part for part in command)
    base = {"PATH": "/usr/bin", "UV_INDEX_URL": "https://stale", "PIP_INDEX_URL": "https://stale",
            "SSL_CERT_FILE": "/elsewhere", "ENVBUILD_SERVE": serve_url}  # fmt: skip
    env = install_env.uv_environment(config, base, "/tmp/s/ca.crt")
    assert env["UV_INDEX_URL"] == config.index_url
    assert env["UV_EXTRA_INDEX_URL"] == " ".join(config.extra_index_urls)
    assert env["SSL_CERT_FILE"] == "/tmp/s/ca.crt"
    assert "PIP_INDEX_URL" not in env
    assert "ENVBUILD_SERVE" not in env
    assert env["PATH"] == "/usr/bin"
    offline = install_env.Config(
        index_url=None, extra_index_urls=(), find_links=True, offline=True, ca_bundle=False
    )
    assert "--no-index" in install_env.uv_command("uv", offline, "/tmp/s/wheels", "/v", "/l")
    assert "UV_INDEX_URL" not in install_env.uv_environment(offline, {}, None)


def test_uv_gives_up_on_a_dead_index_soon_and_waits_on_a_slow_download() -> None:
    config = install_env.Config(
        index_url="https://m.example/simple", extra_index_urls=(),
        find_links=False, offline=False, ca_bundle=False,
    )  # fmt: skip
    caller = {"UV_HTTP_TIMEOUT": "1", "UV_HTTP_CONNECT_TIMEOUT": "900", "UV_HTTP_RETRIES": "50"}
    env = install_env.uv_environment(config, caller, None)
    connect, read = float(env["UV_HTTP_CONNECT_TIMEOUT"]), float(env["UV_HTTP_TIMEOUT"])
    # A connect (TCP, TLS) gets seconds; a read gets half a minute without a byte, so a
    # multi-GB wheel at a slow but steady rate never meets it.
    assert 0 < connect < read
    assert read >= 30
    assert 1 <= int(env["UV_HTTP_RETRIES"]) <= 3


SECRET_INDEX = "https://team:pw-1@mirror.example:8443/simple"
SERVE = "http://172.17.0.1:4000/prefix/"


def uv_failures() -> Iterator[tuple[str, list[str], str]]:
    """uv's output for a failed request, as its versions print it (`cause:` or `Caused by:`,
    coloured or not): (case, lines, where the line must point)."""
    wheel = f"{SECRET_INDEX}/jinja2/jinja2-3.1.6-py3-none-any.whl"
    served = f"{SERVE}wheels/torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    cases = {
        "wheel-connect": ("Failed to download `jinja2==3.1.6`", [
            "Request failed after 3 retries in 44.9s", f"Failed to fetch: {wheel}",
            f"error sending request for url ({wheel})", "client error (Connect)",
            "tcp connect error", "deadline has elapsed"], "https://mirror.example:8443"),
        "page-unreachable": (f"Failed to fetch: {SECRET_INDEX}/tqdm/", [
            f"error sending request for url ({SECRET_INDEX}/tqdm/)", "client error (Connect)",
            "tcp connect error", "No route to host (os error 113)"], "https://mirror.example:8443"),
        "body-stalled": ("Request failed after 1 retry in 31.2s", [
            f"Failed to fetch: {wheel}", "error decoding response body",
            "operation timed out"], "https://mirror.example:8443"),
        "wheelhouse": ("Failed to download `torch==2.13.0+cpu`", [
            f"Failed to fetch: {served}", f"error sending request for url ({served})",
            "connection closed before message completed"], "envbuild's build server"),
    }  # fmt: skip
    for style in ("cause", "Caused by"):
        for coloured in (False, True):
            paint = (lambda s: f"\x1b[1m\x1b[31m{s}\x1b[0m") if coloured else (lambda s: s)
            for name, (error, causes, where) in cases.items():
                lines = ["Using Python 3.11.2 environment at: /opt/venv", "Resolved 11 packages"]
                lines.append(f"{paint('error')}: {error}")
                lines += [f"  {paint(style)}: {cause}" for cause in causes]
                yield f"{name}-{style}-{'colour' if coloured else 'plain'}", lines, where


@pytest.mark.parametrize(
    ("lines", "where"), [c[1:] for c in uv_failures()], ids=[c[0] for c in uv_failures()]
)
def test_a_failed_request_ends_as_one_line_naming_where_without_credentials(
    lines: list[str], where: str
) -> None:
    line = install_env.network_failure(lines, SERVE)
    assert line is not None
    assert line.startswith("uv could not download ")
    assert f"from {where}" in line if where.startswith("envbuild") else f"at {where} (" in line
    assert lines[-1].split(": ", 1)[1] in line  # the innermost reason
    assert "pw-1" not in line
    assert "team" not in line
    assert "/simple" not in line
    assert "/prefix" not in line  # the build server's path stays out of the log's last line
    assert line.isprintable()


def test_an_install_that_failed_for_another_reason_keeps_uvs_own_words() -> None:
    hash_mismatch = [
        "error: Failed to download `torch==2.13.0`",
        "  Caused by: Hash mismatch for `torch==2.13.0`",
        "", "Expected:", f"  sha256:{'0' * 64}", "", "Computed:", f"  sha256:{'1' * 64}",
    ]  # fmt: skip
    for lines in (hash_mismatch, ["error: No virtual environment found"], []):
        assert install_env.network_failure(lines, SERVE) is None


def hostile_causes() -> list[str]:
    return ["\x1b]0;title\x07\r" * 50, "x" * 100_000, "\u202e\u0000\ufffd" * 100, ""]


@pytest.mark.parametrize("cause", hostile_causes(), ids=["escapes", "long", "controls", "empty"])
def test_the_failure_line_stays_one_short_printable_line(cause: str) -> None:
    lines = [f"error: Failed to fetch: {SECRET_INDEX}/tqdm/", f"  cause: {cause}"]
    line = install_env.network_failure(lines, SERVE)
    assert line is not None
    assert line.isprintable()
    assert len(line) < 1000


def test_uvs_output_reaches_the_build_log_and_its_tail_is_kept(
    capfd: pytest.CaptureFixture[str],
) -> None:
    script = (
        "import sys\n"
        "for i in range(500): print(f'line {i}', file=sys.stderr)\n"
        "sys.stderr.write('y' * 100_000)\n"
        "sys.exit(4)\n"
    )
    code, tail = install_env.run_uv([sys.executable, "-c", script], dict(os.environ))
    assert code == 4
    assert len(tail) == install_env.UV_TAIL_LINES
    assert all(len(line) <= install_env.MAX_LINE_BYTES for line in tail)
    assert tail[0].startswith("line ")
    assert tail[-1] == "y" * (100_000 % install_env.MAX_LINE_BYTES)
    assert "line 0\n" in capfd.readouterr().err


@pytest.fixture
def silent_index() -> Iterator[str]:
    """An index whose host takes the connection and then never says a word (not even TLS)."""
    with socket.socket() as server:
        server.bind((LOOPBACK, 0))
        server.listen(16)
        yield f"https://team:pw-1@{LOOPBACK}:{server.getsockname()[1]}/simple"


def test_real_uv_gives_up_on_a_silent_index_at_the_connect_timeout(
    tmp_path: Path, silent_index: str
) -> None:
    venv, lock = tmp_path / "venv", tmp_path / "envbuild.lock"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    lock.write_text(f"tqdm==4.66.0 --hash=sha256:{'0' * 64}\n")
    config = install_env.Config(
        index_url=silent_index, extra_index_urls=(), find_links=False, offline=False,
        ca_bundle=False,
    )  # fmt: skip
    env = install_env.uv_environment(config, {"PATH": os.environ["PATH"]}, None)
    env["UV_HTTP_TIMEOUT"] = "600"  # without the connect timeout, uv would wait this long
    env["UV_HTTP_RETRIES"] = "0"  # one attempt: retries multiply the same wait
    command = install_env.uv_command(uv_binary(), config, SERVE, str(venv), str(lock))
    try:
        result = subprocess.run(  # a hang guard far above the connect timeout
            command, env=env, capture_output=True, text=True, timeout=120, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("uv ignored UV_HTTP_CONNECT_TIMEOUT (uv >= 0.10 reads it)")
    assert result.returncode != 0
    line = install_env.network_failure(result.stderr.splitlines(), SERVE)
    assert line is not None, result.stderr
    assert f"from the package index at https://{LOOPBACK}:" in line
    assert "pw-1" not in line


# Records each call (one JSON line, with the requirements files it was given) and fails the
# lock's install with `code`. (uv itself is tested where it really runs: the e2e builds.)
FAKE_UV = """#!{python}
import json, os, sys
ca = os.environ.get("SSL_CERT_FILE")
files = [sys.argv[i + 1] for i, arg in enumerate(sys.argv) if arg == "-r"]
links = sys.argv[sys.argv.index("--find-links") + 1] if "--find-links" in sys.argv else None
record = {{"argv": sys.argv[1:], "ca": open(ca).read() if ca else None,
          "requirements": [open(name).read() for name in files],
          "wheels": {{n: open(os.path.join(links, n)).read() for n in os.listdir(links)}}
                    if links else None,
          "env": {{k: v for k, v in os.environ.items() if k.startswith(("UV_", "SSL_"))}},
          "here": os.path.dirname(sys.argv[0])}}
with open({record!r}, "a") as handle:
    handle.write(json.dumps(record) + "\\n")
sys.exit({code} if "-r" in sys.argv else 0)
"""


@pytest.mark.parametrize("code", [0, 3], ids=["installed", "uv-failed"])
def test_the_installer_fetches_installs_and_leaves_nothing_behind(
    tmp_path: Path, inputs: ServedInputs, code: int
) -> None:
    record = tmp_path / "record.json"
    fake_uv = tmp_path / "fake-uv"
    fake_uv.write_text(FAKE_UV.format(python=sys.executable, record=str(record), code=code))
    scratch_root = tmp_path / "scratch"
    scratch_root.mkdir()
    venv, lock = tmp_path / "venv", tmp_path / "envbuild.lock"
    lock.write_text("torch==2.13.0+CPU \\\n    --hash=sha256:00\nSetupTools==84.2.1\n")
    other = tmp_path / "wheels" / "torch-2.12.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    other.write_bytes(b"another torch")  # in the wheelhouse, not in the lock: never fetched
    inputs = dataclasses.replace(inputs, wheels=(*inputs.wheels, other))
    script = Path(install_env.__file__)
    with serve(LOOPBACK, build_files(inputs, fake_uv)) as base:
        result = subprocess.run(
            [sys.executable, str(script), str(venv), str(lock)],
            env={**os.environ, "ENVBUILD_SERVE": base, "TMPDIR": str(scratch_root),
                 "UV_INDEX_URL": "https://stale.example"},
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert result.returncode == (0 if code == 0 else 1), result.stderr
    (seen,) = (json.loads(line) for line in record.read_text().splitlines())
    # One uv run installs the lock and seeds the venv with the pip `python3 -m venv` would
    # (the OS's own wheel, by its hash); a seed the lock pins (setuptools) comes from the lock.
    seeds = install_env.seed_wheels()
    assert seeds
    assert Path(seeds[0]).name.startswith("pip-")
    assert seen["argv"][seen["argv"].index("-r") + 1] == str(lock)
    pip = Path(seeds[0])
    digest = hashlib.sha256(pip.read_bytes()).hexdigest()
    assert seen["requirements"][1] == f"pip @ file://{pip} --hash=sha256:{digest}\n"
    assert {"--require-hashes", "--no-deps"} <= set(seen["argv"])
    assert (venv / "bin" / "python").exists()
    assert seen["ca"] == CA.decode()  # the CA bundle was there while uv ran ...
    assert seen["env"]["UV_INDEX_URL"] == inputs.index_url
    # The lock's wheels from the wheelhouse, fetched for uv to unpack from files.
    assert seen["wheels"] == {WHEEL: "torch wheel bytes"}
    assert seen["argv"][seen["argv"].index("--python") + 1] == str(venv / "bin" / "python")
    assert list(scratch_root.iterdir()) == []  # ... and uv, the CA and the config are gone
    assert not Path(seen["here"]).exists()
    if code:
        assert "uv could not install" in result.stderr
        assert "pw-1" not in result.stderr


def make_wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal pure-Python wheel: one module, its METADATA and WHEEL, and their RECORD."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = [f"{path},sha256={record_digest(data)},{len(data)}\n" for path, data in files.items()]
    files[f"{dist}/RECORD"] = "".join([*record, f"{dist}/RECORD,,\n"]).encode()
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def record_digest(data: bytes) -> str:
    """A RECORD line's digest: urlsafe base64 of the sha256, unpadded."""
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def run_installer(base: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, install_env.__file__, *args],
        env={**os.environ, "ENVBUILD_SERVE": base}, capture_output=True, text=True, timeout=300,
        check=False,
    )  # fmt: skip


def installed(venv: Path) -> set[str]:
    """The distributions in a venv, as name==version."""
    (site,) = venv.glob("lib/python3*/site-packages")
    return {
        p.name.removesuffix(".dist-info").replace("-", "==", 1) for p in site.glob("*.dist-info")
    }


def test_the_installer_puts_the_cuda_libraries_in_a_step_of_their_own_with_real_uv(
    tmp_path: Path,
) -> None:
    """The --only step installs exactly the lock's packages of that name (hashes required),
    making the venv; the step after installs the whole lock and the venv's own pip beside it:
    uv takes what the first step installed for installed. Offline, from the served wheels."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    pins = {"nvidia_fake_cu12": "12.1", "nvidia-other-cu12": "9.1", "plainpkg": "2.0"}
    made = [make_wheel(wheels, name.replace("-", "_"), version) for name, version in pins.items()]
    lock = tmp_path / "envbuild.lock"
    lock.write_text("# envbuild lock\n" + "".join(
        f"{name}=={version} \\\n    --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}\n"
        "    # via torch\n"
        for (name, version), wheel in zip(pins.items(), made, strict=True)
    ))  # fmt: skip
    served = ServedInputs(ca_bundle=None, wheels=tuple(made), index_url=None, extra_index_urls=(),
                          offline=True)  # fmt: skip
    venv = tmp_path / "venv"
    with serve(LOOPBACK, build_files(served, Path(uv_binary()))) as base:
        first = run_installer(base, "--only", "nvidia-*", str(venv), str(lock))
        assert first.returncode == 0, first.stderr
        assert installed(venv) == {"nvidia_fake_cu12==12.1", "nvidia_other_cu12==9.1"}
        whole = run_installer(base, str(venv), str(lock))
        assert whole.returncode == 0, whole.stderr
        nothing = run_installer(base, "--only", "nothing-*", str(venv), str(lock))
    seeds = {Path(wheel).name.split("-")[0] for wheel in install_env.seed_wheels()}
    assert {entry.split("==")[0] for entry in installed(venv)} == {
        "nvidia_fake_cu12", "nvidia_other_cu12", "plainpkg", *seeds
    }  # fmt: skip
    assert " + plainpkg==2.0" in whole.stderr
    assert " + nvidia" not in whole.stderr  # installed by the first step, taken as they are
    assert list(venv.rglob("plainpkg/__pycache__/*.pyc"))  # compiled in the build, not at import
    assert nothing.returncode == 1
    assert nothing.stderr.strip().splitlines()[-1] == (
        f"envbuild install: {lock} pins no package named nothing-*; nothing to install in this step"
    )


def empty_venv(tmp_path: Path) -> tuple[Path, Path]:
    """A venv's folder and its site-packages, with nothing installed."""
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    return venv, site


def fake_distribution(site: Path, name: str, files: dict[str, str], record: list[str]) -> Path:
    """A distribution as an installer leaves it in `site`: its files and a RECORD of `record`."""
    for path, text in files.items():
        (site / path).parent.mkdir(parents=True, exist_ok=True)
        (site / path).write_text(text)
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    with (info / "RECORD").open("w", newline="") as handle:
        csv.writer(handle).writerows([path, "sha256=x", "1"] for path in record)
    return info


def test_bytecode_is_compiled_for_what_the_step_installed_but_not_its_tests(
    tmp_path: Path,
) -> None:
    venv, site = empty_venv(tmp_path)
    fake_distribution(site, "older", {"older/__init__.py": "A = 1\n"}, ["older/__init__.py"])
    before = install_env.dist_infos(str(venv))
    files = {
        "pkg/__init__.py": "A = 1\n",
        "pkg/sub/mod.py": "B = 2\n",
        "pkg/quoted,name.py": "C = 3\n",
        "pkg/broken.py": "def (:\n",
        "pkg/tests/test_it.py": "T = 1\n",
        "pkg/sub/test/conftest.py": "T = 2\n",
        "pkg/data.txt": "not python\n",
    }
    outside = tmp_path / "bin" / "tool.py"  # RECORD's ../../bin/tool.py: not the package's
    outside.parent.mkdir()
    outside.write_text("X = 1\n")
    record = [*files, "../../../../bin/tool.py", "pkg/missing.py"]
    fake_distribution(site, "pkg", files, record)
    compiled, failed = install_env.compile_bytecode(str(venv), before)
    pycs = {p.relative_to(site).as_posix() for p in site.rglob("*.pyc")}
    assert pycs == {
        f"pkg/__pycache__/__init__.{sys.implementation.cache_tag}.pyc",
        f"pkg/sub/__pycache__/mod.{sys.implementation.cache_tag}.pyc",
        f"pkg/__pycache__/quoted,name.{sys.implementation.cache_tag}.pyc",
    }
    # the broken file and the one RECORD names but nobody installed count as not compiled
    assert (compiled, failed) == (3, 2)
    assert not list(outside.parent.rglob("*.pyc"))
    assert install_env.compile_bytecode(str(venv), install_env.dist_infos(str(venv))) == (0, 0)


COMPILE_MANY = 20 * install_env.COMPILE_CHUNK


def test_the_compiler_works_in_the_background_and_counts_every_batch(tmp_path: Path) -> None:
    """What a first uv run installed compiles while the caller goes on (its .pyc appears before
    `finish`); a second batch is counted with it; leaving the block on an error cancels the
    rest and leaves no worker behind."""
    venv, site = empty_venv(tmp_path)
    before = install_env.dist_infos(str(venv))
    fake_distribution(site, "first", {"first/__init__.py": "A = 1\n"}, ["first/__init__.py"])
    tag = sys.implementation.cache_tag
    with install_env.Compiler() as compiler:
        compiler.add(install_env.dist_infos(str(venv)) - before)
        first = site / "first" / "__pycache__" / f"__init__.{tag}.pyc"
        deadline = time.monotonic() + 60
        while not first.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert first.exists()  # compiled before finish was called
        middle = install_env.dist_infos(str(venv))
        fake_distribution(site, "second", {"second/a.py": "B = 2\n", "second/b.py": "def (:\n"},
                          ["second/a.py", "second/b.py"])  # fmt: skip
        compiler.add(install_env.dist_infos(str(venv)) - middle)
        assert compiler.finish() == (2, 1)
    assert (site / "second" / "__pycache__" / f"a.{tag}.pyc").exists()

    many = {f"third/m{i}.py": f"X = {i}\n" for i in range(COMPILE_MANY)}
    fake_distribution(site, "third", many, list(many))

    def second_run_fails() -> None:
        with install_env.Compiler() as compiler:
            compiler.add({str(site / "third-1.0.dist-info")})
            raise RuntimeError("uv's second run failed")

    with pytest.raises(RuntimeError, match="second run failed"):
        second_run_fails()
    assert not multiprocessing.active_children()


def test_without_a_process_pool_the_compiler_compiles_as_it_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build container without /dev/shm has no semaphores, so no process pool: each batch is
    compiled before `add` returns, counted as with the pool, and no worker is started."""

    def no_semaphores(*args: object, **kwargs: object) -> None:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(install_env.concurrent.futures, "ProcessPoolExecutor", no_semaphores)
    venv, site = empty_venv(tmp_path)
    before = install_env.dist_infos(str(venv))
    fake_distribution(site, "pkg", {"pkg/a.py": "A = 1\n", "pkg/b.py": "def (:\n"},
                      ["pkg/a.py", "pkg/b.py"])  # fmt: skip
    with install_env.Compiler() as compiler:
        compiler.add(install_env.dist_infos(str(venv)) - before)
        assert (site / "pkg" / "__pycache__" / f"a.{sys.implementation.cache_tag}.pyc").exists()
        assert not multiprocessing.active_children()
        assert compiler.finish() == (1, 1)


def test_with_an_epoch_each_source_gets_it_as_it_is_compiled_and_its_pyc_records_it(
    tmp_path: Path,
) -> None:
    """No walk of the file system before the bytecode: the step's sources get the epoch one by
    one, so each .pyc is the bytes Python reads as current after the step's last clamp; a
    source older than the step keeps its time, and its .pyc records that time."""
    venv, site = empty_venv(tmp_path)
    before = install_env.dist_infos(str(venv))
    files = {"pkg/__init__.py": "A = 1\n", "pkg/old.py": "B = 2\n", "pkg/tests/t.py": "T = 1\n"}
    since = time.time_ns() - 10**9
    fake_distribution(site, "pkg", files, list(files))
    old = since - 3600 * 10**9
    os.utime(site / "pkg" / "old.py", ns=(old, old))
    epoch = 315532800
    assert install_env.compile_bytecode(str(venv), before, (since, epoch)) == (2, 0)
    tag = sys.implementation.cache_tag
    for name, at in (("__init__", epoch), ("old", old // 10**9)):
        assert (site / "pkg" / f"{name}.py").stat().st_mtime_ns // 10**9 == at
        pyc = (site / "pkg" / "__pycache__" / f"{name}.{tag}.pyc").read_bytes()
        assert struct.unpack("<I", pyc[8:12])[0] == at
    # not compiled, so not clamped here: the step's last walk does it
    assert (site / "pkg" / "tests" / "t.py").stat().st_mtime_ns >= since


def test_a_steps_times_are_clamped_to_the_epoch_and_nothing_older_or_skipped_is_touched(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    (root / "old" / "kept").mkdir(parents=True)
    (root / "mounted").mkdir()
    old = time.time_ns() - 3600 * 10**9
    for path in (root / "old" / "kept" / "file", root / "mounted" / "secret", tmp_path / "out"):
        path.write_text("x")
    for path in (root / "old" / "kept" / "file", root / "old" / "kept", root / "old",
                 root / "mounted" / "secret", tmp_path / "out"):  # fmt: skip
        os.utime(path, ns=(old, old))
    since = time.time_ns() - 10**9
    (root / "old" / "new.py").write_text("A = 1\n")  # changes old/ itself too
    (root / "link").symlink_to(tmp_path / "out")  # a link to a file outside: not followed
    (root / "mounted" / "fresh").write_text("y")
    future = time.time_ns() + 3600 * 10**9  # not this step's: no clock makes it so
    (root / "future").write_text("z")
    os.utime(root / "future", ns=(future, future))
    epoch = 315532800
    clamped = install_env.clamp_times(str(root), since, epoch, {str(root / "mounted")})
    times = {
        path.relative_to(root).as_posix(): path.lstat().st_mtime_ns
        for path in (root, *root.rglob("*"))
    }
    at = epoch * 10**9
    assert times["old/new.py"] == times["old"] == times["link"] == times["."] == at
    assert times["old/kept"] == times["old/kept/file"] == old
    assert times["mounted/fresh"] != at
    assert times["mounted/secret"] == old
    assert times["future"] == future
    assert (tmp_path / "out").stat().st_mtime_ns == old
    assert clamped == 4
    # Compiled after the clamp, a .pyc records the epoch: the same bytes on every build.
    before = install_env.dist_infos(str(root))
    compiled = root / "old" / "__pycache__" / f"new.{sys.implementation.cache_tag}.pyc"
    install_env._compile([str(root / "old" / "new.py")])
    first = compiled.read_bytes()
    assert struct.unpack("<I", first[8:12])[0] == epoch
    compiled.unlink()
    os.environ["SOURCE_DATE_EPOCH"] = "1"  # a checked-hash .pyc only if asked for: never here
    try:
        install_env._compile([str(root / "old" / "new.py")])
    finally:
        del os.environ["SOURCE_DATE_EPOCH"]
    assert compiled.read_bytes() == first
    assert install_env.dist_infos(str(root)) == before


def test_uvs_record_of_a_local_wheels_time_is_the_epoch_and_its_record_says_so(
    tmp_path: Path,
) -> None:
    venv, site = empty_venv(tmp_path)
    before = install_env.dist_infos(str(venv))
    info = fake_distribution(site, "torch", {"torch/__init__.py": "A = 1\n"}, ["torch/__init__.py"])
    stamp = (
        '{"timestamp":{"secs_since_epoch":1796283921,"nanos_since_epoch":593707472},"commit":null}'
    )
    (info / "uv_cache.json").write_text(stamp)
    with (info / "RECORD").open("a", newline="") as handle:
        csv.writer(handle, lineterminator="\n").writerow(
            ["torch-1.0.dist-info/uv_cache.json", "sha256=old", str(len(stamp))]
        )
    assert install_env.stamp_uv_cache_info(str(venv), before, 315532800) == 1
    data = (info / "uv_cache.json").read_bytes()
    assert (
        data == b'{"timestamp":{"secs_since_epoch":315532800,"nanos_since_epoch":0},"commit":null}'
    )
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    rows = list(csv.reader((info / "RECORD").open(newline="")))
    assert rows[-1] == ["torch-1.0.dist-info/uv_cache.json", f"sha256={digest}", str(len(data))]
    assert rows[0][0] == "torch/__init__.py"
    # What an earlier step installed is not this step's to stamp.
    assert install_env.stamp_uv_cache_info(str(venv), install_env.dist_infos(str(venv)), 1) == 0


@pytest.mark.parametrize(
    "content",
    [b"not json", b"\xff\xfe\x00", b"[1, 2]", b'{"timestamp": 5}', b'{"commit": null}', b"",
     b'{"timestamp": ' * 10_000, None],
    ids=["text", "bad-encoding", "list", "timestamp-number", "no-timestamp", "empty", "nested",
         "a-folder"],
)  # fmt: skip
def test_a_uv_cache_json_of_another_shape_is_left_as_it_is(
    tmp_path: Path, content: bytes | None
) -> None:
    venv, site = empty_venv(tmp_path)
    before = install_env.dist_infos(str(venv))
    info = fake_distribution(site, "pkg", {"pkg/__init__.py": ""}, ["pkg/__init__.py"])
    cached = info / "uv_cache.json"
    if content is None:
        cached.mkdir()
    else:
        cached.write_bytes(content)
    record = (info / "RECORD").read_bytes()
    assert install_env.stamp_uv_cache_info(str(venv), before, 315532800) == 0
    assert content is None or cached.read_bytes() == content
    assert (info / "RECORD").read_bytes() == record


def test_a_step_starts_when_its_containers_first_process_did(tmp_path: Path) -> None:
    started = install_env.step_started()
    boot = next(
        int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
        if line.startswith("btime ")
    )  # fmt: skip
    assert (boot - 1) * 10**9 <= started <= time.time_ns()
    assert "/proc" in install_env.mount_points()
    assert "/" not in install_env.mount_points()


@pytest.mark.parametrize("epoch", ["", "-1", "1e9", "x"])
def test_an_epoch_that_is_not_whole_seconds_is_refused(epoch: str) -> None:
    assert install_env.main(["--epoch", epoch, "/opt/venv", "/tmp/envbuild.lock"]) == 2


@pytest.mark.parametrize("epoch", ["315532800", "0"])
def test_an_epoch_is_refused_anywhere_but_a_build_steps_installer(
    tmp_path: Path, epoch: str
) -> None:
    """--epoch walks "/" and dates what changed since PID 1 started: run from anywhere but the
    path the Dockerfile copies it to, the installer refuses it in one line, before any fetch or
    walk (a file made just now keeps its time), with the server unreachable and reachable."""
    assert f"/{render.INSTALLER_NAME}" == install_env.STEP_PATH
    golden = Path(__file__).parent / "golden" / "tensorflow-2.20.0-cpu.Dockerfile"
    assert f" python3 {install_env.STEP_PATH} --epoch " in golden.read_text()
    fresh = tmp_path / "fresh"
    fresh.write_text("x")
    made = fresh.stat().st_mtime_ns
    lock = tmp_path / "envbuild.lock"
    lock.write_text("# envbuild lock\n")
    served = ServedInputs(
        ca_bundle=None, wheels=(), index_url=None, extra_index_urls=(), offline=True
    )
    with serve(LOOPBACK, build_files(served, Path(uv_binary()))) as base:
        # The unreachable one first: an installer without the refusal fails there, on the
        # fetch, before it would walk this machine's files with the reachable one.
        for server in ("http://127.0.0.1:9/", base):
            result = run_installer(server, "--epoch", epoch, str(tmp_path / "venv"), str(lock))
            assert result.returncode == 2
            assert result.stderr.splitlines() == [
                "envbuild install: --epoch dates every file changed since PID 1 started, across "
                f"the whole file system; it runs only as a build step's {install_env.STEP_PATH}, "
                f"not as {Path(install_env.__file__).absolute()}"
            ]
    assert fresh.stat().st_mtime_ns == made
    assert not (tmp_path / "venv").exists()


def lock_block(name: str, version: str, *, hashes: int, via: str, extras: str = "") -> str:
    """One pin of a `uv pip compile --generate-hashes` lock: its hash lines, a `# via` note."""
    lines = [f"{name}{extras}=={version}"]
    lines += [
        f"--hash=sha256:{hashlib.sha256(f'{name}{i}'.encode()).hexdigest()}" for i in range(hashes)
    ]
    return " \\\n    ".join(lines) + f"\n    # via {via}\n"


SPELLINGS = [
    "nvidia-cublas-cu12",
    "nvidia_cudnn_cu12",
    "NVIDIA.Nccl-CU12",
    "Nvidia-cuda-nvrtc-cu13",
]
OTHERS = ["torch", "triton", "nvidiafake", "jax-cuda12-plugin", "my-nvidia-tools"]


@pytest.mark.parametrize("seed", range(12))
def test_an_only_step_takes_exactly_the_pins_of_that_name_with_their_hashes(
    tmp_path: Path, seed: int
) -> None:
    """Generated locks: any spelling of an nvidia-* name, one or several hash lines, extras,
    `# via nvidia-...` notes under other pins, other names that merely contain "nvidia"."""
    chooser = random.Random(seed)
    names = chooser.sample(SPELLINGS, chooser.randint(1, len(SPELLINGS)))
    names += chooser.sample(OTHERS, chooser.randint(0, len(OTHERS)))
    chooser.shuffle(names)
    blocks = {
        name: lock_block(
            name, f"{chooser.randint(1, 12)}.{chooser.randint(0, 9)}", hashes=chooser.randint(1, 3),
            via=chooser.choice(["torch", "nvidia-cudnn-cu12", "-r requirements.in"]),
            extras=chooser.choice(["", "[cuda]"]) if name in OTHERS else "",
        )
        for name in names
    }  # fmt: skip
    lock = tmp_path / "envbuild.lock"
    lock.write_text("# envbuild lock\n# inputs: sha256:00\n" + "".join(blocks.values()))
    part = Path(install_env.lock_part(str(lock), "nvidia-*", str(tmp_path)))
    expected = [block.split("    # via")[0] for name, block in blocks.items() if name in SPELLINGS]
    assert part.read_text() == "".join(expected)
    assert part.parent == tmp_path


def test_the_installer_without_its_server_says_how_to_build(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, install_env.__file__, str(tmp_path / "v"), str(tmp_path / "l")],
        env={k: v for k, v in os.environ.items() if k != "ENVBUILD_SERVE"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "build with `envbuild build`" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_build_that_goes_away_mid_download_prints_no_traceback(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """The engine dying mid-install drops the connection; the user sees envbuild's one line,
    never the server thread's traceback."""
    big = tmp_path / "uv"
    big.write_bytes(b"\0" * (32 * 1024 * 1024))
    with serve(LOOPBACK, build_files(make_inputs(tmp_path), big)) as base:
        parts = urllib.parse.urlsplit(base)
        with socket.create_connection((parts.hostname, parts.port), timeout=10) as client:
            client.sendall(f"GET {parts.path}uv HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            assert client.recv(1024).startswith(b"HTTP/1.1 200")
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        time.sleep(0.5)  # the server thread meets the reset while still sending
    captured = capfd.readouterr()
    assert "Traceback" not in captured.err
    assert "Error" not in captured.err


def test_with_buildkit_the_installer_reads_its_mounts_and_keeps_uvs_cache(
    tmp_path: Path, inputs: ServedInputs
) -> None:
    """--mounted ROOT: config.json and ca.crt as BuildKit's secret mounts put them, uv and the
    wheelhouse as the bound context folder, uv's cache as the cache mount; nothing fetched."""
    record = tmp_path / "record.json"
    root = tmp_path / "run-envbuild"
    secrets_dir, mounted = root / install_env.SECRETS_DIR, root / install_env.INPUTS_DIR
    for folder in (secrets_dir, mounted / "wheels", root / install_env.CACHE_DIR):
        folder.mkdir(parents=True)
    (secrets_dir / install_env.CONFIG_NAME).write_bytes(config_document(inputs))
    (secrets_dir / install_env.CA_NAME).write_bytes(CA)
    uv = mounted / install_env.UV_NAME
    uv.write_text(FAKE_UV.format(python=sys.executable, record=str(record), code=0))
    uv.chmod(0o755)
    (mounted / "wheels" / WHEEL).write_bytes(b"torch wheel bytes")
    scratch_root = tmp_path / "scratch"
    scratch_root.mkdir()
    venv, lock = tmp_path / "venv", tmp_path / "envbuild.lock"
    lock.write_text("torch==2.13.0+cpu \\\n    --hash=sha256:00\n")
    result = subprocess.run(
        [sys.executable, install_env.__file__, "--mounted", str(root), str(venv), str(lock)],
        env={**os.environ, "TMPDIR": str(scratch_root)},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (seen,) = (json.loads(line) for line in record.read_text().splitlines())
    argv = seen["argv"]
    assert argv[argv.index("--cache-dir") + 1] == str(root / install_env.CACHE_DIR)
    assert "--no-cache" not in argv
    assert seen["env"]["UV_LINK_MODE"] == "copy"  # the cache mount is another file system
    assert argv[argv.index("--find-links") + 1] == str(mounted / "wheels")
    assert seen["env"]["SSL_CERT_FILE"] == str(secrets_dir / install_env.CA_NAME)
    assert seen["env"]["UV_INDEX_URL"] == inputs.index_url
    assert list(scratch_root.iterdir()) == []
    assert "envbuild install: inputs" in result.stderr


def test_with_buildkit_a_missing_secret_is_one_line_saying_to_build_with_envbuild(
    tmp_path: Path,
) -> None:
    result = subprocess.run(
        [sys.executable, install_env.__file__, "--mounted", str(tmp_path), "/opt/v", "/l"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert "the build's secret was not mounted" in line
    assert "build with `envbuild build`" in line


# --- kept_context: one path per entry, so that BuildKit keeps one copy of its context -----------


def test_a_buildkit_context_lies_at_the_same_path_each_build_and_is_gone_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    seen = []
    for _ in range(2):
        with build_server.kept_context("torch2.13.0-cpu", tmp_path / "scratch") as folder:
            assert list(folder.iterdir()) == []
            (folder / "Dockerfile").write_text("FROM scratch\n")
            seen.append(folder)
        assert not folder.exists()
    assert seen[0] == seen[1]
    assert seen[0].parent == tmp_path / "cache" / "envbuild" / "contexts"
    with build_server.kept_context("jax0.10.2-cpu", tmp_path / "scratch") as other:
        assert other != seen[0]


def test_a_second_run_building_the_same_entry_takes_a_scratch_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with build_server.kept_context("e", tmp_path / "a") as first:
        (first / "kept").write_text("mine")
        with build_server.kept_context("e", tmp_path / "b") as second:
            assert second == tmp_path / "b" / "context"
        assert (first / "kept").read_text() == "mine"


def test_what_an_interrupted_build_left_or_a_planted_link_is_cleared_never_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with build_server.kept_context("e", tmp_path / "s") as folder:
        pass
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "precious").write_text("keep")
    folder.parent.mkdir(parents=True, exist_ok=True)
    folder.symlink_to(victim)
    with build_server.kept_context("e", tmp_path / "s") as again:
        assert again == folder
        assert not again.is_symlink()
        assert list(again.iterdir()) == []
    assert (victim / "precious").read_text() == "keep"
    (folder / "left").mkdir(parents=True)
    with build_server.kept_context("e", tmp_path / "s") as again:
        assert list(again.iterdir()) == []


def test_an_unwritable_cache_gives_a_scratch_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    with build_server.kept_context("e", tmp_path / "s") as folder:
        assert folder == tmp_path / "s" / "context"
        assert folder.is_dir()


def test_the_team_step_fetches_no_wheel_of_what_the_venv_holds_already(tmp_path: Path) -> None:
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    for info in ("torch-2.4.1+CPU.dist-info", "typing_extensions-4.16.0.dist-info"):
        (site / info).mkdir(parents=True)
    (site / "torch").mkdir()
    assert install_env.installed(str(tmp_path / "venv")) == {
        ("torch", "2.4.1+cpu"),
        ("typing-extensions", "4.16.0"),
    }
    assert install_env.installed(str(tmp_path / "none")) == set()
