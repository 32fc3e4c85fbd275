"""Evidence beside a published image: an OCI artifact (smoke report, package list) whose subject
is the image's manifest digest, found through the referrers API or its tag-schema fallback.

What a registry returns is checked for shape before it is used, and reading is bounded: the
newest MAX_CANDIDATES artifacts at most, MAX_FILES files of BLOB_LIMIT bytes in all.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import logging
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from envbuild.core.places import StateError, data_dir
from envbuild.net.bounded import BLOB_LIMIT, printable
from envbuild.registry import (
    CREATED_ANNOTATION,
    EMPTY_CONFIG,
    EVIDENCE_ARTIFACT_TYPE,
    OCI_EMPTY,
    OCI_INDEX,
    OCI_MANIFEST,
    TITLE_ANNOTATION,
    EvidenceNotFound,
    RegistryClient,
    RegistryError,
    RegistryNotFound,
    RegistryRejected,
    is_digest,
    json_or_none,
    manifest_bytes,
    sha256,
)

log = logging.getLogger(__name__)

_MERGE_TRIES = 3
# Puts of an evidence manifest whose blob the registry has briefly lost (concurrent uploads).
_BLOB_TRIES = 3

SMOKE_REPORT = "smoke-report.json"
PACKAGES = "packages.txt"
MAX_CANDIDATES = 32  # evidence manifests read to find the newest, newest-listed first
MAX_FILES = 16  # files in one evidence artifact (envbuild writes two)


def referrers_tag(digest: str) -> str:
    """The referrers tag schema's fallback tag for a subject digest: `sha256-<hex>`."""
    algorithm, _, encoded = digest.partition(":")
    tag = f"{algorithm[:32]}-{encoded[:64]}"
    return re.sub(r"[^A-Za-z0-9_.-]", "-", tag)


def attach_evidence(
    client: RegistryClient,
    repository: str,
    subject_digest: str,
    subject_media_type: str,
    subject_size: int,
    files: Mapping[str, tuple[bytes, str]],
    artifact_type: str = EVIDENCE_ARTIFACT_TYPE,
) -> str:
    """Push `files` as an OCI artifact whose subject is the image; returns its manifest digest."""
    if not files:
        msg = "attach_evidence needs at least one file"
        raise ValueError(msg)
    with client.operation():
        subject = (subject_digest, subject_media_type, subject_size)
        return _attach(client, repository, subject, files, artifact_type)


def _attach(
    client: RegistryClient,
    repository: str,
    subject: tuple[str, str, int],  # digest, media type, size
    files: Mapping[str, tuple[bytes, str]],
    artifact_type: str,
) -> str:
    subject_digest, subject_media_type, subject_size = subject

    def push_blobs() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        layers = []
        for name, (data, media_type) in sorted(files.items()):
            descriptor = client.push_blob(repository, data, media_type)
            layers.append({**descriptor, "annotations": {TITLE_ANNOTATION: name}})
        config = {
            **client.push_blob(repository, EMPTY_CONFIG, OCI_EMPTY),
            "data": base64.b64encode(EMPTY_CONFIG).decode("ascii"),
        }
        return layers, config

    layers, config = push_blobs()
    annotations = {CREATED_ANNOTATION: _now_rfc3339()}
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": artifact_type,
        "config": config,
        "layers": layers,
        "subject": {
            "mediaType": subject_media_type,
            "digest": subject_digest,
            "size": subject_size,
        },
        "annotations": annotations,
    }
    body = manifest_bytes(manifest)
    for attempt in range(1, _BLOB_TRIES + 1):
        try:
            digest, response = client.put_manifest(repository, sha256(body), body, OCI_MANIFEST)
            break
        except RegistryRejected as exc:
            # Two publishers of the same evidence upload the same blobs at once, and a registry
            # may briefly not know a blob the other's upload is committing: upload what it lacks
            # again, then put the manifest again.
            if "MANIFEST_BLOB_UNKNOWN" not in exc.codes or attempt == _BLOB_TRIES:
                raise
            log.info("%s lacked a blob of the evidence manifest; uploading again", client.host)
            time.sleep(0.5 * attempt)
            push_blobs()
    if response.headers.get("OCI-Subject") == subject_digest:
        log.info("%s indexes referrers itself; no fallback tag needed", client.host)
        return digest
    descriptor = {
        "mediaType": OCI_MANIFEST,
        "digest": digest,
        "size": len(body),
        "artifactType": artifact_type,
        "annotations": annotations,
    }
    _add_to_referrers_tag(client, repository, subject_digest, descriptor)
    return digest


