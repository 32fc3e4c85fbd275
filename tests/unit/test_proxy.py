"""The proxy: precedence, NO_PROXY matching, hostile values, and every path that uses it.

Only the engine is a double (tests/support/engine_double.py); settings, sessions, uv's environment and
the command line are the real code.
"""

from __future__ import annotations

import base64
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import requests.adapters
from click.testing import CliRunner

from envbuild.build.entry import build_entry, prepare
from envbuild.cli.main import main
from envbuild.core.errors import BadInput
from envbuild.core.models import BuildOptions, Knowledge, Lock, ProxySettings, Selection
from envbuild.core.redact import redact
from envbuild.core.store import ResultStore
from envbuild.lock.uv import _uv_environment
from envbuild.net import proxy
from envbuild.net.docker_config import MAX_CONFIG_BYTES
from envbuild.plan.matrix import make_plan
from envbuild.plan.matrix_file import default_matrix_path, load_matrix
from envbuild.registry import RegistryClient
from tests.support.engine_double import InMemoryEngine

SECRET = "Pr0xy-pa55word"
URL = f"http://user:{SECRET}@proxy.corp:3128"
PROXY_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "all_proxy")


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No proxy of this machine's and no Docker config of the user's reach these tests."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))


def docker_config(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


# -- precedence ------------------------------------------------------------------------------

LEVELS = ("option", "lower", "upper", "docker")


def combinations() -> Iterator[tuple[bool, ...]]:
    yield from itertools.product((False, True), repeat=len(LEVELS))


@pytest.mark.parametrize("given", list(combinations()))
def test_the_highest_level_given_wins(tmp_path: Path, given: tuple[bool, ...]) -> None:
    present = dict(zip(LEVELS, given, strict=True))
    urls = {level: f"http://{level}.example:3128" for level in LEVELS}
    environ: dict[str, str] = {}
    if present["lower"]:
        environ |= {"https_proxy": urls["lower"], "http_proxy": urls["lower"]}
    if present["upper"]:
        environ |= {"HTTPS_PROXY": urls["upper"], "HTTP_PROXY": urls["upper"]}
    config = {"httpProxy": urls["docker"], "httpsProxy": urls["docker"]}
    path = docker_config(tmp_path, {"proxies": {"default": config}} if present["docker"] else {})

    settings = proxy.proxy_settings(urls["option"] if present["option"] else None, environ, path)

    winner = next((level for level in LEVELS if present[level]), None)
    expected = None if winner is None else urls[winner]
    assert (settings.http, settings.https) == (expected, expected)
    assert settings.empty == (winner is None)


@pytest.mark.parametrize(
    ("environ", "config", "expected"),
    [
        ({"no_proxy": "a.corp", "NO_PROXY": "b.corp"}, "c.corp", ("a.corp",)),
        ({"NO_PROXY": "b.corp"}, "c.corp", ("b.corp",)),
        ({}, "c.corp, D.corp", ("c.corp", "d.corp")),
        ({"no_proxy": ""}, "c.corp", ("c.corp",)),  # empty counts as unset, as for curl
    ],
)
def test_no_proxy_comes_from_the_environment_else_dockers_config(
    tmp_path: Path, environ: dict[str, str], config: str, expected: tuple[str, ...]
) -> None:
    path = docker_config(tmp_path, {"proxies": {"default": {"noProxy": config}}})
    settings = proxy.proxy_settings(URL, environ, path)
    assert settings.no_proxy == expected
    assert (settings.http, settings.https) == (URL, URL)


def test_http_and_https_are_separate_in_the_environment(tmp_path: Path) -> None:
    settings = proxy.proxy_settings(None, {"HTTPS_PROXY": URL}, tmp_path / "none.json")
    assert (settings.http, settings.https) == (None, URL)
    session = requests.Session()
    proxy.route_session(session, settings)
    assert sent_through(session, "https://pypi.org/simple") == {"https": URL}


def test_the_settings_never_show_the_password() -> None:
    settings = ProxySettings(http=URL, https=URL, no_proxy=("a.corp",))
    assert SECRET not in repr(settings)
    assert SECRET not in repr(BuildOptions(proxy=settings))


# -- NO_PROXY ----------------------------------------------------------------------------------

BYPASS_TABLE = [
    # (NO_PROXY entries, host, port, direct?)
    ((), "pypi.org", 443, False),
    ((), "localhost", 5000, False),  # NO_PROXY alone: loopback is the caller's choice
    (("localhost",), "LOCALHOST", 5000, True),
    (("127.0.0.0/8",), "127.9.9.9", None, True),
    (("::1",), "::1", 5000, True),
    (("::1",), "[::1]", 5000, True),
    (("*",), "anything.example", 443, True),
    (("corp",), "corp", 443, True),
    (("corp",), "pypi.corp", 443, True),
    (("corp",), "evilcorp", 443, False),  # on a dot boundary only
    ((".corp",), "pypi.corp", 443, True),
    ((".corp",), "corp", 443, True),
    (("*.corp",), "a.b.corp", 443, True),
    (("pypi.corp",), "PyPI.Corp.", 443, True),
    (("pypi.corp",), "other.corp", 443, False),
    (("pypi.corp:8443",), "pypi.corp", 8443, True),
    (("pypi.corp:8443",), "pypi.corp", 443, False),
    (("10.0.0.0/8",), "10.1.2.3", None, True),
    (("10.0.0.0/8",), "11.1.2.3", None, False),
    (("172.17.0.1",), "172.17.0.1", 34567, True),
    (("172.17.0.1",), "172.17.0.2", 34567, False),
    (("fd00::/8",), "fd00::1", None, True),
    (("[fd00::1]:5000",), "fd00::1", 5000, True),
    (("[fd00::1]:5000",), "fd00::1", 5001, False),
    (("10.0.0.0/8",), "ten.example", 443, False),
]


@pytest.mark.parametrize(("entries", "host", "port", "direct"), BYPASS_TABLE)
def test_no_proxy_matching(
    entries: tuple[str, ...], host: str, port: int | None, direct: bool
) -> None:
    assert proxy.bypasses(entries, host, port) is direct


def test_no_proxy_text_is_split_on_commas_and_spaces() -> None:
    parsed = proxy.parse_no_proxy(" a.corp,B.corp  10.0.0.0/8,,a.corp ", "NO_PROXY")
    assert parsed == ("a.corp", "b.corp", "10.0.0.0/8")


# -- hostile values ----------------------------------------------------------------------------


def hostile_urls() -> Iterator[str]:
    """Proxy URLs that must be refused, each holding the password where it can."""
    for brk in ("\n", "\r", "\x00", "\u2028", " ", "\t"):
        yield f"http://user:{SECRET}@proxy.corp:3128{brk}RUN touch /pwned"
    yield from (
        "",
        "proxy.corp:3128",  # no scheme
        f"user:{SECRET}@proxy.corp:3128",
        f"ftp://user:{SECRET}@proxy.corp:21",
        f"socks5://user:{SECRET}@proxy.corp:1080",
        "http://",
        f"http://user:{SECRET}@",
        f"http://user:{SECRET}@pr\u00f6xy.corp:3128",  # unicode host
        f"http://user:{SECRET}@proxy.corp:99999",
        f"http://user:{SECRET}@proxy.corp:port",
        f"http://user:{SECRET}@proxy.corp:3128/path",
        f"http://user:{SECRET}@proxy.corp:3128/?q=1",
        f"http://user:{SECRET}/x@proxy.corp:3128",  # an unencoded '/' in the password
        f'http://user:{SECRET}"@proxy.corp:3128',  # JSON would escape it: must be encoded
        f"http://user:{SECRET}\\@proxy.corp:3128",
        f"http://user:{SECRET}@" + "a" * 10_240 + ".corp:3128",  # 10 KB
    )


@pytest.mark.parametrize("url", list(hostile_urls()))
@pytest.mark.parametrize("where", ["--proxy", "HTTPS_PROXY", "https_proxy", "docker"])
def test_a_hostile_proxy_url_is_one_line_naming_it_without_the_password(
    tmp_path: Path, url: str, where: str
) -> None:
    option = url if where == "--proxy" else None
    environ = {where: url} if where not in ("--proxy", "docker") else {}
    path = docker_config(tmp_path, {"proxies": {"default": {"httpsProxy": url}}})
    if where != "docker":
        path = tmp_path / "absent.json"
    if url == "" and where != "--proxy":  # an empty variable or key counts as unset
        assert proxy.proxy_settings(option, environ, path).empty
        return
    with pytest.raises(BadInput) as raised:
        proxy.proxy_settings(option, environ, path)
    message = raised.value.message
    named = f"{path}: proxies.default.httpsProxy" if where == "docker" else where
    assert message.startswith(f"{named} ") or message.startswith(f"Docker's config {path}")
    assert len(message.splitlines()) == 1
    assert SECRET not in message
    assert raised.value.exit_code == 2


def broken_configs() -> Iterator[tuple[str, bytes]]:
    yield "not JSON", b'{"proxies": {"default": {"httpsProxy": "' + URL.encode() + b'"'
    yield "not UTF-8", b"\xff\xfe{}"
    yield "a list", b"[]"
    yield "proxies a list", json.dumps({"proxies": [URL]}).encode()
    yield "default a list", json.dumps({"proxies": {"default": [URL]}}).encode()
    yield "httpProxy a number", json.dumps({"proxies": {"default": {"httpProxy": 3128}}}).encode()
    yield "noProxy a list", json.dumps({"proxies": {"default": {"noProxy": ["a"]}}}).encode()
    yield "nested deeply", b"[" * 100_000 + b"]" * 100_000
    yield "over 1 MiB", b'{"x": "' + b"a" * (MAX_CONFIG_BYTES + 1) + b'"}'


@pytest.mark.parametrize(("kind", "content"), list(broken_configs()), ids=lambda v: str(v)[:20])
def test_a_broken_docker_config_is_one_line_naming_the_file(
    tmp_path: Path, kind: str, content: bytes
) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(BadInput) as raised:
        proxy.proxy_settings(None, {}, path)
    message = raised.value.message
    assert str(path) in message, kind
    assert len(message.splitlines()) == 1
    assert SECRET not in message
    assert "fix" in message


def test_a_missing_docker_config_means_no_proxy(tmp_path: Path) -> None:
    assert proxy.proxy_settings(None, {}, tmp_path / "absent.json").empty


def test_a_hostile_no_proxy_entry_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(BadInput, match=r"^NO_PROXY: '\\x00"):
        proxy.proxy_settings(URL, {"NO_PROXY": "a.corp,\x00evil"}, tmp_path / "absent.json")


def test_the_proxy_password_is_registered_for_redaction(tmp_path: Path) -> None:
    proxy.proxy_settings(URL, {}, tmp_path / "absent.json")
    basic = base64.b64encode(f"user:{SECRET}".encode()).decode()
    text = f"CONNECT with {URL} Proxy-Authorization: Basic {basic}"
    assert SECRET not in redact(text)
    assert basic not in redact(text)


@pytest.mark.parametrize("url", [u for u in hostile_urls() if "\n" not in u][:8])
def test_the_command_line_refuses_a_hostile_proxy_before_any_engine_call(url: str) -> None:
    args = ["build", f"--proxy={url}", "--no-smoke", "--framework", "jax", "--cuda", "cpu"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output  # a Docker call would be an AssertionError: 1
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("envbuild: error: --proxy ")
    assert SECRET not in result.output


@pytest.mark.parametrize("command", [["build"], ["lock"], ["publish"], ["verify"],
                                     ["knowledge", "refresh"]])  # fmt: skip
def test_every_network_command_takes_proxy(command: list[str]) -> None:
    result = CliRunner().invoke(main, [*command, "--help"])
    assert result.exit_code == 0
    assert "--proxy URL" in result.output


def test_a_broken_docker_config_fails_verify_as_one_line(tmp_path: Path) -> None:
    (tmp_path / "docker-config").mkdir()
    (tmp_path / "docker-config" / "config.json").write_text('{"proxies": []}', encoding="utf-8")
    result = CliRunner().invoke(main, ["verify", "127.0.0.1:5000/x:y"])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("envbuild: error: Docker's config ")
    assert len(result.stderr.splitlines()) == 1


# -- where the proxy goes ----------------------------------------------------------------------


def test_the_build_gets_the_proxy_args_with_the_build_server_direct(
    tmp_path: Path, knowledge: Knowledge
) -> None:
    double = InMemoryEngine(gateway="172.17.0.1")
    settings = ProxySettings(http=URL, https=URL, no_proxy=("pypi.corp",))
    chosen = Selection(framework="jax", cuda="cpu")
    (entry,) = make_plan(knowledge, load_matrix(default_matrix_path(), knowledge), chosen).entries
    double.add_base(entry.base_image, python=entry.python)
    lock = Lock(
        entry_id=entry.id, text=f"{entry.install.requirement} \\\n    --hash=sha256:{'0' * 64}\n"
    )
    options = BuildOptions(proxy=settings)
    context = prepare(double, knowledge, entry, options, None, lock)

    build_entry(double, context, store=ResultStore(tmp_path / "r.sqlite3"), proxy=settings)

    (build,) = double.builds
    assert build.proxy is not None
    args = build.proxy.environment()
    assert args["HTTPS_PROXY"] == args["https_proxy"] == URL
    assert args["NO_PROXY"].split(",") == ["pypi.corp", "172.17.0.1"]
    # Not ordinary build arguments (those reach the history), and nowhere in what is hashed.
    assert all(SECRET not in value for value in build.build_args.values())
    assert SECRET not in build.dockerfile
    assert SECRET not in json.dumps(build.labels)
    assert SECRET not in context.content_hash + context.dockerfile


def test_an_offline_build_gets_no_proxy(tmp_path: Path, knowledge: Knowledge) -> None:
    double = InMemoryEngine()
    settings = ProxySettings(http=URL, https=URL)
    chosen = Selection(framework="jax", cuda="cpu")
    (entry,) = make_plan(knowledge, load_matrix(default_matrix_path(), knowledge), chosen).entries
    double.add_base(entry.base_image, python=entry.python)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / f"jax-{entry.framework_version}-py3-none-any.whl").write_bytes(b"PK")
    lock = Lock(
        entry_id=entry.id, text=f"{entry.install.requirement} \\\n    --hash=sha256:{'0' * 64}\n"
    )
    options = BuildOptions(proxy=settings, offline=True, wheelhouse=wheels)
    context = prepare(double, knowledge, entry, options, None, lock)
    build_entry(double, context, store=ResultStore(tmp_path / "r.sqlite3"), proxy=settings)
    assert double.builds[0].proxy is None


def test_uv_gets_the_chosen_proxy_over_the_environments(
    monkeypatch: pytest.MonkeyPatch, knowledge: Knowledge
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://other.example:8080")
    monkeypatch.setenv("all_proxy", "socks5://other.example:1080")
    chosen = Selection(framework="jax", cuda="cpu")
    (entry,) = make_plan(knowledge, load_matrix(default_matrix_path(), knowledge), chosen).entries
    settings = ProxySettings(http=URL, https=URL, no_proxy=("pypi.corp",))

    env = _uv_environment(entry, BuildOptions(proxy=settings))

    assert env["HTTPS_PROXY"] == env["https_proxy"] == env["HTTP_PROXY"] == URL
    assert env["NO_PROXY"] == env["no_proxy"] == "pypi.corp"
    assert "all_proxy" not in env


def test_uv_keeps_the_environment_without_a_chosen_proxy(
    monkeypatch: pytest.MonkeyPatch, knowledge: Knowledge
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", URL)
    chosen = Selection(framework="jax", cuda="cpu")
    (entry,) = make_plan(knowledge, load_matrix(default_matrix_path(), knowledge), chosen).entries
    assert _uv_environment(entry, BuildOptions())["HTTPS_PROXY"] == URL


class RecordingAdapter(requests.adapters.BaseAdapter):
    """The network boundary: records the proxies requests settled on, answers 200."""

    def __init__(self) -> None:
        super().__init__()
        self.proxies: list[dict[str, str]] = []

    def send(  # type: ignore[override]
        self, request: requests.PreparedRequest, **kwargs: Any
    ) -> requests.Response:
        self.proxies.append(dict(kwargs.get("proxies") or {}))
        response = requests.Response()
        response.status_code, response.url, response.request = 200, request.url or "", request
        response._content = b"{}"
        return response

    def close(self) -> None:
        pass


def sent_through(session: requests.Session, url: str) -> dict[str, str]:
    """The proxies one GET of `url` over `session` used ({}: direct)."""
    adapter = RecordingAdapter()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    session.get(url)
    return adapter.proxies[-1]


def test_a_routed_session_wins_over_requests_reading_of_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://other.example:8080")  # what requests would take
    settings = ProxySettings(http=URL, https=URL, no_proxy=("pypi.corp",))
    session = requests.Session()
    proxy.route_session(session, settings)
    assert sent_through(session, "https://pypi.org/pypi/torch/json") == {"http": URL, "https": URL}
    assert sent_through(session, "https://files.pypi.corp/x.whl") == {}


def test_an_unrouted_session_is_left_to_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    session = requests.Session()
    proxy.route_session(session, ProxySettings())
    assert sent_through(session, "https://pypi.org/simple/") == {}


def test_the_registry_client_uses_the_proxy_but_not_for_a_loopback_registry() -> None:
    settings = ProxySettings(http=URL, https=URL, no_proxy=("registry.internal",))
    with RegistryClient.for_host("registry.corp", proxy=settings) as client:
        assert sent_through(client.session, "https://registry.corp/v2/") == {
            "http": URL, "https": URL,
        }  # fmt: skip
    for host in ("127.0.0.1:5000", "localhost:5000", "[::1]:5000", "registry.internal"):
        with RegistryClient.for_host(host, proxy=settings) as client:
            assert sent_through(client.session, f"{client.base_url}/v2/") == {}, host
    with RegistryClient.for_host("127.0.0.1:5000", proxy=settings) as client:
        # Its token service elsewhere still goes through the proxy.
        assert sent_through(client.session, "https://auth.corp/token") == {
            "http": URL, "https": URL,
        }  # fmt: skip


def test_the_registry_client_follows_the_clis_choice() -> None:
    settings = ProxySettings(https=URL)
    with proxy.chosen(settings), RegistryClient.for_host("registry.corp") as client:
        assert sent_through(client.session, "https://registry.corp/v2/") == {"https": URL}
    with RegistryClient.for_host("registry.corp") as client:  # no proxy anywhere
        assert sent_through(client.session, "https://registry.corp/v2/") == {}


@pytest.mark.parametrize(
    ("host", "direct"),
    [("127.0.0.1:5000", True), ("localhost", True), ("[::1]:5000", True),
     ("registry.localhost", True), ("registry.corp:5000", False), ("10.0.0.1", False)],
)  # fmt: skip
def test_a_loopback_registry_goes_direct(host: str, direct: bool) -> None:
    settings = proxy.loopback_direct(ProxySettings(https=URL), host)
    name = host.rpartition(":")[0] if host.count(":") == 1 else host
    assert proxy.bypasses(settings.no_proxy, name.strip("[]").split("]")[0], 5000) is direct


def test_with_direct_adds_the_build_server_once() -> None:
    settings = ProxySettings(https=URL, no_proxy=("172.17.0.1",))
    assert proxy.with_direct(settings, "172.17.0.1").no_proxy == ("172.17.0.1",)
    assert proxy.with_direct(ProxySettings(), "172.17.0.1").empty


def test_a_dead_proxy_is_one_line_and_verbose_logs_hold_no_password(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    dead = f"http://user:{SECRET}@127.0.0.2:9"  # nothing listens on the discard port
    env = {**os.environ, "ENVBUILD_REGISTRY_TIMEOUT": "10", "DOCKER_CONFIG": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "envbuild", "-v", "verify", "--proxy", dead,
         "registry.corp.invalid/team/x:y"],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("envbuild: error:")]
    assert len(errors) == 1, done.stderr
    assert "registry.corp.invalid" in errors[0]
    # Refused by the dead proxy: without it, the .invalid name would not resolve at all.
    assert "Connection refused" in errors[0]
    assert SECRET not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("localhost", True), ("LOCALHOST:5000", True), ("localhost.", True),
     ("localhost.localdomain", True), ("registry.localhost:5000", True), ("127.0.0.1", True),
     ("127.1.2.3:8080", True), ("[::1]", True), ("[::1]:5000", True), ("::1", True),
     ("localhost.corp", False), ("notlocalhost", False), ("10.0.0.1:5000", False),
     ("[::2]:5000", False), ("registry.corp", False), ("", False), ("[", False)],
)  # fmt: skip
def test_one_loopback_rule_for_the_proxy_bypass_and_where_credentials_may_go(
    host: str, loopback: bool
) -> None:
    # The one rule both uses share: proxy bypass of a registry named host[:port], and the
    # registry client's plain-http-only-on-this-machine (origins.safe_for_credentials).
    from envbuild.net.bounded.origins import is_loopback, safe_for_credentials

    assert is_loopback(host) is loopback
    if (host.startswith("[") and host.endswith("]")) or (host.count(":") < 2 and host != "["):
        assert safe_for_credentials(f"http://{host}/token") is loopback  # as a URL holds it


def test_a_home_that_is_a_file_has_no_docker_config(tmp_path: Path) -> None:
    from envbuild.net.docker_config import docker_config_path, read_docker_config

    home = tmp_path / "home-is-a-file"
    home.write_text("not a folder")
    path = docker_config_path({"DOCKER_CONFIG": str(home)})
    assert read_docker_config(path, fix="fix it") is None
