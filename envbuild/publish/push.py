"""Publish only vetted images: push, read the digest back from the registry, then record it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from envbuild.core import labels as label_keys
from envbuild.core.errors import BadInput, EnvbuildError
from envbuild.core.models import Entry, Gpu
from envbuild.core.names import split_tag
from envbuild.core.platforms import tag_suffix
from envbuild.core.store import ResultStore, SmokeRecord
from envbuild.core.versions import cuda_tag
from envbuild.engine.interface import Engine
from envbuild.net.credentials import docker_auth_config
from envbuild.plan.matrix import newest_per_framework
from envbuild.publish import attestations, cosign
from envbuild.publish.evidence import PACKAGES, SMOKE_REPORT, attach_evidence, image_config_digest
from envbuild.publish.keys import SigningKey
from envbuild.publish.platform_index import (
    IndexPublished,
    index_children,
    platform_groups,
    publish_index,
    shared_tag,
)
from envbuild.publish.sbom import MEDIA_TYPE as SBOM_MEDIA_TYPE
from envbuild.publish.sbom import SBOM, dpkg_packages, lock_packages, sbom_document
from envbuild.publish.signing import Subject, sign_image
from envbuild.publish.verify import (
    Target,
    framework_target,
    held_digest,
    split_registry,
    target,
)
from envbuild.registry import RegistryClient
from envbuild.report.documents import write_json
from envbuild.smoke.static import fleet_refusal

PACKAGES_SCRIPT = (
    "echo '# pip freeze'; (python3 -m pip freeze --all 2>/dev/null || true); "
    "echo '# dpkg'; (dpkg-query -W -f '${Package} ${Version}\\n' 2>/dev/null || true)"
)
LOCK_SCRIPT = "cat /opt/venv/envbuild.lock 2>/dev/null || true"  # images before locks have none


class PublishLines(TypedDict):
    """What a caller shows as publishing goes: each image as it starts, each reference pushed."""

    on_start: Callable[[Candidate], None]
    on_published: Callable[[Candidate, Published], None]


class NotVetted(EnvbuildError):
    """An image without a passing smoke test for its exact id."""


class NotOurs(EnvbuildError):
    """An image that carries envbuild's labels but is not the image envbuild built for them."""