def _add_to_referrers_tag(
    client: RegistryClient, repository: str, subject_digest: str, descriptor: dict[str, Any]
) -> None:
    """Merge `descriptor` into the image index at the referrers fallback tag (spec §3.2)."""
    tag = referrers_tag(subject_digest)
    # Read, merge, write is a race between publishers of the same image: on this host a lock
    # orders them; across hosts, the read-back below catches a write that replaced ours.
    with host_lock(f"{client.host}/{repository}:{tag}"):
        for _ in range(_MERGE_TRIES):
            existing = _fallback_index(client, repository, subject_digest) or []
            manifests = [
                *(d for d in existing if d.get("digest") != descriptor["digest"]),
                descriptor,
            ]
            index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
            client.push_manifest(repository, tag, index, OCI_INDEX)
            after = _fallback_index(client, repository, subject_digest) or []
            if {str(d.get("digest")) for d in manifests} <= {str(d.get("digest")) for d in after}:
                return
            log.info("%s:%s changed while it was updated; merging again", repository, tag)
    msg = (
        f"{client.host}/{repository}:{tag}: another publisher kept replacing the referrers "
        "fallback index; publish again when it is done"
    )
    raise RegistryError(msg)


@contextmanager
def host_lock(name: str) -> Iterator[None]:
    """An exclusive lock among envbuild processes of this host, named by `name`."""
    locks = data_dir() / "locks"
    try:
        locks.mkdir(parents=True, exist_ok=True)
        handle = (locks / (hashlib.sha256(name.encode()).hexdigest()[:32] + ".lock")).open("a")
    except OSError as exc:
        msg = f"cannot create a lock file under {locks}: {exc.strerror}; point ENVBUILD_DATA_DIR at a writable directory"
        raise StateError(msg) from None
    with handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fallback_index(
    client: RegistryClient, repository: str, subject_digest: str
) -> list[dict[str, Any]] | None:
    tag = referrers_tag(subject_digest)
    try:
        index, media_type, _ = client.get_manifest(repository, tag)
    except RegistryNotFound:
        return None
    what = f"{client.host}/{repository}:{tag}"
    if media_type != OCI_INDEX or not isinstance(index.get("manifests"), list):
        msg = (
            f"{what} is the referrers fallback tag of {subject_digest} but holds a "
            f"{printable(media_type or 'non-index', 80)} manifest; delete that tag"
        )
        raise RegistryError(msg)
    return [client.descriptor(d, what, kind="referrers index") for d in index["manifests"]]


def find_evidence(
    client: RegistryClient,
    repository: str,
    subject_digest: str,
    *,
    artifact_type: str = EVIDENCE_ARTIFACT_TYPE,
) -> dict[str, bytes]:
    """The files of the newest evidence artifact attached to the image, by title."""
    with client.operation():
        descriptors = client.referrers(repository, subject_digest, artifact_type)
        where = "the referrers API"
        if descriptors is None:
            where = f"the referrers tag {referrers_tag(subject_digest)}"
            descriptors = _fallback_index(client, repository, subject_digest) or []
        newest = _newest_artifact(client, repository, subject_digest, descriptors, artifact_type)
        if newest is None:
            msg = (
                f"no envbuild evidence is attached to {client.host}/{repository}@{subject_digest} "
                f"(looked in {where}); publish the image with `envbuild publish` to attach it"
            )
            raise EvidenceNotFound(msg)
        return _artifact_files(client, repository, *newest)


def _newest_artifact(
    client: RegistryClient,
    repository: str,
    subject_digest: str,
    descriptors: list[dict[str, Any]],
    artifact_type: str,
) -> tuple[dict[str, Any], str] | None:
    """The newest artifact manifest (and its digest) of `artifact_type` about the subject.

    Only the MAX_CANDIDATES newest by the listing's own annotations are read; among those the
    manifest's creation time decides, then the position in the listing.
    """
    listed = [
        (_parse_time(d.get("annotations", {}).get(CREATED_ANNOTATION)), position, d["digest"])
        for position, d in enumerate(descriptors)
        if d.get("artifactType") == artifact_type
    ]
    candidates: list[tuple[datetime, int, dict[str, Any], str]] = []
    for _, position, digest in sorted(listed, reverse=True)[:MAX_CANDIDATES]:
        manifest, _, _ = client.get_manifest(repository, digest)
        subject = manifest.get("subject")
        if manifest.get("artifactType", artifact_type) != artifact_type or not (
            isinstance(subject, dict) and subject.get("digest") == subject_digest
        ):
            continue
        annotations = manifest.get("annotations") or {}
        if not isinstance(annotations, dict):
            what = f"{client.host}/{repository}@{digest}"
            raise client.malformed(
                what, kind="evidence manifest", why="annotations is not an object"
            )
        candidates.append(
            (_parse_time(annotations.get(CREATED_ANNOTATION)), position, manifest, digest)
        )
    if not candidates:
        return None
    _, _, manifest, digest = max(candidates, key=lambda item: (item[0], item[1]))
    return manifest, digest


