"""Checks for the strings that name things outside envbuild: image references, repositories
and index URLs. Pure functions: each returns what is wrong (None when nothing is), and the
caller says which option or matrix key it was.

The grammar is Docker's (distribution/reference): NAME[:TAG][@DIGEST], where NAME is
[HOST[:PORT]/]COMPONENT(/COMPONENT)*, lowercase, at most 255 characters.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

PLACEHOLDER = "{framework}"
NAME_MAX = 255

# Explicit ASCII classes throughout: `\d` and `\w` would also match other scripts' digits.
_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_HOST = re.compile(
    r"(?:\[[0-9A-Fa-f:]+\]"
    r"|[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*)"
    r"(?::(?P<port>[0-9]{1,5}))?"
)
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"sha256:[a-f0-9]{64}|sha384:[a-f0-9]{96}|sha512:[a-f0-9]{128}")
_IMAGE_ID = re.compile(r"sha256:[a-f0-9]{64}")
_USER = re.compile(r"[A-Za-z0-9._~%!$&'()*+,;=-]+")
_USERINFO = re.compile(r"(://)[^/\s@]*@")
_URL_AUTHORITY = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*:)?(?P<slashes>//)?")


def shown(text: str, limit: int = 80) -> str:
    """`text` quoted for a one-line message: control characters escaped, long values cut in the
    middle (a path's file name and a value's start both stay in view)."""
    if len(text) <= limit:
        return repr(text)
    half = limit // 2
    return f"{text[:half]!r}...{text[-half:]!r} ({len(text)} characters)"


def _is_host(component: str) -> bool:
    # Docker's rule, less one case: the first of several components is a registry when it has a
    # dot or a port or is localhost. Docker also takes a capitalised one ("Team/x") for a host;
    # here that is the misspelt path it almost always is.
    return "." in component or ":" in component or component == "localhost"


def name_problem(name: str) -> str | None:
    """What makes `name` no repository name ([HOST[:PORT]/]path/components); None when valid."""
    if not name:
        return "is empty"
    if len(name) > NAME_MAX:
        return f"is {len(name)} characters long; Docker allows at most {NAME_MAX}"
    components = name.split("/")
    if len(components) > 1 and _is_host(components[0]):
        host = _HOST.fullmatch(components[0])
        if host is None:
            return f"{shown(components[0])} is not a registry host[:port]"
        port = host["port"]
        if port is not None and not 0 < int(port) <= 65535:
            return f"port {port} is not between 1 and 65535"
        components = components[1:]
    for component in components:
        if not _COMPONENT.fullmatch(component):
            return (
                f"path component {shown(component)} is not valid; use lowercase letters and "
                "digits, joined by . _ __ or -, between the / separators"
            )
    return None


def split_tag(reference: str) -> tuple[str, str | None]:
    """NAME[:TAG][@DIGEST] → (NAME, TAG); TAG is None when there is none. A registry port's
    colon (host:5000/team/x) is no tag: only a colon after the last / starts one."""
    name = reference.partition("@")[0]
    colon = name.rfind(":")
    if colon > name.rfind("/"):
        return name[:colon], name[colon + 1 :]
    return name, None


def image_reference_problem(reference: str) -> str | None:
    """What makes `reference` no image reference (NAME[:TAG][@DIGEST] or sha256:<64 hex>)."""
    if _IMAGE_ID.fullmatch(reference):
        return None
    name, at, digest = reference.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        return f"{shown(digest)} is not a digest (sha256:<64 lowercase hex>)"
    name, tag = split_tag(name)
    if tag is not None and not _TAG.fullmatch(tag):
        return (
            f"tag {shown(tag)} is not valid; use at most 128 letters, digits, _ . or -, "
            "not starting with . or -"
        )
    return name_problem(name)


def repository_problem(template: str, frameworks: Iterable[str]) -> str | None:
    """What makes `template` no repository for each framework; only `{framework}` may be used."""
    rest = template.replace(PLACEHOLDER, "")
    if "{" in rest or "}" in rest:
        return f"may use no braces but the placeholder {PLACEHOLDER}"
    for framework in tuple(frameworks) or ("framework",):
        problem = name_problem(expand_repository(template, framework))
        if problem is not None:
            return problem
    return None


def expand_repository(template: str, framework: str) -> str:
    """The repository for one framework: `{framework}` replaced, nothing else interpreted."""
    return template.replace(PLACEHOLDER, framework)


def redact_url(url: str) -> str:
    """`url` with any credentials before its host replaced by ***; the user name is kept."""
    at = url.rfind("@")
    if at < 0:
        return url
    start = _URL_AUTHORITY.match(url)
    begin = start.end() if start else 0
    if begin > at:
        begin = 0
    userinfo = url[begin:at]
    user, colon, _ = userinfo.partition(":")
    plain_user = colon and _USER.fullmatch(user)
    safe = f"{user}:***" if plain_user else "***"
    return f"{url[:begin]}{safe}{url[at:]}"


def index_url_problem(url: str) -> str | None:
    """What makes `url` no pip index URL (http or https, printable ASCII, no whitespace)."""
    if not url:
        return "is empty"
    if not url.isascii() or not url.isprintable() or any(ch.isspace() for ch in url):
        return "holds whitespace, control or non-ASCII characters; percent-encode them"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "is not a URL"
    if parts.scheme.lower() not in ("http", "https"):
        return "is not an http:// or https:// URL"
    if not parts.hostname:
        return "names no host"
    if port == 0:
        return "names port 0"
    return None


def public_url(url: str | None) -> str | None:
    """An index URL fit for a lock file: no user-info, query or fragment (they may hold tokens)."""
    if url is None:
        return None
    try:
        parts = urlsplit(url)
        host = parts.netloc.rpartition("@")[2]
        return urlunsplit((parts.scheme, host, parts.path, "", ""))
    except ValueError:
        return _USERINFO.sub(r"\1", redact_url(url))
