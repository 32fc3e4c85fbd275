"""Text from servers made safe for one terminal line: controls and ANSI escapes shown escaped,
bidi overrides neutralised, lengths cut; URLs shown by their origin or without their query."""

from __future__ import annotations

import re

from envbuild.net.bounded.origins import origin

# C0 and C1 controls (ESC starts every ANSI sequence), line/paragraph separators and the
# bidirectional overrides that make text display in another order than it reads.
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


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