def _artifact_files(
    client: RegistryClient, repository: str, manifest: dict[str, Any], digest: str
) -> dict[str, bytes]:
    """An artifact's files by title, each read up to its declared size, BLOB_LIMIT in all."""
    what = f"{client.host}/{repository}@{digest}"
    layers = manifest.get("layers") or []
    if not isinstance(layers, list):
        raise client.malformed(what, kind="evidence manifest", why="layers is not a list")
    if len(layers) > MAX_FILES:
        raise client.malformed(what, kind="evidence manifest", why=f"more than {MAX_FILES} files")
    budget = BLOB_LIMIT
    files: dict[str, bytes] = {}
    for item in layers:
        layer = client.descriptor(item, what, kind="evidence manifest")
        size = layer.get("size")
        if size is None:
            raise client.malformed(what, kind="evidence manifest", why="a layer has no size")
        if size > budget:
            msg = (
                f"evidence {what} holds more than {BLOB_LIMIT // (1024 * 1024)} MiB of files; "
                "envbuild reads no more: the registry is broken or hostile"
            )
            raise RegistryError(msg)
        data = client.get_blob(repository, layer["digest"], limit=size)
        budget -= len(data)
        title = layer.get("annotations", {}).get(TITLE_ANNOTATION) or layer["digest"]
        files[title] = data
    return files


def image_config_digest(client: RegistryClient, manifest: dict[str, Any], what: str) -> str:
    """The image id (config digest) an image manifest names, its shape checked."""
    config = manifest.get("config")
    if config is None and "manifests" in manifest:
        msg = (
            f"{what} is an image index, not one image; verify one of its images by its "
            "reference with @sha256:..."
        )
        raise RegistryError(msg)
    if not isinstance(config, dict):
        raise client.malformed(what, kind="manifest", why="config is not an object")
    config = client.descriptor(config, what, kind="manifest")
    layers = manifest.get("layers", [])
    if not isinstance(layers, list):
        raise client.malformed(what, kind="manifest", why="layers is not a list")
    for layer in layers:
        client.descriptor(layer, what, kind="manifest")
    return str(config["digest"])


def smoke_report(client: RegistryClient, files: Mapping[str, bytes], what: str) -> dict[str, Any]:
    """The smoke report of an evidence artifact: a JSON object naming the image and the verdict."""
    data = files.get(SMOKE_REPORT)
    if data is None:
        raise client.malformed(what, kind="evidence", why=f"it holds no {SMOKE_REPORT}")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise client.malformed(what, kind="smoke report", why="not UTF-8") from None
    report = json_or_none(text)
    if not isinstance(report, dict):
        raise client.malformed(what, kind="smoke report", why="not a JSON object")
    image_id = report.get("image_id")
    if not isinstance(image_id, str) or not is_digest(image_id):
        raise client.malformed(what, kind="smoke report", why="it names no image id")
    if not isinstance(report.get("passed"), bool):
        raise client.malformed(what, kind="smoke report", why="'passed' is not true or false")
    why = report_shape_problem(report)
    if why is not None:
        raise client.malformed(what, kind="smoke report", why=why)
    return report


# The types of a smoke report's sections as SmokeResult.as_dict writes them. A section may be
# absent (an older payload, a framework without it), never of another type: readers index them.
_SECTIONS: dict[str, type | tuple[type, ...]] = {
    **dict.fromkeys(
        ("versions", "train", "allreduce", "compile", "loader", "checkpoint", "numpy",
         "packages", "cuda_static"),
        dict,
    ),
    **dict.fromkeys(("devices", "errors", "checks"), list),
    **dict.fromkeys(("image", "payload", "run_with"), str),
    **dict.fromkeys(("ok", "cuda_needs_gpu"), bool),
    "payload_version": int,
    "exit_code": (int, type(None)),
    "seconds": (int, float),
}  # fmt: skip
_CHECK_FIELDS = {"name": str, "passed": bool, "detail": str}
_KIND_NAMES: dict[type | tuple[type, ...], str] = {
    dict: "an object", list: "a list", str: "a string", bool: "true or false",
    int: "an integer", (int, type(None)): "an integer or null", (int, float): "a number",
}  # fmt: skip


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    """isinstance, except that JSON's true and false are no numbers."""
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def _json_kind(value: Any) -> str:
    """What a JSON value is, in the words of a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true or false"
    for kind, name in _KIND_NAMES.items():
        if isinstance(kind, type) and isinstance(value, kind):
            return name
    return "a number"


def report_shape_problem(report: dict[str, Any]) -> str | None:
    """What is wrong with the shape of a smoke report's sections, or None: each known section
    of its type, the host's checks each {name, passed, detail}, versions strings or null, the
    errors strings, the devices objects."""
    for key, kind in _SECTIONS.items():
        if key in report and not _is(report[key], kind):
            return f"its {key!r} is {_json_kind(report[key])}, not {_KIND_NAMES[kind]}"
    for i, check in enumerate(report.get("checks") or []):
        if not isinstance(check, dict) or any(
            not _is(check.get(field), kind) for field, kind in _CHECK_FIELDS.items()
        ):
            return f"its checks[{i}] is not an object of name, passed and detail"
    for name, version in (report.get("versions") or {}).items():
        if version is not None and not isinstance(version, str):
            return f"its versions.{printable(name, 40)} is {_json_kind(version)}, not a string"
    if not all(isinstance(e, str) for e in report.get("errors") or []):
        return "its errors are not all strings"
    if not all(isinstance(d, dict) for d in report.get("devices") or []):
        return "its devices are not all objects"
    return None


def _now_rfc3339() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _parse_time(text: object) -> datetime:
    if isinstance(text, str):
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            pass
        else:
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
    return datetime.min.replace(tzinfo=UTC)
