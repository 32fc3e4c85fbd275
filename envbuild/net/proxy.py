"""Which HTTP(S) proxy envbuild and its builds use, and which hosts bypass it.

Precedence, highest first (the first level that names a proxy URL wins; NO_PROXY comes from the
environment, else from Docker's config):

1. `--proxy URL`: one URL for http and https;
2. the environment: `https_proxy`/`HTTPS_PROXY`, `http_proxy`/`HTTP_PROXY`, `no_proxy`/`NO_PROXY`;
   the lowercase form wins when both are set, as in curl and Python's urllib; an empty value
   counts as unset;
3. Docker's client config, `proxies.default` {httpProxy, httpsProxy, noProxy} in
   `$DOCKER_CONFIG/config.json` or `~/.docker/config.json`.

Proxy URLs may hold a password; every one is registered with envbuild.core.redact before it is
checked, and no message shows it. Builds reach envbuild's build server and the registry client a
loopback registry directly, whatever NO_PROXY says.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from envbuild.core.errors import BadInput
from envbuild.core.models import ProxySettings
from envbuild.core.names import redact_url, shown
from envbuild.core.redact import register, register_credentials
from envbuild.net.bounded.origins import is_loopback
from envbuild.net.docker_config import docker_config_path, read_docker_config

if TYPE_CHECKING:
    import requests

MAX_URL_CHARS = 2048
MAX_NO_PROXY_CHARS = 65536
URL_EXAMPLE = "http://[user:password@]proxy.example.com:3128 (percent-encode the password)"
# Not allowed unencoded anywhere in a URL (RFC 3986); JSON would escape '"' and '\', and the
# escaped form, URL-encoded in docker-py's build request, would be one the redactor misses.
_UNSAFE = frozenset('"<>\\^`{|}')

_chosen: ContextVar[ProxySettings | None] = ContextVar("envbuild_proxy", default=None)


def _register(url: str) -> None:
    """Register the password in a proxy URL (as given and decoded) and its Basic header."""
    try:
        parts = urlsplit(url)
        user, password = parts.username, parts.password
    except ValueError:
        user, password = None, None
    if password is None and "@" in url:
        # Not a URL urlsplit understands: still never show what looks like user-info.
        userinfo = url.split("://", 1)[-1].rsplit("@", 1)[0]
        user, _, password = userinfo.partition(":")
    if password:
        register(password)
        register_credentials(unquote(user or ""), unquote(password))


def url_problem(url: str) -> str | None:
    """What makes `url` no proxy URL: http or https, a host, an optional port and user-info."""
    if not url:
        return "is empty"
    if len(url) > MAX_URL_CHARS:
        return f"is longer than {MAX_URL_CHARS} characters"
    if not url.isascii() or not url.isprintable() or any(ch.isspace() for ch in url):
        return (
            "holds whitespace, control or non-ASCII characters; percent-encode them "
            "(an internationalised host name in its xn-- form)"
        )
    if any(ch in _UNSAFE for ch in url):
        return 'holds a character a URL must percent-encode (one of " < > \\ ^ ` { | })'
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is no number 0-65535)
    except ValueError:
        return "is not a URL (a port that is no number, or an unencoded '/', '?' or '#')"
    if parts.scheme.lower() not in ("http", "https"):
        return "is not an http:// or https:// URL"
    if not parts.hostname:
        return "names no host"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "has a path, query or fragment; a proxy URL is scheme, host and port only"
    return None


def check_url(url: str, where: str) -> str:
    """`url` if it is a proxy URL, else BadInput naming `where` (never showing a password)."""
    _register(url)
    problem = url_problem(url)
    if problem is not None:
        msg = f"{where} {shown(redact_url(url))}: {problem}; give {URL_EXAMPLE}"
        raise BadInput(msg)
    return url


def parse_no_proxy(text: str, where: str) -> tuple[str, ...]:
    """NO_PROXY's entries (comma or whitespace separated), lowercased; BadInput for a bad one."""
    if len(text) > MAX_NO_PROXY_CHARS:
        msg = f"{where} is longer than {MAX_NO_PROXY_CHARS} characters; list fewer hosts"
        raise BadInput(msg)
    entries = []
    for raw in text.replace(",", " ").split():
        entry = raw.lower()
        if not entry.isascii() or not entry.isprintable() or len(entry) > 300:
            msg = (
                f"{where}: {shown(raw)} is not a host, .domain, IP, CIDR, host:port or '*'; "
                "write internationalised names in their xn-- form"
            )
            raise BadInput(msg)
        entries.append(entry)
    return tuple(dict.fromkeys(entries))