@dataclass(frozen=True, kw_only=True)
class Published:
    """One reference pushed and verified."""

    reference: str
    digest: str
    kind: str  # "immutable", "moving" or "evidence"

    def as_dict(self) -> dict[str, str]:
        """Plain mapping for the report."""
        return {"reference": self.reference, "digest": self.digest, "kind": self.kind}


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A local image to publish, with the tags it gets."""

    source: str  # what the user named: an entry's image tag or an explicit reference
    image_id: str
    name: str  # repository name under the registry prefix, e.g. "torch"
    tag: str  # e.g. "2.13.0-cpu-py3.11-bookworm"
    content_hash: str | None
    moving: tuple[str, ...]  # tags that move to this image once the immutable one is verified


def candidate(
    engine: Engine, store: ResultStore, ref: str, *, moving: tuple[str, ...] = ()
) -> Candidate:
    """Resolve a local image reference into what publish needs.

    An image carrying envbuild's content-hash label is published under that hash only when it
    is the very image envbuild built for it: a derived image inherits the label from its base,
    and a tag can be moved (`docker tag`) to any image.
    """
    image = engine.image(ref)
    if image is None:
        msg = f"image {ref} is not in the local engine; build it first (`envbuild build`)"
        raise BadInput(msg)
    content_hash = image.labels.get(label_keys.CONTENT_HASH)
    if content_hash is not None:
        records = store.built_images(content_hash)
        if not records:
            msg = (
                f"refusing to publish {ref}: image {image.id[:19]} carries envbuild's content hash "
                f"{content_hash[:12]}, but envbuild has no record of building it here (an image "
                "built FROM an envbuild image inherits the label); rebuild the entry with "
                "`envbuild build` to publish envbuild's own image"
            )
            raise NotOurs(msg)
        if image.id not in {record.image_id for record in records}:
            record = records[0]  # the newest: what `envbuild build` would restore
            msg = (
                f"refusing to publish {ref}: it is image {image.id[:19]}, but envbuild built "
                f"{record.image_id[:19]} for {record.entry_id} (content hash {content_hash[:12]}); "
                "the tag was moved or the image derives from envbuild's; run `envbuild build` "
                "with the same selectors to restore the tag"
            )
            raise NotOurs(msg)
    path, tag = split_tag(ref)
    tag = tag or "latest"
    name = path.rsplit("/", 1)[-1]
    if ref.startswith("sha256:"):
        name, tag = image.labels.get(label_keys.FRAMEWORK, "image"), image.id[7:19]
    return Candidate(
        source=ref,
        image_id=image.id,
        name=name,
        tag=tag,
        content_hash=content_hash,
        moving=moving,
    )


def moving_tags(entries: list[Entry]) -> dict[str, tuple[str, ...]]:
    """Per entry id: the series tag (torch2.13-cpu-py3.11) and, for the newest release of each
    framework in this run, `latest`; an arm64 entry without its amd64 twin in the run gets them
    with its platform's suffix (latest-arm64)."""
    # The newest of each framework for each platform: one platform's newer release does not
    # take `latest` from another's.
    newest = {
        e.id
        for platform in {e.platform for e in entries}
        for e in newest_per_framework([e for e in entries if e.platform == platform]).values()
    }
    grouped = {e.id for members in platform_groups(entries).values() for e in members}
    tags: dict[str, tuple[str, ...]] = {}
    for entry in entries:
        series = ".".join(entry.framework_version.split(".")[:2])
        names = [f"{entry.framework}{series}-{cuda_tag(entry.cuda)}-py{entry.python}"]
        if entry.id in newest:
            names.append("latest")
        # Another platform's image alone (a CI job per platform) moves its own tags: the shared
        # ones name the amd64 image, or the index once both platforms are published together.
        suffix = "" if entry.id in grouped else tag_suffix(entry.platform)
        tags[entry.id] = tuple(name + suffix for name in names)
    return tags


def built_entries(engine: Engine, entries: tuple[Entry, ...]) -> list[Entry]:
    """The selected entries whose image is in the local engine; BadInput when none is."""
    built = [e for e in entries if engine.image(e.image) is not None]
    if not built:
        msg = (
            f"none of the {len(entries)} selected entries is built here; "
            "run `envbuild build` with the same selectors first"
        )
        raise BadInput(msg)
    return built


def entry_candidates(
    engine: Engine, store: ResultStore, entries: list[Entry], *, run: Sequence[Entry] = ()
) -> list[Candidate]:
    """Each entry's image as a candidate, with its moving tags (series, and `latest`); an entry
    built for several platforms in this run (`run`: all its entries, passed or not) has none:
    they name the index over its platforms' images (publish_platform_indexes), or, when one
    platform failed, stay where they were."""
    tags = moving_tags(entries)
    grouped = {e.id for members in platform_groups([*entries, *run]).values() for e in members}
    return [
        candidate(engine, store, e.image, moving=() if e.id in grouped else tags[e.id])
        for e in entries
    ]


