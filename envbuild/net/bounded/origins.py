"""Origins and where credentials may go; text from servers made safe for one terminal line."""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

import requests

_DEFAULT_PORTS = {"http": 80, "https": 443}
# C0 and C1 controls (ESC starts every ANSI sequence), line/paragraph separators and the
# bidirectional overrides that make text display in another order than it reads.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, localhost and [::1] (with or without a port)."""
    if host.startswith("["):
        name = host[1 : host.find("]")] if "]" in host else host[1:]
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def origin(url: str) -> tuple[str, str, int] | None:
    """(scheme, host, port) of an http(s) URL, ports filled in; None for anything else."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    return scheme, parts.hostname.lower(), port or _DEFAULT_PORTS[scheme]


def same_origin(url: str, other: str) -> bool:
    """True when both are http(s) URLs with the same scheme, host and port."""
    mine = origin(url)
    return mine is not None and mine == origin(other)


def safe_for_credentials(url: str) -> bool:
    """https, or plain http to a loopback host: where a secret may travel (as Docker allows)."""
    parts = origin(url)
    if parts is None or "@" in urlsplit(url).netloc:
        return False
    scheme, host, _ = parts
    return scheme == "https" or is_loopback(host)


def is_downgrade(source: str, target: str) -> bool:
    """True when following source -> target would leave https for plain http off loopback."""
    before, after = origin(source), origin(target)
    return (
        before is not None
        and after is not None
        and before[0] == "https"
        and after[0] == "http"
        and not is_loopback(after[1])
    )


def next_link(response: requests.Response) -> str | None:
    """The target of a `Link: <...>; rel="next"` header, if any."""
    header = response.headers.get("Link")
    if not header:
        return None
    try:
        links: list[dict[str, Any]] = requests.utils.parse_header_links(header)
    except (ValueError, IndexError):
        return None
    for link in links:
        if "next" in str(link.get("rel", "")).split() and link.get("url"):
            return str(link["url"])
    return None


# -- text from servers ------------------------------------------------------------------


def printable(text: object, limit: int = 200) -> str:
    """`text` safe to print on one terminal line: controls and ANSI escapes shown escaped,
    bidi overrides neutralised, and cut to about `limit` characters."""
    escaped = _UNPRINTABLE.sub(_escape, str(text))
    if len(escaped) > limit:
        return escaped[:limit] + "..."
    return escaped


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    return _ESCAPES.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    )


def origin_text(url: str) -> str:
    """scheme://host:port of a URL from a server, safe to print (no path, query or userinfo)."""
    parts = origin(url)
    if parts is None:
        return printable(url.split("?", 1)[0], 80)
    scheme, host, port = parts
    return printable(f"{scheme}://{host}:{port}", 120)


def for_log(url: str) -> str:
    """A URL for a log line: no query (upload URLs carry state tokens there), no controls."""
    return printable(url.split("?", 1)[0], 200)
