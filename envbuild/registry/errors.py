"""What can go wrong with a registry: one exception class per kind of failure."""

from __future__ import annotations

from envbuild.core.errors import BadInput, EnvbuildError


class RegistryError(EnvbuildError):
    """A registry could not be used for what envbuild asked of it."""


class RegistryUnreachable(RegistryError):
    """The registry could not be reached, or kept failing, after retries."""


class RegistryAuthError(RegistryError):
    """The registry wants credentials envbuild does not have, or refused the ones it has."""


class RegistryNotFound(RegistryError):
    """The repository, manifest or blob does not exist on the registry."""


class RegistryRejected(RegistryError):
    """The registry answered a request with an error that retrying will not fix."""

    def __init__(self, message: str, *, status: int, codes: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.status = status
        self.codes = codes  # the OCI error codes of its body


class DigestMismatch(RegistryError):
    """Content read from (or stored by) the registry does not match its digest."""


class RegistryMalformed(RegistryError):
    """The registry answered something that is not what the API (or envbuild) puts there."""


class EvidenceNotFound(RegistryNotFound):
    """No evidence artifact refers to the image."""


class BadReference(BadInput):
    """An image reference cannot be used with a registry."""
