"""Evidence beside a published image (envbuild.publish.evidence) against a real HTTP registry in-process.

`Storage` is a small OCI registry that keeps what a client pushes (blobs, manifests, tags) and
serves it back through tests/support/hostile_registry.py's server: with `referrers=True` it answers the
referrers API and says so with OCI-Subject; without, that route is distribution 2.x's plain 404
and the artifact must be indexed under the referrers tag schema's fallback tag.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from envbuild.core.errors import EnvbuildError
from envbuild.core.places import StateError
from envbuild.publish.evidence import (
    PACKAGES,
    SMOKE_REPORT,
    _parse_time,
    attach_evidence,
    find_evidence,
    image_config_digest,
    referrers_tag,
    smoke_report,
)
from envbuild.registry import (
    CREATED_ANNOTATION,
    EVIDENCE_ARTIFACT_TYPE,
    OCI_INDEX,
    OCI_MANIFEST,
    EvidenceNotFound,
    RegistryClient,
    RegistryError,
    RegistryMalformed,
    sha256,
)
from tests.support.hostile_registry import (
    Answer,
    HostileRegistry,
    Seen,
    canonical,
    json_answer,
    oci_error,
)

REPOSITORY = "team/torch"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
SBOM_TYPE = "application/vnd.example.sbom.v1+json"
EPOCH = datetime.min.replace(tzinfo=UTC)


class Storage:
    """An OCI registry in memory, a handler for HostileRegistry: stores what is pushed."""

    def __init__(self, *, referrers: bool) -> None:
        self.referrers = referrers
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[tuple[str, str], tuple[bytes, str]] = {}  # (repo, ref) -> body, type
        self.rival: bytes | None = None  # what another publisher writes over a fallback tag
        self.rival_writes = 0  # ... right after each of our next N writes there
        self.tag_pause = 0.0  # seconds before answering a read of a fallback tag
        # The next N puts of an artifact manifest find its blobs gone, as a registry committing
        # another publisher's upload of the same blobs may answer.
        self.lose_blobs = 0
        self._uploads = itertools.count(1)
        self._lock = threading.Lock()

    def __call__(self, seen: Seen) -> Answer:
        with self._lock:
            return self._answer(seen)

    def _answer(self, seen: Seen) -> Answer:
        url = urlsplit(seen.path)
        if url.path == "/v2/":
            return json_answer(b"{}")
        upload = re.fullmatch(r"/v2/(.+)/blobs/uploads/(\d*)", url.path)
        if upload and seen.method == "POST":
            location = f"/v2/{upload[1]}/blobs/uploads/{next(self._uploads)}"
            return Answer(status=202, headers={"Location": location})
        if upload and seen.method == "PUT":
            digest = parse_qs(url.query)["digest"][0]
            if sha256(seen.body) != digest:
                return oci_error(400, "DIGEST_INVALID", "digest does not match")
            self.blobs[digest] = seen.body
            return Answer(status=201, headers={"Docker-Content-Digest": digest})
        route = re.fullmatch(r"/v2/(.+)/(manifests|blobs|referrers)/([^/]+)", url.path)
        if route is None:
            return oci_error(404, "NAME_UNKNOWN", "no such route")
        repository, kind, reference = route.groups()
        if kind == "blobs":
            blob = self.blobs.get(reference)
            if blob is None:
                return oci_error(404, "BLOB_UNKNOWN", "blob unknown")
            return Answer(headers={"Content-Type": "application/octet-stream"}, body=blob)
        if kind == "referrers":
            if not self.referrers:
                return Answer(status=404, headers={"Content-Type": "text/plain"}, body=b"404")
            return json_answer(self._referrers(repository, reference), OCI_INDEX)
        if seen.method == "PUT":
            return self._put_manifest(repository, reference, seen)
        stored = self.manifests.get((repository, reference))
        if stored is None:
            return oci_error(404, "MANIFEST_UNKNOWN", "manifest unknown")
        body, media_type = stored
        answer = json_answer(body, media_type, **{"Docker-Content-Digest": sha256(body)})
        if reference.startswith("sha256-"):
            answer.pause = self.tag_pause
        return answer

    def _put_manifest(self, repository: str, reference: str, seen: Seen) -> Answer:
        digest = sha256(seen.body)
        layers = json.loads(seen.body).get("layers") or []
        if self.lose_blobs > 0 and json.loads(seen.body).get("subject"):
            self.lose_blobs -= 1
            for layer in layers:
                self.blobs.pop(layer["digest"], None)
            return oci_error(400, "MANIFEST_BLOB_UNKNOWN", "blob unknown to registry")
        media_type = seen.headers.get("Content-Type", "")
        stored = seen.body
        if reference.startswith("sha256-") and self.rival is not None and self.rival_writes > 0:
            self.rival_writes -= 1
            stored = self.rival  # the rival's write lands right after ours
        self.manifests[(repository, reference)] = (stored, media_type)
        self.manifests[(repository, digest)] = (seen.body, media_type)
        headers = {"Docker-Content-Digest": digest}
        subject = json.loads(seen.body).get("subject")
        if self.referrers and isinstance(subject, dict):
            headers["OCI-Subject"] = subject["digest"]
        return Answer(status=201, headers=headers)

    def _referrers(self, repository: str, subject: str) -> bytes:
        manifests = []
        for (repo, reference), (body, media_type) in self.manifests.items():
            document = json.loads(body)
            if repo != repository or not reference.startswith("sha256:"):
                continue
            if (document.get("subject") or {}).get("digest") != subject:
                continue
            descriptor = {"mediaType": media_type, "digest": reference, "size": len(body)}
            if "artifactType" in document:
                descriptor["artifactType"] = document["artifactType"]
            if "annotations" in document:
                descriptor["annotations"] = document["annotations"]
            manifests.append(descriptor)
        return canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests})

    def document(self, reference: str) -> dict[str, Any]:
        """The parsed manifest or index stored at a tag or digest."""
        body, _ = self.manifests[(REPOSITORY, reference)]
        parsed: dict[str, Any] = json.loads(body)
        return parsed


@pytest.fixture(autouse=True)
def _data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVBUILD_DATA_DIR", str(tmp_path / "data"))  # the publishers' lock files
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture(params=[True, False], ids=["referrers-api", "fallback-tag"])
def storage(request: pytest.FixtureRequest) -> Storage:
    return Storage(referrers=request.param)


@pytest.fixture
def registry(storage: Storage) -> Iterator[HostileRegistry]:
    with HostileRegistry(storage) as server:
        yield server


@pytest.fixture
def client(registry: HostileRegistry) -> Iterator[RegistryClient]:
    with RegistryClient(registry.host, credentials=None, deadline=10) as made:
        yield made


@pytest.fixture
def fallback() -> Iterator[tuple[Storage, RegistryClient]]:
    """A registry without a referrers API, and a client of it."""
    storage = Storage(referrers=False)
    with (
        HostileRegistry(storage) as server,
        RegistryClient(server.host, credentials=None, deadline=10) as client,
    ):
        yield storage, client


def push_image(client: RegistryClient, name: str) -> tuple[str, int]:
    """A one-config image pushed under tag `name`: its manifest digest and size."""
    config = canonical({"architecture": "amd64", "os": "linux", "name": name})
    descriptor = client.push_blob(REPOSITORY, config, CONFIG_TYPE)
    manifest = canonical(
        {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": descriptor, "layers": []}
    )
    return client.push_manifest(REPOSITORY, name, manifest, OCI_MANIFEST), len(manifest)


def evidence_files(image_id: str, *, passed: bool = True) -> dict[str, tuple[bytes, str]]:
    report = canonical({"image_id": image_id, "passed": passed})
    return {
        SMOKE_REPORT: (report, "application/json"),
        PACKAGES: (b"torch==2.4.1\nnumpy==2.0.2\n", "text/plain"),
    }


def attach(
    client: RegistryClient,
    subject: tuple[str, int],
    files: dict[str, tuple[bytes, str]],
    artifact_type: str = EVIDENCE_ARTIFACT_TYPE,
) -> str:
    digest, size = subject
    return attach_evidence(client, REPOSITORY, digest, OCI_MANIFEST, size, files, artifact_type)


def plain(files: dict[str, tuple[bytes, str]]) -> dict[str, bytes]:
    return {name: data for name, (data, _) in files.items()}


def one_line(error: EnvbuildError) -> str:
    assert "\n" not in error.message
    return error.message


# -- attach, then find ------------------------------------------------------------------


def test_attached_evidence_is_found_for_the_image_digest(
    client: RegistryClient, storage: Storage
) -> None:
    image = push_image(client, "2.4")
    files = evidence_files("sha256:" + "a" * 64)

    artifact = attach(client, image, files)

    assert find_evidence(client, REPOSITORY, image[0]) == plain(files)
    stored = storage.document(artifact)
    assert stored["subject"] == {"mediaType": OCI_MANIFEST, "digest": image[0], "size": image[1]}
    assert stored["artifactType"] == EVIDENCE_ARTIFACT_TYPE
    titles = [layer["annotations"]["org.opencontainers.image.title"] for layer in stored["layers"]]
    assert sorted(titles) == [PACKAGES, SMOKE_REPORT]


def test_a_registry_with_a_referrers_api_gets_no_fallback_tag() -> None:
    storage = Storage(referrers=True)
    with (
        HostileRegistry(storage) as registry,
        RegistryClient(registry.host, credentials=None, deadline=10) as client,
    ):
        image = push_image(client, "2.4")
        attach(client, image, evidence_files("sha256:" + "a" * 64))
    assert (REPOSITORY, referrers_tag(image[0])) not in storage.manifests
    assert registry.requests_to(r"/manifests/sha256-") == []


def test_without_a_referrers_api_the_fallback_tag_indexes_the_artifact() -> None:
    storage = Storage(referrers=False)
    with (
        HostileRegistry(storage) as registry,
        RegistryClient(registry.host, credentials=None, deadline=10) as client,
    ):
        image = push_image(client, "2.4")
        artifact = attach(client, image, evidence_files("sha256:" + "a" * 64))
        before = len(registry.seen)
        files = find_evidence(client, REPOSITORY, image[0])

    index = storage.document(referrers_tag(image[0]))
    assert index["mediaType"] == OCI_INDEX
    assert [d["digest"] for d in index["manifests"]] == [artifact]
    assert index["manifests"][0]["artifactType"] == EVIDENCE_ARTIFACT_TYPE
    assert SMOKE_REPORT in files
    looked = [s.path.split("?")[0] for s in registry.seen[before:] if s.method == "GET"]
    assert looked[:2] == [
        f"/v2/{REPOSITORY}/referrers/{image[0]}",  # the API first: a plain 404
        f"/v2/{REPOSITORY}/manifests/{referrers_tag(image[0])}",
    ]


def test_the_newest_of_two_artifacts_wins(client: RegistryClient, storage: Storage) -> None:
    image = push_image(client, "2.4")
    first = attach(client, image, evidence_files("sha256:" + "1" * 64, passed=False))
    second = evidence_files("sha256:" + "2" * 64)
    attach(client, image, second)

    assert find_evidence(client, REPOSITORY, image[0]) == plain(second)
    if not storage.referrers:  # the fallback index keeps both, the older one first
        listed = [d["digest"] for d in storage.document(referrers_tag(image[0]))["manifests"]]
        assert len(listed) == 2
        assert listed[0] == first


def test_evidence_for_another_image_is_not_this_images(client: RegistryClient) -> None:
    ours, theirs = push_image(client, "ours"), push_image(client, "theirs")
    attach(client, theirs, evidence_files("sha256:" + "b" * 64))

    with pytest.raises(EvidenceNotFound) as caught:
        find_evidence(client, REPOSITORY, ours[0])
    message = one_line(caught.value)
    assert f"{client.host}/{REPOSITORY}@{ours[0]}" in message
    assert "envbuild publish" in message


def test_a_listed_artifact_whose_subject_is_another_image_is_ignored(
    fallback: tuple[Storage, RegistryClient],
) -> None:
    """A fallback index that lists another image's (newer) artifact: its subject decides."""
    storage, client = fallback
    ours, theirs = push_image(client, "ours"), push_image(client, "theirs")
    own = evidence_files("sha256:" + "a" * 64)
    attach(client, ours, own)
    foreign = attach(client, theirs, evidence_files("sha256:" + "b" * 64))
    tag = referrers_tag(ours[0])
    index = storage.document(tag)
    index["manifests"].append(storage.document(referrers_tag(theirs[0]))["manifests"][0])
    client.push_manifest(REPOSITORY, tag, index, OCI_INDEX)
    assert foreign in [d["digest"] for d in storage.document(tag)["manifests"]]

    assert find_evidence(client, REPOSITORY, ours[0]) == plain(own)


