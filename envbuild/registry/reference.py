"""Image references split for the registry API (Docker's grammar, without Docker Hub defaults)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from envbuild.core.names import split_tag
from envbuild.net.bounded import is_loopback
from envbuild.registry.errors import BadReference

# Docker's reference grammar (distribution/reference), without the Docker Hub defaults.
_PATH_COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")
_DIGEST = re.compile(r"[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-zA-Z0-9=_-]{32,}")
_HOST = re.compile(r"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)(?::\d+)?")


@dataclass(frozen=True, kw_only=True)
class RegistryRef:
    """An image reference split for the registry API: host, repository, tag and/or digest."""

    host: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What goes after /manifests/: the digest when there is one, else the tag."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        text = f"{self.host}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def parse_reference(text: str) -> RegistryRef:
    """Split HOST[:PORT]/REPOSITORY[:TAG][@DIGEST]; a missing tag and digest mean `latest`."""
    name, _, digest = text.strip().partition("@")
    if digest and not _DIGEST.fullmatch(digest):
        msg = f"image reference {text!r}: {digest!r} is not a digest (expected sha256:<64 hex>)"
        raise BadReference(msg)
    host, slash, path = name.partition("/")
    if not slash or not _looks_like_host(host):
        msg = (
            f"image reference {text!r} names no registry host; Docker Hub shorthand is not "
            "supported, write the registry out, e.g. registry.example.com/team/torch:2.4 or "
            "127.0.0.1:5000/team/torch:2.4"
        )
        raise BadReference(msg)
    if not _HOST.fullmatch(host):
        msg = f"image reference {text!r}: {host!r} is not a registry host[:port]"
        raise BadReference(msg)
    repository, tag = split_tag(path)
    if tag is not None and not _TAG.fullmatch(tag):
        msg = f"image reference {text!r}: {tag!r} is not a valid tag"
        raise BadReference(msg)
    components = repository.split("/")
    if not all(_PATH_COMPONENT.fullmatch(c) for c in components):
        msg = (
            f"image reference {text!r}: repository {repository!r} is not valid; use lowercase "
            "letters, digits and separators (. _ __ -) between /-separated parts"
        )
        raise BadReference(msg)
    return RegistryRef(
        host=host,
        repository=repository,
        tag=tag or (None if digest else "latest"),
        digest=digest or None,
    )


def _looks_like_host(component: str) -> bool:
    # Docker's rule: the first component is a registry when it has a dot, a port or is localhost.
    return "." in component or ":" in component or component == "localhost"


def default_scheme(host: str) -> str:
    """Plain http for loopback registries (as Docker allows), https for every other one."""
    return "http" if is_loopback(host) else "https"


def is_digest(reference: str) -> bool:
    """True for ALGORITHM:ENCODED (what follows @ in a reference), False for a tag."""
    return bool(_DIGEST.fullmatch(reference))
