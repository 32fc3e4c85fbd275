"""What can go wrong reading PyPI."""

from __future__ import annotations

from envbuild.core.errors import EnvbuildError


class PypiError(EnvbuildError):
    """PyPI could not be read or answered something envbuild cannot use."""


class PypiUnreachable(PypiError):
    """PyPI could not be reached, or kept failing, after retries."""


class PypiRejected(PypiError):
    """PyPI answered 4xx (404 Not Found, 403, ...) for a URL; retrying will not help."""

    def __init__(self, message: str, *, url: str, status: int) -> None:
        super().__init__(message)
        self.url = url
        self.status = status