def test_an_artifact_of_another_type_is_not_evidence(client: RegistryClient) -> None:
    image = push_image(client, "2.4")
    sbom = {"sbom.json": (b'{"packages": []}', "application/json")}
    attach(client, image, sbom, artifact_type=SBOM_TYPE)

    with pytest.raises(EvidenceNotFound):
        find_evidence(client, REPOSITORY, image[0])
    assert find_evidence(client, REPOSITORY, image[0], artifact_type=SBOM_TYPE) == plain(sbom)


def test_attaching_nothing_is_a_programming_error(offline: RegistryClient) -> None:
    with pytest.raises(ValueError, match="at least one file"):
        attach(offline, ("sha256:" + "a" * 64, 100), {})


# -- the fallback tag: hand-written listings, rivals, locks ---------------------------------


def artifact_manifest(
    client: RegistryClient, subject: tuple[str, int], report: bytes, annotations: object
) -> tuple[str, dict[str, Any]]:
    """An evidence manifest pushed by digest with exactly these annotations; its descriptor."""
    layer = client.push_blob(REPOSITORY, report, "application/json")
    layer["annotations"] = {"org.opencontainers.image.title": SMOKE_REPORT}
    manifest = canonical(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "artifactType": EVIDENCE_ARTIFACT_TYPE,
            "config": client.push_blob(REPOSITORY, b"{}", "application/vnd.oci.empty.v1+json"),
            "layers": [layer],
            "subject": {"mediaType": OCI_MANIFEST, "digest": subject[0], "size": subject[1]},
            "annotations": annotations,
        }
    )
    digest = client.push_manifest(REPOSITORY, sha256(manifest), manifest, OCI_MANIFEST)
    descriptor = {
        "mediaType": OCI_MANIFEST,
        "digest": digest,
        "size": len(manifest),
        "artifactType": EVIDENCE_ARTIFACT_TYPE,
    }
    return digest, descriptor


