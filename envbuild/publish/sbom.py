"""A CycloneDX SBOM of an image's environment, published in its evidence beside the smoke report.

Python packages come from the lock the image installed (/opt/venv/envbuild.lock: every
distribution pinned, with the hashes the install required), OS packages from dpkg. Made with
cyclonedx-python-lib, the CycloneDX project's own library, so the document follows the schema.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

SBOM = "sbom.cdx.json"  # the evidence file's title
MEDIA_TYPE = "application/vnd.cyclonedx+json"
MAX_COMPONENTS = 20_000

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==([^\s;\\]+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")
_DPKG = re.compile(r"^([a-z0-9][a-z0-9+.-]*)(?::[a-z0-9]+)? ([A-Za-z0-9.+:~-]+)$")


@dataclass(frozen=True, kw_only=True)
class Package:
    """One component: a Python distribution or an OS package."""

    kind: str  # "pypi" or "deb"
    name: str
    version: str
    sha256: tuple[str, ...] = ()  # the hashes the lock allowed


def lock_packages(lock_text: str) -> list[Package]:
    """Every pinned distribution of a lock, with its hashes (uv's `--generate-hashes` format:
    a `name==version \\` line followed by `--hash=sha256:...` lines)."""
    found: list[Package] = []
    for line in lock_text.splitlines():
        pin = _PIN.match(line)
        if pin is not None:
            found.append(Package(kind="pypi", name=pin[1].lower(), version=pin[2]))
        elif found and line.startswith(" ") and "--hash=" in line:
            last = found[-1]
            found[-1] = Package(
                kind=last.kind,
                name=last.name,
                version=last.version,
                sha256=(*last.sha256, *_HASH.findall(line)),
            )
    return found[:MAX_COMPONENTS]


def dpkg_packages(listing: str) -> list[Package]:
    """OS packages from `dpkg-query -W -f '${Package} ${Version}\\n'` lines (after `# dpkg`)."""
    _, _, section = listing.partition("# dpkg")
    found = []
    for line in section.splitlines():
        match = _DPKG.match(line.strip())
        if match is not None:
            found.append(Package(kind="deb", name=match[1], version=match[2]))
    return found[:MAX_COMPONENTS]


def sbom_document(image: str, image_id: str, packages: list[Package]) -> bytes:
    """The CycloneDX 1.6 JSON document: the image as the described component, depending on
    every package."""
    from cyclonedx.model import HashAlgorithm, HashType
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    root = Component(name=image, version=image_id, type=ComponentType.CONTAINER, bom_ref=image_id)
    bom = Bom()
    bom.metadata.component = root
    components = []
    for package in packages:
        namespace = "debian" if package.kind == "deb" else None
        purl = PackageURL(
            package.kind, namespace=namespace, name=package.name, version=package.version
        )
        components.append(
            Component(
                name=package.name,
                version=package.version,
                type=ComponentType.LIBRARY,
                purl=purl,
                bom_ref=str(purl),
                hashes=[HashType(alg=HashAlgorithm.SHA_256, content=h) for h in package.sha256],
            )
        )
    bom.components.update(components)
    bom.register_dependency(root, components)
    return JsonV1Dot6(bom).output_as_string(indent=1).encode()


def summary(document: bytes) -> dict[str, Any]:
    """What `verify` shows of an SBOM: its format and how many packages of each kind."""
    try:
        data = json.loads(document)
    except ValueError:
        return {"format": "not JSON", "pypi": 0, "deb": 0}
    if not isinstance(data, dict):
        return {"format": "not a CycloneDX document", "pypi": 0, "deb": 0}
    components = data.get("components")
    components = components if isinstance(components, list) else []
    purls = [c.get("purl") for c in components if isinstance(c, dict)]
    return {
        "format": f"{data.get('bomFormat', '?')} {data.get('specVersion', '?')}",
        "pypi": sum(isinstance(p, str) and p.startswith("pkg:pypi/") for p in purls),
        "deb": sum(isinstance(p, str) and p.startswith("pkg:deb/") for p in purls),
    }
