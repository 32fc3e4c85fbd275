"""Which CAs envbuild's own HTTPS requests trust: the default store, plus `--ca-bundle`.

Behind a TLS-intercepting gateway, or with a registry whose certificate a private CA signs, the
CA bundle a build is given (`--ca-bundle`) is also what envbuild's registry client must trust
to publish and verify. The CLI sets it for the command (`trusting`); every session that
`trust_session` wraps then verifies each request against the default store (REQUESTS_CA_BUNDLE
when set, else certifi's) together with that bundle, passed per request so that requests' own
reading of the environment cannot replace it.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import tempfile
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envbuild.core.interrupt import scratch_prefix

if TYPE_CHECKING:
    import requests

_chosen: ContextVar[Path | None] = ContextVar("envbuild_ca_bundle", default=None)
_combined: dict[str, str] = {}  # sha256 of the combined PEM -> its file, one per process


@contextlib.contextmanager
def trusting(bundle: Path | None) -> Iterator[None]:
    """Run the block with `bundle` (a checked PEM file, or None) trusted besides the default."""
    token = _chosen.set(bundle)
    try:
        yield
    finally:
        _chosen.reset(token)


def chosen_bundle() -> Path | None:
    """The bundle `trusting` set, if any."""
    return _chosen.get()


def default_store() -> str:
    """The CA file requests would verify against: REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE, certifi."""
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        value = os.environ.get(name, "")
        if value and Path(value).is_file():
            return value
    import certifi

    return str(certifi.where())


def verify_setting(bundle: Path | None) -> str | bool:
    """requests' `verify` for a request: True, or a file of the default store plus `bundle`."""
    if bundle is None:
        return True
    data = Path(default_store()).read_bytes().rstrip(b"\n") + b"\n" + bundle.read_bytes()
    key = hashlib.sha256(data).hexdigest()
    if key not in _combined or not Path(_combined[key]).is_file():
        # Named as this run's scratch: an interrupt, which ends the process without its atexit
        # handlers, removes it with the run's other scratch (core/interrupt.remove_scratch).
        fd, name = tempfile.mkstemp(prefix=scratch_prefix("ca"), suffix=".pem")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        atexit.register(_remove, name)
        _combined[key] = name
    return _combined[key]


def _remove(name: str) -> None:
    with contextlib.suppress(OSError):
        Path(name).unlink()


def trust_session(session: requests.Session, bundle: Path | None) -> None:
    """Verify each request of `session` against the default store and `bundle` (nothing
    changes without one)."""
    if bundle is None:
        return
    verify = verify_setting(bundle)
    send = session.request

    def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("verify", verify)
        return send(method, url, *args, **kwargs)

    session.request = request  # type: ignore[method-assign,assignment]