def list_under_fallback(
    client: RegistryClient, subject: str, descriptors: list[dict[str, Any]]
) -> None:
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": descriptors}
    client.push_manifest(REPOSITORY, referrers_tag(subject), index, OCI_INDEX)


@pytest.mark.parametrize(
    "bad_time", [None, 7, "", "yesterday", "2026-13-01T00:00:00Z", "2026-01-01T25:00:00Z"]
)
def test_an_artifact_without_a_readable_time_loses_to_one_with_a_time(
    fallback: tuple[Storage, RegistryClient], bad_time: object
) -> None:
    _, client = fallback
    image = push_image(client, "2.4")
    dated = {CREATED_ANNOTATION: "2026-01-01T00:00:00Z"}
    undated = {} if bad_time is None else {CREATED_ANNOTATION: bad_time}
    good = canonical({"image_id": "sha256:" + "a" * 64, "passed": True})
    bad = canonical({"image_id": "sha256:" + "b" * 64, "passed": True})
    _, first = artifact_manifest(client, image, good, dated)
    _, last = artifact_manifest(client, image, bad, undated)
    list_under_fallback(client, image[0], [first, last])  # the undated one listed last

    assert find_evidence(client, REPOSITORY, image[0]) == {SMOKE_REPORT: good}


def test_of_two_undated_artifacts_the_one_listed_last_wins(
    fallback: tuple[Storage, RegistryClient],
) -> None:
    _, client = fallback
    image = push_image(client, "2.4")
    reports = [canonical({"image_id": "sha256:" + c * 64, "passed": True}) for c in "ab"]
    listed = [artifact_manifest(client, image, r, {})[1] for r in reports]
    list_under_fallback(client, image[0], listed)

    assert find_evidence(client, REPOSITORY, image[0]) == {SMOKE_REPORT: reports[1]}


