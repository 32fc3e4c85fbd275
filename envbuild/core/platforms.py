"""The platforms an image is built for (OCI's os/architecture): names, spellings, the host's."""

from __future__ import annotations

import platform

AMD64 = "linux/amd64"
ARM64 = "linux/arm64"
PLATFORMS = (AMD64, ARM64)
# What users and tools write for each: Docker's and OCI's names, the kernel's (`uname -m`).
_SPELLINGS = {
    AMD64: ("linux/amd64", "amd64", "x86_64", "linux/x86_64"),
    ARM64: ("linux/arm64", "linux/arm64/v8", "arm64", "aarch64", "linux/aarch64"),
}
# The wheel platform (uv's --python-platform and manylinux tags) and `uname -m` of each.
MACHINE = {AMD64: "x86_64", ARM64: "aarch64"}


def platform_of(text: str) -> str | None:
    """The platform `text` names (linux/arm64 for 'aarch64' or 'arm64'), or None."""
    wanted = text.strip().lower()
    for name, spellings in _SPELLINGS.items():
        if wanted in spellings:
            return name
    return None


def host_platform() -> str:
    """The platform of this machine: what an image built here runs without emulation."""
    return platform_of(platform.machine()) or AMD64


def architecture(name: str) -> str:
    """The architecture part of a platform: amd64, arm64 (what an image's config records)."""
    return name.split("/")[1]


def tag_suffix(name: str) -> str:
    """What an entry's id and local tag carry for its platform: nothing for amd64 (the ids and
    tags envbuild has always given), '-arm64' for arm64; the engine holds one platform per tag."""
    return "" if name == AMD64 else f"-{architecture(name)}"


def platform_ref(reference: str, name: str) -> str:
    """The local tag of `reference`'s image for platform `name`: corp/base:bookworm-arm64 for
    linux/arm64, the reference itself for linux/amd64, an image id or a digest (which name one
    image, so one platform) unchanged. `envbuild base bootstrap --platform` tags its images so."""
    suffix = tag_suffix(name)
    if not suffix or "@" in reference or reference.startswith("sha256:"):
        return reference
    last = reference.rfind("/")
    colon = reference.rfind(":")
    if colon > last:
        return reference + suffix
    return f"{reference}:latest{suffix}"
