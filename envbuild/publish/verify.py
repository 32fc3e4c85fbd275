"""What the registry already holds: an entry's immutable tag, the evidence attached to a digest.

`build --push` asks before building, so a nightly run where nothing upstream moved builds
nothing; `publish` asks before pushing, so an immutable tag never comes to name another image;
`verify` shows what a published image was vetted with.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envbuild.core.errors import BadInput, EnvbuildError
from envbuild.core.names import split_tag
from envbuild.net.bounded import printable
from envbuild.publish import cosign
from envbuild.publish.evidence import PACKAGES, find_evidence, image_config_digest, smoke_report
from envbuild.publish.sbom import SBOM, summary
from envbuild.publish.signing import Subject, verify_image
from envbuild.registry import RegistryClient, parse_reference
from envbuild.registry.errors import EvidenceNotFound, RegistryNotFound

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey

HASH_LENGTH = 12  # content-hash characters in an immutable tag


def split_registry(registry: str) -> tuple[str, str]:
    """`--registry HOST[/PREFIX]` as (host, prefix); BadInput when it names no host."""
    host, _, prefix = registry.strip("/").partition("/")
    if not host or ("." not in host and ":" not in host and host != "localhost"):
        msg = f"--registry {registry!r} names no registry host (e.g. registry.example.com/ml or 127.0.0.1:5000/team)"
        raise BadInput(msg)
    return host, prefix


@dataclass(frozen=True, kw_only=True)
class Target:
    """Where an image goes in a registry: its repository and immutable tag."""

    host: str
    repository: str
    tag: str  # the image's own tag, e.g. 2.13.0-cpu-py3.11-bookworm
    immutable: str  # tag-<content hash>: names one image forever

    @property
    def reference(self) -> str:
        return f"{self.host}/{self.repository}:{self.immutable}"


def target(registry: str, name: str, tag: str, content_hash: str) -> Target:
    """The target of an image called `name`:`tag` (the last path part of its local repository)."""
    host, prefix = split_registry(registry)
    return Target(
        host=host,
        repository=f"{prefix}/{name}" if prefix else name,
        tag=tag,
        immutable=f"{tag}-{content_hash[:HASH_LENGTH]}",
    )


def framework_target(registry: str, local_ref: str) -> Target:
    """Where a framework image (local `envbuild/framework:<tag>`) goes: the registry's one
    `framework` repository under its prefix, whichever team's entries stand on it, so that every
    build that needs its key finds it there; under its own tag (`torch-2.13.0-cpu-<key>`), which
    its key makes immutable already."""
    _, tag = split_tag(local_ref)
    host, prefix = split_registry(registry)
    repository = f"{prefix}/framework" if prefix else "framework"
    return Target(host=host, repository=repository, tag=tag or "", immutable=tag or "")


def entry_target(registry: str, image_ref: str, content_hash: str) -> Target:
    """The target of an entry's image, named by its local reference (envbuild/torch:TAG)."""
    path, tag = split_tag(image_ref)
    return target(registry, path.rsplit("/", 1)[-1], tag or "latest", content_hash)


@dataclass(frozen=True, kw_only=True)
class Verification:
    """What a registry holds for a digest, with the evidence attached to it."""

    reference: str
    digest: str
    image_id: str  # the config digest the manifest names; the smoke report is about it
    passed: bool
    report: dict[str, Any]
    packages: str
    sbom: dict[str, Any] | None = None  # format and package counts, when the evidence has one
    signed: tuple[str, ...] = ()  # with a key: what its signature and attestations proved
    # An image index (one tag for several platforms): each platform's image, verified as one.
    platforms: tuple[tuple[str, Verification], ...] = ()


def verify_digest(
    client: RegistryClient, repository: str, reference: str, shown: str
) -> Verification:
    """Fetch the manifest at `reference` and the evidence attached to it; check they belong
    together. Everything the registry returns is checked for shape; one deadline bounds it all."""
    with client.operation():
        manifest, _, digest = client.get_manifest(repository, reference)
        if "manifests" in manifest and "config" not in manifest:
            return _verify_index(client, repository, manifest, digest, shown)
        image_id = image_config_digest(client, manifest, client.name(repository, digest))
        files = find_evidence(client, repository, digest)
        where = f"the evidence of {client.host}/{repository}@{digest}"
        report = smoke_report(client, files, where)
    if report["image_id"] != image_id:
        msg = (
            f"{printable(shown)}: the attached smoke report is for image "
            f"{report['image_id']}, but {digest} holds image {image_id}"
        )
        raise EnvbuildError(msg)
    return Verification(
        reference=shown,
        digest=digest,
        image_id=image_id,
        passed=report["passed"],
        report=report,
        packages=files.get(PACKAGES, b"").decode("utf-8", errors="replace"),
        sbom=summary(files[SBOM]) if SBOM in files else None,
    )