def test_evidence_annotations_that_are_not_an_object_are_malformed(
    fallback: tuple[Storage, RegistryClient],
) -> None:
    _, client = fallback
    image = push_image(client, "2.4")
    report = canonical({"image_id": "sha256:" + "a" * 64, "passed": True})
    _, descriptor = artifact_manifest(client, image, report, ["created", "yesterday"])
    list_under_fallback(client, image[0], [descriptor])

    with pytest.raises(RegistryMalformed, match="annotations is not an object") as caught:
        find_evidence(client, REPOSITORY, image[0])
    one_line(caught.value)


def test_a_fallback_tag_that_is_not_an_index_is_refused(
    fallback: tuple[Storage, RegistryClient],
) -> None:
    _, client = fallback
    image = push_image(client, "2.4")
    squatter = canonical({"schemaVersion": 2, "mediaType": OCI_MANIFEST, "layers": []})
    client.push_manifest(REPOSITORY, referrers_tag(image[0]), squatter, OCI_MANIFEST)

    for attempt in (
        lambda: find_evidence(client, REPOSITORY, image[0]),
        lambda: attach(client, image, evidence_files("sha256:" + "a" * 64)),
    ):
        with pytest.raises(RegistryError) as caught:
            attempt()
        message = one_line(caught.value)
        assert f"{REPOSITORY}:{referrers_tag(image[0])}" in message
        assert "delete that tag" in message


