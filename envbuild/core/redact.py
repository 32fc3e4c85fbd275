"""The one place secrets are taken out of text before it leaves envbuild.

A secret (an index password, a registry password or token) is registered when it enters the
process; from then on every error message (EnvbuildError), every log record (a filter on the
CLI's log handler, which also sees urllib3's and docker-py's debug lines), every build log line
and every report is passed through `redact`. Secrets are matched in the forms other code turns
them into: as given, URL-encoded (docker-py puts build arguments into the /build query),
JSON-escaped and in HTTP Basic's base64.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from urllib.parse import quote, quote_plus, unquote, urlsplit

MASK = "***"
# Masking shorter strings would mangle ordinary words all over the output; a secret that short
# is still masked inside URLs by `mask_url`, but cannot be found in free text.
MIN_LENGTH = 3

_lock = threading.Lock()
_forms: set[str] = set()
_ordered: tuple[str, ...] = ()


def _variants(secret: str) -> set[str]:
    forms = {secret, quote(secret, safe=""), quote_plus(secret), quote(secret)}
    forms |= {quote(form, safe="") for form in tuple(forms)}  # encoded twice: a URL in a query
    forms.add(json.dumps(secret)[1:-1])
    forms.add(json.dumps(secret, ensure_ascii=False)[1:-1])
    return {form for form in forms if len(form) >= MIN_LENGTH}


def register(*secrets: str | None) -> None:
    """Remember secrets so that `redact` removes them from any text from now on."""
    global _ordered
    with _lock:
        for secret in secrets:
            if secret and len(secret) >= MIN_LENGTH:
                _forms.update(_variants(secret))
                if unquote(secret) != secret:
                    _forms.update(_variants(unquote(secret)))
        _ordered = tuple(sorted(_forms, key=len, reverse=True))


def register_credentials(username: str, password: str) -> None:
    """Register a password and the Basic header that carries it with its username."""
    register(password)
    if password:
        raw = f"{username}:{password}".encode()
        register(base64.b64encode(raw).decode("ascii"))


def url_passwords(text: str | None) -> list[str]:
    """The passwords in the user-info of the URLs in `text` (whitespace-separated, as pip takes
    PIP_EXTRA_INDEX_URL), as written there."""
    found = []
    for url in (text or "").split():
        try:
            password = urlsplit(url).password
        except ValueError:
            password = None
        if password is None and "@" in url and "://" in url:
            # Not a URL urlsplit understands; still never show what looks like user-info.
            userinfo = url.split("://", 1)[1].rsplit("@", 1)[0]
            password = userinfo.partition(":")[2] or None
        if password:
            found.append(password)
    return found


def register_url(url: str | None) -> None:
    """Register the passwords in URLs' user-info (https://user:PASSWORD@host/...)."""
    register(*url_passwords(url))


def forget_all() -> None:
    """Drop every registered secret (tests)."""
    global _ordered
    with _lock:
        _forms.clear()
        _ordered = ()


def redact(text: str) -> str:
    """`text` with every registered secret, in every form, replaced by ***."""
    for form in _ordered:
        if form in text:
            text = text.replace(form, MASK)
    return text


def mask_url(url: str) -> str:
    """A URL fit to show: its password replaced by *** whatever its length."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return redact(url)
    if not password:
        return redact(url)
    netloc = parts.netloc.rpartition("@")
    userinfo = netloc[0].partition(":")[0] + ":" + MASK
    return redact(parts._replace(netloc=f"{userinfo}@{netloc[2]}").geturl())


class RedactingFilter(logging.Filter):
    """A log-handler filter that formats each record and takes the secrets out."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        cleaned = redact(message)
        if cleaned != message or record.args:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None:
            # A traceback would print the exception's own text; keep only the redacted line.
            record.msg = f"{record.msg} ({redact(str(record.exc_info[1]))})"
            record.exc_info = None
            record.exc_text = None
        return True