MAX_PLATFORMS = 8  # an index of envbuild's names one image per platform it builds for


def _verify_index(
    client: RegistryClient, repository: str, index: dict[str, Any], digest: str, shown: str
) -> Verification:
    """Every platform's image of an index, verified with its own evidence; passed only when
    every one passed."""
    what = client.name(repository, digest)
    children = index.get("manifests")
    if not isinstance(children, list) or not 0 < len(children) <= MAX_PLATFORMS:
        raise client.malformed(
            what, kind="index", why=f"it does not list 1 to {MAX_PLATFORMS} images"
        )
    platforms: list[tuple[str, Verification]] = []
    for child in children:
        child = client.descriptor(child, what, kind="index")
        platform = child.get("platform")
        if not isinstance(platform, dict) or not all(
            isinstance(platform.get(key), str) for key in ("os", "architecture")
        ):
            raise client.malformed(what, kind="index", why="an image's platform is not named")
        name = f"{platform['os']}/{platform['architecture']}"
        found = verify_digest(client, repository, child["digest"], f"{shown} ({name})")
        if found.platforms:
            raise client.malformed(what, kind="index", why="it names another index")
        platforms.append((name, found))
    return Verification(
        reference=shown,
        digest=digest,
        image_id="",
        passed=all(found.passed for _, found in platforms),
        report={},
        packages="",
        platforms=tuple(platforms),
    )


def verify_reference(text: str, key: EllipticCurvePublicKey | None = None) -> Verification:
    """`envbuild verify REF [--key PUB]`: the published image and the smoke report attached to
    it; with a key, its signature and signed attestations too (SignatureError on any mismatch)."""
    ref = parse_reference(text)
    with RegistryClient.for_host(ref.host) as client, client.operation():
        found = verify_digest(client, ref.repository, ref.reference, text)
        if key is None:
            return found
        if found.platforms:  # the index is signed, and each platform's image on its own
            index = Subject(host=ref.host, repository=ref.repository, digest=found.digest)
            required = (cosign.TEST_RESULT, cosign.SLSA_PROVENANCE)
            checked = [
                f"index: {line}" for line in verify_image(client, index, key, required).checked
            ]
            for name, image in found.platforms:
                subject = Subject(host=ref.host, repository=ref.repository, digest=image.digest)
                checked += [
                    f"{name}: {line}" for line in verify_image(client, subject, key).checked
                ]
            return dataclasses.replace(found, signed=tuple(checked))
        subject = Subject(host=ref.host, repository=ref.repository, digest=found.digest)
        signed = verify_image(client, subject, key)
    return dataclasses.replace(found, signed=tuple(signed.checked))


def held_digest(client: RegistryClient, where: Target) -> str | None:
    """The digest under the immutable tag, or None when the registry has no such tag."""
    try:
        return client.manifest_digest(where.repository, where.immutable)
    except RegistryNotFound:
        return None


def published_already(client: RegistryClient, where: Target) -> Verification | None:
    """The immutable tag's image and evidence when it was published and vetted; None when the
    tag is not there. A tag without passing evidence is an error: envbuild never wrote one, and
    it must not be overwritten or taken as vetted. The tag and its evidence are one operation
    under one deadline."""
    with client.operation():
        if held_digest(client, where) is None:
            return None
        try:
            found = verify_digest(client, where.repository, where.immutable, where.reference)
        except EvidenceNotFound:
            found = None
    if found is None or not found.passed:
        why = "no envbuild evidence" if found is None else "evidence of a failed smoke test"
        msg = (
            f"{where.reference} exists with {why} (an interrupted publish, or not envbuild's); "
            "an immutable tag is never overwritten: delete it in the registry, then run again"
        )
        raise EnvbuildError(msg)
    return found