def rival_index(client: RegistryClient, image: tuple[str, int]) -> tuple[str, bytes]:
    """Another publisher's artifact for the image, and the index it writes (its own only)."""
    report = canonical({"image_id": "sha256:" + "c" * 64, "passed": True})
    digest, descriptor = artifact_manifest(
        client, image, report, {CREATED_ANNOTATION: "2020-01-01T00:00:00Z"}
    )
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [descriptor]}
    return digest, canonical(index)


def test_a_rival_write_over_the_fallback_index_is_merged_again(
    fallback: tuple[Storage, RegistryClient],
) -> None:
    storage, client = fallback
    image = push_image(client, "2.4")
    rival, storage.rival = rival_index(client, image)
    storage.rival_writes = 1

    ours = attach(client, image, evidence_files("sha256:" + "a" * 64))

    listed = {d["digest"] for d in storage.document(referrers_tag(image[0]))["manifests"]}
    assert listed == {rival, ours}


def test_a_rival_that_keeps_replacing_the_fallback_index_ends_in_one_error(
    fallback: tuple[Storage, RegistryClient],
) -> None:
    storage, client = fallback
    image = push_image(client, "2.4")
    _, storage.rival = rival_index(client, image)
    storage.rival_writes = 1000

    with pytest.raises(RegistryError) as caught:
        attach(client, image, evidence_files("sha256:" + "a" * 64))
    message = one_line(caught.value)
    assert "another publisher kept replacing the referrers fallback index" in message
    assert referrers_tag(image[0]) in message


def test_publishers_on_one_host_keep_each_others_artifacts() -> None:
    """Slow reads of the fallback index widen the read-merge-write race; the host lock orders
    the publishers, so none needs the read-back's retries, and none loses its artifact."""
    storage = Storage(referrers=False)
    storage.tag_pause = 0.01
    with HostileRegistry(storage) as server:
        with RegistryClient(server.host, credentials=None, deadline=10) as client:
            image = push_image(client, "2.4")
        pushed: list[str] = []
        failures: list[BaseException] = []

        def publish(seed: str) -> None:
            try:
                with RegistryClient(server.host, credentials=None, deadline=10) as own:
                    pushed.append(attach(own, image, evidence_files("sha256:" + seed * 64)))
            except BaseException as exc:  # reported below, with the thread's failure
                failures.append(exc)

        threads = [threading.Thread(target=publish, args=(seed,)) for seed in "123456"]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)  # a hang guard
    assert failures == []
    listed = [d["digest"] for d in storage.document(referrers_tag(image[0]))["manifests"]]
    assert sorted(listed) == sorted(pushed)
    assert len(pushed) == 6