def _split_port(entry: str) -> tuple[str, int | None]:
    """`host:port`, `[v6]:port`, or an entry without a port."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
        return host, int(port) if port.isdigit() else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        if port.isdigit():
            return host, int(port)
    return entry, None


def bypasses(no_proxy: tuple[str, ...], host: str, port: int | None = None) -> bool:
    """True when NO_PROXY sends a request to host[:port] direct.

    Matching as curl does: `*` matches every host; `corp`, `.corp` and `*.corp` match corp and
    every host under it (on a dot boundary: not evilcorp); an IP or CIDR matches addresses in
    it; an entry with `:port` matches that port only."""
    host = host.lower().strip("[]").rstrip(".")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = None
    for entry in no_proxy:
        if entry == "*":
            return True
        name, entry_port = _split_port(entry)
        if entry_port is not None and entry_port != port:
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(name, strict=False):
                    return True
            except ValueError:
                pass
            continue
        domain = name.lstrip("*").lstrip(".").rstrip(".")
        if domain and (host == domain or host.endswith("." + domain)):
            return True
    return False


def _docker_proxies(path: Path | None) -> dict[str, str]:
    """`proxies.default` of Docker's config at `path` ({} when there is none), checked."""
    if path is None:
        return {}
    fix = 'fix it (proxies.default is {"httpsProxy": "http://proxy:3128", ...}) or remove it'
    document = read_docker_config(path, fix=fix)
    if document is None:
        return {}
    proxies = document.get("proxies", {})
    default = proxies.get("default", {}) if isinstance(proxies, dict) else None
    if not isinstance(default, dict):
        msg = f"Docker's config {path}: proxies is not an object holding a 'default' object; {fix}"
        raise BadInput(msg)
    found = {}
    for key in ("httpProxy", "httpsProxy", "noProxy"):
        value = default.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            msg = f"Docker's config {path}: proxies.default.{key} is not a string; {fix}"
            raise BadInput(msg)
        found[key] = value
    return found


def _environment_value(environ: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """(variable, value) of the lowercase form, else the uppercase; empty counts as unset."""
    for variable in (name.lower(), name.upper()):
        value = environ.get(variable)
        if value:
            return variable, value
    return None


def proxy_settings(
    option: str | None, environ: Mapping[str, str], docker_config: Path | None
) -> ProxySettings:
    """The proxy to use: --proxy, else the environment, else Docker's config (see the module)."""
    config = _docker_proxies(docker_config)
    where = f"Docker's config {docker_config}: proxies.default"
    no_proxy: tuple[str, ...] = ()
    found_no = _environment_value(environ, "no_proxy")
    if found_no is not None:
        no_proxy = parse_no_proxy(found_no[1], found_no[0])
    elif "noProxy" in config:
        no_proxy = parse_no_proxy(config["noProxy"], f"{where}.noProxy")
    if option is not None:
        url = check_url(option, "--proxy")
        return ProxySettings(http=url, https=url, no_proxy=no_proxy)
    found_http = _environment_value(environ, "http_proxy")
    found_https = _environment_value(environ, "https_proxy")
    if found_http is not None or found_https is not None:
        return ProxySettings(
            http=None if found_http is None else check_url(found_http[1], found_http[0]),
            https=None if found_https is None else check_url(found_https[1], found_https[0]),
            no_proxy=no_proxy,
        )
    http, https = config.get("httpProxy"), config.get("httpsProxy")
    return ProxySettings(
        http=None if http is None else check_url(http, f"{where}.httpProxy"),
        https=None if https is None else check_url(https, f"{where}.httpsProxy"),
        no_proxy=no_proxy,
    )


def settings_from_environment(option: str | None = None) -> ProxySettings:
    """`proxy_settings` over this process's environment and Docker's config."""
    return proxy_settings(option, os.environ, docker_config_path(os.environ))


@contextlib.contextmanager
def chosen(settings: ProxySettings) -> Iterator[ProxySettings]:
    """Within the block, `current()` is `settings` (the CLI's choice, --proxy included)."""
    token = _chosen.set(settings)
    try:
        yield settings
    finally:
        _chosen.reset(token)


def selected() -> ProxySettings | None:
    """The settings `chosen` set, or None outside such a block."""
    return _chosen.get()


def current() -> ProxySettings:
    """The settings `chosen` set, else those of the environment and Docker's config."""
    settings = _chosen.get()
    return settings if settings is not None else settings_from_environment()


def with_direct(settings: ProxySettings, *hosts: str) -> ProxySettings:
    """`settings` with `hosts` added to NO_PROXY (unchanged when there is no proxy)."""
    if settings.empty:
        return settings
    extra = tuple(h for h in hosts if h not in settings.no_proxy)
    return ProxySettings(
        http=settings.http, https=settings.https, no_proxy=(*settings.no_proxy, *extra)
    )


def loopback_direct(settings: ProxySettings, host: str) -> ProxySettings:
    """`settings` with `host` (host[:port], as a registry is named) direct if it is loopback:
    a proxy elsewhere would reach its own loopback, not this machine's."""
    try:
        name = urlsplit(f"//{host}").hostname or ""
    except ValueError:
        return settings
    return with_direct(settings, name) if is_loopback(name) else settings


def requests_proxies(settings: ProxySettings, url: str) -> dict[str, str | None]:
    """requests' `proxies` for one request to `url`. Every scheme is named (None: direct), so
    that requests' own reading of the environment cannot add or override one."""
    direct: dict[str, str | None] = {"http": None, "https": None, "all": None}
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:
        return direct
    if settings.empty or bypasses(settings.no_proxy, host, port):
        return direct
    return {**direct, "http": settings.http, "https": settings.https}


def route_session(session: requests.Session, settings: ProxySettings) -> None:
    """Send each request of a requests session through `settings`' proxy, or direct for the
    hosts NO_PROXY names; nothing changes when there is no proxy.

    requests lets its reading of the environment override a session's `proxies` and ignores
    their no_proxy, so the choice is made per request, as an explicit `proxies` argument."""
    if settings.empty:
        return
    send = session.request

    def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("proxies", requests_proxies(settings, url))
        return send(method, url, *args, **kwargs)

    session.request = request  # type: ignore[method-assign,assignment]
