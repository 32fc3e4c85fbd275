"""Origins, which hosts are this machine, and where credentials may go."""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

import requests

_DEFAULT_PORTS = {"http": 80, "https": 443}
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain")


def is_loopback(host: str) -> bool:
    """True for a host on this machine: a localhost name (localhost, localhost.localdomain and,
    as RFC 6761 reserves them, *.localhost) or a loopback address (127.0.0.0/8, ::1). `host` as
    a URL or an image reference writes it: any case, with or without a port, IPv6 in brackets."""
    if host.startswith("["):
        name = host[1 : host.find("]")] if "]" in host else host[1:]
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    name = name.lower().rstrip(".")
    if name in _LOOPBACK_NAMES or name.endswith(".localhost"):
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