def test_a_data_dir_that_cannot_hold_the_lock_is_one_state_error(
    fallback: tuple[Storage, RegistryClient], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, client = fallback
    image = push_image(client, "2.4")
    occupied = tmp_path / "occupied"
    occupied.write_text("a file where the data directory should be\n")
    monkeypatch.setenv("ENVBUILD_DATA_DIR", str(occupied))

    with pytest.raises(StateError) as caught:
        attach(client, image, evidence_files("sha256:" + "a" * 64))
    message = one_line(caught.value)
    assert str(occupied / "locks") in message
    assert "ENVBUILD_DATA_DIR" in message


# -- the shapes of what was found: image manifests and smoke reports -------------------------

CONFIG = {"mediaType": CONFIG_TYPE, "digest": "sha256:" + "f" * 64, "size": 120}
LAYER = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": CONFIG["digest"]}
WHAT = "127.0.0.1:9/team/torch:2.4"


@pytest.fixture
def offline() -> RegistryClient:
    """A client whose registry is never contacted (port 9 refuses): shape checks only."""
    return RegistryClient("127.0.0.1:9", credentials=None, deadline=1)


def image_manifest(**changes: Any) -> dict[str, Any]:
    manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST, "config": CONFIG, "layers": [LAYER]}
    manifest.update(changes)
    return {k: v for k, v in manifest.items() if v is not None}


def test_the_image_id_is_the_config_digest(offline: RegistryClient) -> None:
    assert image_config_digest(offline, image_manifest(), WHAT) == CONFIG["digest"]
    assert image_config_digest(offline, image_manifest(layers=None), WHAT) == CONFIG["digest"]


MALFORMED_MANIFESTS: dict[str, tuple[dict[str, Any], str]] = {
    "an-index": (
        {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []},
        "is an image index, not one image",
    ),
    **{
        f"config-{name}": (image_manifest(config=value), "config is not an object")
        for name, value in {"missing": None, "string": "sha256:x", "list": [CONFIG]}.items()
    },
    **{
        f"config-{field}-{name}": (image_manifest(config={**CONFIG, field: value}), why)
        for field, why, values in (
            ("digest", "digest is not a digest", {"junk": "junk", "int": 7, "empty": ""}),
            ("size", "size is not a byte count", {"negative": -1, "string": "12", "bool": True}),
            ("mediaType", "mediaType is not a string", {"int": 3}),
        )
        for name, value in values.items()
    },
    "layers-object": (image_manifest(layers={"a": LAYER}), "layers is not a list"),
    "layer-string": (image_manifest(layers=["sha256:" + "f" * 64]), "not a JSON object"),
    "layer-without-digest": (image_manifest(layers=[{"size": 1}]), "digest is not a digest"),
}


@pytest.mark.parametrize(
    ("manifest", "why"), MALFORMED_MANIFESTS.values(), ids=MALFORMED_MANIFESTS.keys()
)
def test_a_malformed_image_manifest_is_one_registry_error(
    offline: RegistryClient, manifest: dict[str, Any], why: str
) -> None:
    with pytest.raises(RegistryError) as caught:
        image_config_digest(offline, manifest, WHAT)
    message = one_line(caught.value)
    assert WHAT in message
    assert why in message


IMAGE_ID = "sha256:" + "e" * 64


def report_of(**fields: object) -> bytes:
    return canonical({"image_id": IMAGE_ID, "passed": True, **fields})


def test_a_smoke_report_is_read_as_it_was_written(offline: RegistryClient) -> None:
    for passed in (True, False):
        files = {SMOKE_REPORT: report_of(passed=passed, train={"loss_fell": True})}
        report = smoke_report(offline, files, WHAT)
        assert report == {"image_id": IMAGE_ID, "passed": passed, "train": {"loss_fell": True}}


def malformed_reports() -> Iterator[tuple[str, dict[str, bytes], str]]:
    yield "missing", {PACKAGES: b"torch==2.4.1\n"}, f"it holds no {SMOKE_REPORT}"
    for name, data in {"latin-1": "é".encode("latin-1"), "utf-16": "{}".encode("utf-16")}.items():
        yield f"not-utf8-{name}", {SMOKE_REPORT: data}, "not UTF-8"
    for name, text in {
        "empty": "", "text": "passed", "list": "[]", "string": '"{}"', "truncated": '{"a": ',
        "deep": "[" * 100_000, "null": "null",
    }.items():  # fmt: skip
        yield f"not-an-object-{name}", {SMOKE_REPORT: text.encode()}, "not a JSON object"
    for name, value in {"absent": None, "int": 7, "short": "sha256:abc", "tag": "latest"}.items():
        body = report_of(image_id=value) if value is not None else canonical({"passed": True})
        yield f"image-id-{name}", {SMOKE_REPORT: body}, "it names no image id"
    not_bools: dict[str, object] = {"string": "true", "int": 1, "null": None, "list": [True]}
    for name, flag in not_bools.items():
        yield f"passed-{name}", {SMOKE_REPORT: report_of(passed=flag)}, "'passed' is not true"
    yield "passed-absent", {SMOKE_REPORT: canonical({"image_id": IMAGE_ID})}, "'passed' is not"