def publish_platform_indexes(
    registry: str,
    members: Sequence[tuple[Entry, str | None]],
    *,
    on_published: Callable[[IndexPublished], None],
    signing_key: SigningKey | None = None,
) -> list[IndexPublished]:
    """For the entries that differ only in their platform, one tag over their published images
    (an image index), with the moving tags of all of them. `members`: every entry of the run
    with the content hash of its published image, None for one that failed. An index with a
    missing or failed platform is never published: EnvbuildError naming it, after the others.
    With a `signing_key` the index is signed too, with the test-result and provenance
    attestations an admission policy checks on the digest a multi-platform tag resolves to."""
    groups = platform_groups([entry for entry, _ in members])
    if not groups:
        return []
    hashes = dict((entry.id, content_hash) for entry, content_hash in members)
    tags = moving_tags([entry for entry, _ in members])
    published, refused = [], []
    with RegistryClient.for_host(split_registry(registry)[0]) as client:
        for shared, entries in groups.items():
            failed = [e for e in entries if hashes[e.id] is None]
            if failed:
                refused.append(
                    f"not publishing one tag for {shared}: its {failed[0].platform} image "
                    f"({failed[0].id}) failed or was not published; each platform's image must "
                    "pass and be published before the index over them is"
                )
                continue
            children = index_children(client, registry, [(e, hashes[e.id] or "") for e in entries])
            name, tag = shared_tag(entries)
            # The entry's own tag names the index too: `docker pull REPO:<tag>` on any node.
            moving = tuple(dict.fromkeys([tag, *(t for e in entries for t in tags[e.id])]))
            done = publish_index(
                client, registry, name=name, tag=tag, children=children, moving=moving
            )
            if signing_key is not None:
                done = _sign_index(client, done, signing_key)
            on_published(done)
            published.append(done)
    if refused:
        raise EnvbuildError("; ".join(refused))
    return published


def _sign_index(client: RegistryClient, index: IndexPublished, key: SigningKey) -> IndexPublished:
    """Sign the index and attest its verdict (over its images' own) and its provenance."""
    children = [(child.platform, child.digest) for child in index.children]
    predicates = {
        cosign.TEST_RESULT: attestations.index_test_result(children),
        cosign.SLSA_PROVENANCE: attestations.index_provenance(children),
    }
    subject = Subject(host=index.host, repository=index.repository, digest=index.digest)
    signature, attested = sign_image(client, subject, key.private, predicates)
    return dataclasses.replace(index, signature=signature, attestations=attested)


def publish_images(
    engine: Engine,
    store: ResultStore,
    items: list[Candidate],
    registry: str,
    *,
    on_start: Callable[[Candidate], None],
    on_published: Callable[[Candidate, Published], None],
    fleet: tuple[Gpu, ...] = (),
    signing_key: SigningKey | None = None,
) -> None:
    """Publish each candidate in turn (see publish_image); stop at the first failure."""
    for item in items:
        on_start(item)
        pushed = publish_image(
            engine, store, item, registry, on_line=lambda line: None, fleet=fleet,
            signing_key=signing_key,
        )  # fmt: skip
        for done in pushed:
            on_published(item, done)


def publish_reported(
    engine: Engine,
    store: ResultStore,
    items: list[Candidate],
    registry: str,
    *,
    report_file: Path | None,
    on_start: Callable[[Candidate], None],
    on_published: Callable[[Candidate, Published], None],
    fleet: tuple[Gpu, ...] = (),
    signing_key: SigningKey | None = None,
) -> None:
    """Publish each candidate (see publish_images); `report_file`, when given, lists what was
    published, written even when a publication fails."""
    published: list[dict[str, Any]] = []

    def done(item: Candidate, pushed: Published) -> None:
        on_published(item, pushed)
        published.append({"image": item.source, "image_id": item.image_id, **pushed.as_dict()})

    try:
        publish_images(
            engine, store, items, registry, on_start=on_start, on_published=done, fleet=fleet,
            signing_key=signing_key,
        )  # fmt: skip
    finally:
        if report_file is not None:
            write_json(report_file, {"registry": registry, "published": published})


