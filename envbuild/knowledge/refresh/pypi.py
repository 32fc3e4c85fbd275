"""PyPI's JSON API and wheel metadata, read over an injected requests.Session."""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Mapping
from typing import Any

import requests

from envbuild.knowledge.refresh.errors import PypiError, PypiRejected, PypiUnreachable
from envbuild.knowledge.refresh.wheel_zip import metadata_from_zip, metadata_text
from envbuild.net.bounded import Overloaded, Retries, TlsFailed, Unreachable

log = logging.getLogger(__name__)

PYPI_URL = "https://pypi.org"
_USER_AGENT = "envbuild-knowledge-refresh (+https://pypi.org/pypi/<package>/json reader)"
_LONGEST_WAIT = 30.0  # seconds: a longer Retry-After from PyPI (or a proxy) is cut to this


class PypiClient:
    """Reads PyPI's JSON API and wheel metadata over an injected requests.Session."""

    def __init__(
        self,
        session: requests.Session,
        *,
        index_url: str = PYPI_URL,
        tries: int = 4,
        backoff: float = 1.0,
        timeout: float = 60.0,
    ) -> None:
        self.session = session
        self.index_url = index_url.rstrip("/")
        self.tries = max(1, tries)
        self.backoff = backoff
        self.timeout = timeout

    def project_url(self, package: str) -> str:
        """The JSON API URL listing every release and file of `package`."""
        return f"{self.index_url}/pypi/{package}/json"

    def project(self, package: str) -> dict[str, Any]:
        """The JSON API document of `package` (all releases, their files, upload times)."""
        url = self.project_url(package)
        response = self._get(url)
        try:
            data = response.json()
        except ValueError as exc:
            msg = f"{url} did not return JSON ({exc}); a proxy may be rewriting PyPI's answers"
            raise PypiError(msg) from exc
        if not isinstance(data, dict) or not isinstance(data.get("releases"), dict):
            msg = f"{url} returned JSON without a 'releases' mapping; is it PyPI's JSON API?"
            raise PypiError(msg)
        return data

    def core_metadata(self, wheel_url: str) -> str:
        """The wheel's METADATA: PEP 658 `<url>.metadata`, else read from the zip by range."""
        try:
            return metadata_text(self._get(wheel_url + ".metadata").content)
        except PypiRejected as exc:
            if exc.status != 404:
                raise
        log.info("no PEP 658 metadata for %s; reading it from the wheel by range", wheel_url)
        return metadata_from_zip(wheel_url, self._get_range)

    def _get_range(self, url: str, byte_range: str) -> tuple[bytes, int]:
        """Bytes of `url` in `byte_range` ("a-b" or "-n") and the file's total size."""
        response = self._get(url, headers={"Range": f"bytes={byte_range}"}, stream=True)
        with response:
            if response.status_code != 206:
                msg = (
                    f"{url} ignored an HTTP range request (status {response.status_code}); "
                    "cannot read the wheel's METADATA without downloading it whole"
                )
                raise PypiError(msg)
            match = re.fullmatch(r"bytes \d+-\d+/(\d+)", response.headers.get("Content-Range", ""))
            if match is None:
                msg = f"{url} answered a range request without a usable Content-Range header"
                raise PypiError(msg)
            return response.content, int(match.group(1))

    def _get(
        self, url: str, *, headers: Mapping[str, str] | None = None, stream: bool = False
    ) -> requests.Response:
        """GET with retries on connection errors, 429 and 5xx (http_limits.Retries); any other
        4xx fails at once."""
        all_headers = {"User-Agent": _USER_AGENT, **(headers or {})}
        retries = Retries(tries=self.tries, backoff=self.backoff, longest=_LONGEST_WAIT)
        get = functools.partial(
            self.session.get, url, headers=all_headers, timeout=self.timeout, stream=stream
        )
        try:
            response = retries.send(get, label=f"GET {url}")
        except TlsFailed as exc:
            msg = (
                f"cannot reach {url}: TLS verification failed ({_one_line(exc.error)}); behind a "
                "TLS-intercepting proxy set REQUESTS_CA_BUNDLE to its CA bundle"
            )
            raise PypiUnreachable(msg) from exc.error
        except Unreachable as exc:
            msg = (
                f"cannot reach {url} after {exc.tries} tries: {_one_line(exc.error)}; check "
                "the network or proxy (HTTPS_PROXY; REQUESTS_CA_BUNDLE for a "
                "TLS-intercepting proxy)"
            )
            raise PypiUnreachable(msg) from exc.error
        except Overloaded as exc:
            msg = (
                f"{url} answered HTTP {exc.status} {exc.reason} "
                f"{exc.tries} times; PyPI or the proxy is failing, try again later"
            )
            raise PypiUnreachable(" ".join(msg.split())) from None
        status = response.status_code
        if status < 400:
            return response
        response.close()
        msg = f"{url} answered HTTP {status} {response.reason or ''}".rstrip()
        hint = (
            "; check the package name and the index URL"
            if status == 404
            else "; check the index URL and any proxy credentials"
        )
        raise PypiRejected(msg + hint, url=url, status=status)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