MALFORMED_REPORTS = list(malformed_reports())


@pytest.mark.parametrize(
    ("files", "why"),
    [case[1:] for case in MALFORMED_REPORTS],
    ids=[case[0] for case in MALFORMED_REPORTS],
)
def test_a_malformed_smoke_report_is_one_registry_error(
    offline: RegistryClient, files: dict[str, bytes], why: str
) -> None:
    with pytest.raises(RegistryMalformed) as caught:
        smoke_report(offline, files, WHAT)
    message = one_line(caught.value)
    assert WHAT in message
    assert why in message


# -- small rules -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [None, 0, 1.5, [], {}, "", "now", "2026-02-30T00:00:00Z", "2026-01-01T24:61:00Z", "\x00"],
)
def test_an_unreadable_time_sorts_before_every_real_one(text: object) -> None:
    assert _parse_time(text) == EPOCH
    assert _parse_time(text) < _parse_time("1970-01-01T00:00:00Z")


def test_times_are_compared_as_instants() -> None:
    assert _parse_time("2026-01-01T00:00:00Z") == datetime(2026, 1, 1, tzinfo=UTC)
    assert _parse_time("2026-01-01T00:00:00") == datetime(2026, 1, 1, tzinfo=UTC)  # naive: UTC
    assert _parse_time("2026-01-01T01:00:00+02:00") < _parse_time("2026-01-01T00:00:00Z")
    assert _parse_time("2026-01-01T00:00:00.000002Z") > _parse_time("2026-01-01T00:00:00.000001Z")


@pytest.mark.parametrize(
    ("digest", "tag"),
    [
        ("sha256:" + "ab" * 32, "sha256-" + "ab" * 32),
        ("sha512:" + "c" * 128, "sha512-" + "c" * 64),
        ("sha256:../../x?y", "sha256-..-..-x-y"),
        ("a" * 40 + ":b", "a" * 32 + "-b"),
    ],
)
def test_the_fallback_tag_is_a_valid_tag_for_any_digest(digest: str, tag: str) -> None:
    assert referrers_tag(digest) == tag
    assert re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", referrers_tag(digest))


def test_hostile_registry_records_what_a_client_uploads() -> None:
    """The storing handler above relies on the server passing request bodies through."""
    bodies: list[bytes] = []

    def keep(seen: Seen) -> Answer:
        bodies.append(seen.body)
        return Answer(status=201)

    with HostileRegistry(keep) as server, RegistryClient(server.host, credentials=None) as client:
        client.push_manifest(REPOSITORY, "t", b'{"schemaVersion":2}', OCI_MANIFEST)
    assert bodies == [b'{"schemaVersion":2}']


def test_a_blob_the_registry_briefly_lost_is_uploaded_again(
    client: RegistryClient, storage: Storage, registry: HostileRegistry
) -> None:
    image = push_image(client, "2.4")
    files = evidence_files("sha256:" + "a" * 64)
    storage.lose_blobs = 1
    artifact = attach(client, image, files)
    assert find_evidence(client, REPOSITORY, image[0]) == plain(files)
    assert storage.document(artifact)["subject"]["digest"] == image[0]
    assert len(registry.requests_to(r"/manifests/sha256:")) >= 2  # put again after the upload


def test_a_blob_the_registry_keeps_losing_fails_in_one_line(
    client: RegistryClient, storage: Storage
) -> None:
    image = push_image(client, "2.4")
    storage.lose_blobs = 10
    with pytest.raises(RegistryError) as failed:
        attach(client, image, evidence_files("sha256:" + "a" * 64))
    assert "MANIFEST_BLOB_UNKNOWN" in one_line(failed.value)