def publish_image(
    engine: Engine,
    store: ResultStore,
    item: Candidate,
    registry: str,
    *,
    on_line: Callable[[str], None],
    fleet: tuple[Gpu, ...] = (),
    signing_key: SigningKey | None = None,
) -> list[Published]:
    """Push one vetted image under its immutable tag, verify the digest, attach the evidence
    (and, with a `signing_key`, sign it and its attestations), then move the moving tags; record
    the publication only when the registry holds the tested image. With a `fleet` (--gpu), an
    image without kernels for one of its GPUs is refused first."""
    record = _vetted(engine, store, item, fleet)
    where = target(registry, item.name, item.tag, item.content_hash or item.image_id[7:])
    host, repository = where.host, where.repository
    auth = docker_auth_config(host)
    with RegistryClient.for_host(host) as client:
        _refuse_overwrite(client, where, item)
        target_ref = where.reference
        pushed = engine.push(item.image_id, target_ref, auth_config=auth, on_line=on_line)
        held, manifest = _held_manifest(client, where, item, pushed)
        store.record_published(item.image_id, f"{host}/{repository}@{held}", held)
        results = [Published(reference=target_ref, digest=held, kind="immutable")]
        subject = (held, manifest.media_type, manifest.size)
        evidence, sbom = _attach_evidence(engine, client, repository, item, record, subject)
        results.append(
            Published(reference=f"{host}/{repository}@{evidence}", digest=evidence, kind="evidence")
        )
        if signing_key is not None:
            results += _sign(engine, client, Subject(host=host, repository=repository, digest=held),
                             signing_key, store, item, record.report, sbom)  # fmt: skip
        framework = _framework_of(engine, store, item.image_id)
        if framework is not None:
            results.append(
                _push_framework(engine, client, store, framework, registry, auth, on_line)
            )
        for tag in item.moving:
            reference = f"{host}/{repository}:{tag}"
            moved = engine.push(item.image_id, reference, auth_config=auth, on_line=on_line)
            if client.manifest_digest(repository, tag) != held or moved != held:
                msg = f"{reference}: the moving tag does not point at {held} after the push"
                raise EnvbuildError(msg)
            store.record_published(item.image_id, reference, held)
            results.append(Published(reference=reference, digest=held, kind="moving"))
    return results


def _framework_of(engine: Engine, store: ResultStore, image_id: str) -> tuple[str, str] | None:
    """(id, local reference) of the framework image envbuild built or checked here that the
    image stands on (its key label, and its layers the lowest of the image's), or None."""
    image = engine.image(image_id)
    key = image.labels.get(label_keys.FRAMEWORK_KEY) if image is not None else None
    if image is None or key is None:
        return None
    for record in store.built_images(key):
        found = engine.image(record.image_id)
        if (
            found is not None
            and found.labels.get(label_keys.FRAMEWORK_KEY) == key
            and found.layers
            and image.layers[: len(found.layers)] == found.layers
        ):
            return found.id, record.image_ref
    return None


def _push_framework(
    engine: Engine,
    client: RegistryClient,
    store: ResultStore,
    framework: tuple[str, str],
    registry: str,
    auth: dict[str, str] | None,
    on_line: Callable[[str], None],
) -> Published:
    """Push the framework image an image stands on beside it, so that a build elsewhere takes it
    from the registry (by its key) instead of building it; its layers are the image's, pushed
    already, so this uploads its manifest and config alone."""
    image_id, local = framework
    where = framework_target(registry, local)
    pushed = engine.push(image_id, where.reference, auth_config=auth, on_line=on_line)
    held = client.manifest_digest(where.repository, where.tag)
    if held != pushed:
        msg = f"{where.reference}: the registry holds {held}, not the {pushed} just pushed"
        raise EnvbuildError(msg)
    store.record_published(image_id, where.reference, held)
    return Published(reference=where.reference, digest=held, kind="framework")


def _vetted(
    engine: Engine, store: ResultStore, item: Candidate, fleet: tuple[Gpu, ...]
) -> SmokeRecord:
    """The passing smoke record of the candidate's exact image id; NotVetted otherwise."""
    record = store.latest_smoke(item.image_id)
    if record is None or not record.passed:
        why = "has never been smoke-tested" if record is None else "failed its last smoke test"
        msg = (
            f"refusing to publish {item.source}: image {item.image_id[:19]} {why}; "
            f"vet it with `envbuild smoke {item.source}` (or `envbuild build`) first"
        )
        raise NotVetted(msg)
    image = engine.image(item.image_id) if fleet else None
    refusal = image and fleet_refusal(record.report, image.labels, fleet)
    if refusal:
        msg = f"refusing to publish {item.source} for --gpu: {refusal}"
        raise NotVetted(msg)
    return record


@dataclass(frozen=True, kw_only=True)
class _Manifest:
    media_type: str
    size: int


def _held_manifest(
    client: RegistryClient, where: Target, item: Candidate, pushed: str
) -> tuple[str, _Manifest]:
    """The digest the registry holds under the immutable tag, once it is the push's and its
    config is the tested image's; with its manifest's media type and size."""
    held = client.manifest_digest(where.repository, where.immutable)
    if held != pushed:
        msg = f"{where.reference}: the registry holds {held}, but the push reported {pushed}; not published"
        raise EnvbuildError(msg)
    body, media_type, _ = client.manifest_raw(where.repository, held)
    try:
        manifest = json.loads(body)
    except ValueError:
        manifest = None
    if not isinstance(manifest, dict):
        raise client.malformed(where.reference, kind="manifest", why="it is not a JSON object")
    config = image_config_digest(client, manifest, where.reference)
    if config != item.image_id:
        msg = f"{where.reference}: the registry's image config is {config}, not the tested image {item.image_id}"
        raise EnvbuildError(msg)
    return held, _Manifest(media_type=media_type, size=len(body))


def _attach_evidence(
    engine: Engine,
    client: RegistryClient,
    repository: str,
    item: Candidate,
    record: SmokeRecord,
    subject: tuple[str, str, int],
) -> tuple[str, bytes]:
    """Attach the smoke report, the package list and the SBOM to the image; the evidence's
    digest and the SBOM."""
    held = subject[0]
    packages = engine.run(item.image_id, ["/bin/sh", "-c", PACKAGES_SCRIPT], timeout=120).stdout
    lock = engine.run(item.image_id, ["/bin/sh", "-c", LOCK_SCRIPT], timeout=60).stdout
    reference = f"{client.host}/{repository}@{held}"
    sbom = sbom_document(reference, item.image_id, [*lock_packages(lock), *dpkg_packages(packages)])
    evidence = attach_evidence(
        client, repository, *subject,
        {
            SMOKE_REPORT: (json.dumps(record.report, indent=2).encode(), "application/json"),
            PACKAGES: (packages.encode(), "text/plain"),
            SBOM: (sbom, SBOM_MEDIA_TYPE),
        },
    )  # fmt: skip
    return evidence, sbom


def _sign(
    engine: Engine,
    client: RegistryClient,
    subject: Subject,
    key: SigningKey,
    store: ResultStore,
    item: Candidate,
    report: dict[str, Any],
    sbom: bytes,
) -> list[Published]:
    """Sign the pushed digest and attest its smoke verdict, provenance and SBOM."""
    image = engine.image(item.image_id)
    labels = image.labels if image is not None else {}
    facts = attestations.build_facts(item.image_id, labels, store.provenance(item.image_id))
    predicates = {
        cosign.TEST_RESULT: attestations.test_result(
            report, payload_digest=str(report.get("payload_digest") or "") or None
        ),
        cosign.SLSA_PROVENANCE: attestations.provenance(facts),
        cosign.CYCLONEDX: json.loads(sbom),
    }
    signature, attested = sign_image(client, subject, key.private, predicates)
    where = subject.reference
    return [
        Published(reference=f"{where}:{cosign.signature_tag(subject.digest)}", digest=signature, kind="signature"),
        Published(reference=f"{where}:{cosign.attestation_tag(subject.digest)}", digest=attested, kind="attestations"),
    ]  # fmt: skip


def _refuse_overwrite(client: RegistryClient, where: Target, item: Candidate) -> None:
    """An immutable tag names one image forever: pushing another image under it is an error."""
    held = held_digest(client, where)
    if held is None:
        return
    manifest, _, _ = client.get_manifest(where.repository, held)
    config = image_config_digest(client, manifest, where.reference)
    if config != item.image_id:
        msg = (
            f"refusing to publish {item.source}: {where.reference} already names image "
            f"{config[:19]} ({held[:19]}), not {item.image_id[:19]}; an immutable tag is never "
            "overwritten (the same content was built again: publish the image the tag names, "
            "or delete the tag in the registry)"
        )
        raise EnvbuildError(msg)
