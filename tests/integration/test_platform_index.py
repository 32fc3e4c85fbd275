"""One tag for several platforms, against a real registry (Debian's docker-registry).

Each platform's image is a tiny image pushed under the immutable tag envbuild gives an entry's
image; the index over them is published, read back, moved to by the moving tags, made again
byte for byte, refused over another index, and never made with a platform missing or failed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric import ec

from envbuild.cli.main import main
from envbuild.core.errors import EnvbuildError
from envbuild.core.models import Entry, Knowledge, Selection
from envbuild.core.platforms import AMD64, ARM64
from envbuild.plan.matrix import knowledge_matrix, make_plan
from envbuild.plan.matrix_file import default_matrix_path, load_matrix
from envbuild.publish.cosign import SLSA_PROVENANCE, TEST_RESULT
from envbuild.publish.keys import SigningKey
from envbuild.publish.platform_index import IndexPublished
from envbuild.publish.push import publish_platform_indexes
from envbuild.publish.signing import SignatureError, Subject, verify_image
from envbuild.publish.verify import entry_target
from envbuild.registry import DOCKER_MANIFEST_LIST, OCI_INDEX, RegistryClient
from envbuild.registry.errors import RegistryNotFound
from tests.support.registry_server import RegistryServer, push_image

HASHES = {AMD64: "a" * 64, ARM64: "b" * 64}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    with RegistryServer(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker-config"))


def both_platforms(knowledge: Knowledge) -> list[Entry]:
    chosen = Selection(framework="jax", cuda="cpu", platform=f"{AMD64},{ARM64}")
    matrix = knowledge_matrix(knowledge, chosen, load_matrix(default_matrix_path(), knowledge))
    entries = make_plan(knowledge, matrix, chosen).entries
    newest = entries[-1].framework_version
    picked = [e for e in entries if e.framework_version == newest]
    assert sorted(e.platform for e in picked) == [AMD64, ARM64]
    return picked


def push_children(server: RegistryServer, registry: str, entries: list[Entry]) -> dict[str, str]:
    """Each entry's (tiny) image under its immutable tag; the digests by platform."""
    digests = {}
    with RegistryClient.for_host(server.host) as client:
        for entry in entries:
            where = entry_target(registry, entry.image, HASHES[entry.platform])
            digests[entry.platform], _ = push_image(client, where.repository, where.immutable)
    return digests


def test_an_index_names_each_platforms_image_and_the_moving_tags_follow(
    server: RegistryServer, knowledge: Knowledge
) -> None:
    registry = f"{server.host}/team"
    entries = both_platforms(knowledge)
    digests = push_children(server, registry, entries)
    shown: list[IndexPublished] = []

    (index,) = publish_platform_indexes(
        registry, [(e, HASHES[e.platform]) for e in entries], on_published=shown.append
    )

    assert shown == [index]
    assert index.reference.startswith(f"{registry}/jax:{entries[0].image.rsplit(':', 1)[1]}-")
    assert "-arm64" not in index.reference
    series = f"jax{entries[0].framework_version.rsplit('.', 1)[0]}-cpu-py3.11"
    assert index.tags == (entries[0].image.rsplit(":", 1)[1], series, "latest")
    with RegistryClient.for_host(server.host) as client:
        body, media_type, digest = client.manifest_raw(
            "team/jax", index.reference.rsplit(":", 1)[1]
        )
        assert (digest, media_type) == (index.digest, OCI_INDEX)  # the children are OCI images
        document = json.loads(body)
        assert [(m["digest"], m["platform"]) for m in document["manifests"]] == [
            (digests[AMD64], {"architecture": "amd64", "os": "linux"}),
            (digests[ARM64], {"architecture": "arm64", "os": "linux", "variant": "v8"}),
        ]
        for tag in index.tags:
            assert client.manifest_digest("team/jax", tag) == index.digest

    # The same children give the same tag and bytes: a second run changes nothing.
    (again,) = publish_platform_indexes(
        registry, [(e, HASHES[e.platform]) for e in entries], on_published=lambda index: None
    )
    assert again == index


def test_an_immutable_index_tag_is_never_overwritten(
    server: RegistryServer, knowledge: Knowledge
) -> None:
    registry = f"{server.host}/other"
    entries = both_platforms(knowledge)
    push_children(server, registry, entries)
    members = [(e, HASHES[e.platform]) for e in entries]
    (index,) = publish_platform_indexes(registry, members, on_published=lambda index: None)
    repository, tag = index.reference.split("/", 1)[1].rsplit(":", 1)
    with RegistryClient.for_host(server.host) as client:  # someone else's index under the tag
        other = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST_LIST, "manifests": []})
        client.put_manifest(repository, tag, other.encode(), DOCKER_MANIFEST_LIST)

    with pytest.raises(EnvbuildError, match="an immutable tag is never overwritten"):
        publish_platform_indexes(registry, members, on_published=lambda index: None)


def test_a_missing_or_failed_platform_blocks_the_index(
    server: RegistryServer, knowledge: Knowledge
) -> None:
    registry = f"{server.host}/holes"
    entries = both_platforms(knowledge)
    amd64 = next(e for e in entries if e.platform == AMD64)
    push_children(server, registry, [amd64])  # the arm64 image never reached the registry

    with pytest.raises(EnvbuildError) as missing:
        publish_platform_indexes(
            registry, [(e, HASHES[e.platform]) for e in entries], on_published=lambda index: None
        )
    assert "the registry has no linux/arm64 image" in missing.value.message

    failed = [(e, None if e.platform == ARM64 else HASHES[e.platform]) for e in entries]
    with pytest.raises(EnvbuildError) as refused:
        publish_platform_indexes(registry, failed, on_published=lambda index: None)
    assert "its linux/arm64 image" in refused.value.message
    assert "failed or was not published; each platform's image must pass" in refused.value.message
    with RegistryClient.for_host(server.host) as client, pytest.raises(RegistryNotFound):
        client.manifest_digest("holes/jax", "latest")  # no tag moved to a partial index


def report(path: Path, *results: dict[str, object]) -> Path:
    path.write_text(json.dumps({"results": list(results)}))
    return path


def test_ci_jobs_reports_are_merged_under_one_tag(
    server: RegistryServer, knowledge: Knowledge, tmp_path: Path
) -> None:
    # Two build jobs, one per platform, each pushed its image and wrote its --report.
    registry = f"{server.host}/merged"
    entries = both_platforms(knowledge)
    digests = push_children(server, registry, entries)
    reports = []
    for entry in entries:
        where = entry_target(registry, entry.image, HASHES[entry.platform])
        reports += ["--merge", str(report(
            tmp_path / f"{entry.platform.replace('/', '-')}.json",
            {"entry": {"id": entry.id}, "passed": True, "published": None,
             "pushed": f"{where.reference}@{digests[entry.platform]}"},
        ))]  # fmt: skip
    selectors = ["--framework", "jax", "--cuda", "cpu", "--platform", f"{AMD64},{ARM64}"]

    merged = CliRunner().invoke(main, ["publish", "--registry", registry, *selectors, *reports])

    assert merged.exit_code == 0, merged.output
    (line,) = [x for x in merged.stdout.splitlines() if x.split()[:1] == ["index"]]
    assert line.endswith("(linux/amd64, linux/arm64)")
    tag = entries[0].image.rsplit(":", 1)[1]
    with RegistryClient.for_host(server.host) as client:
        body, _, _ = client.manifest_raw("merged/jax", tag)
    assert [m["digest"] for m in json.loads(body)["manifests"]] == [digests[AMD64], digests[ARM64]]

    # The arm64 job failed: its report says so, and the index is not made again over a hole.
    amd64_report, arm64 = reports[1], next(e for e in entries if e.platform == ARM64)
    failed = report(tmp_path / "failed.json", {"entry": {"id": arm64.id}, "passed": False})
    again = CliRunner().invoke(
        main, ["publish", "--registry", f"{server.host}/other-run", *selectors,
               "--merge", amd64_report, "--merge", str(failed)],
    )  # fmt: skip
    assert again.exit_code == 1, again.output
    (error,) = again.stderr.strip().splitlines()
    assert f"its linux/arm64 image ({arm64.id}) failed or was not published" in error


def test_with_a_key_the_index_is_signed_and_attested_for_admission_policies(
    server: RegistryServer, knowledge: Knowledge
) -> None:
    # Kyverno and cosign resolve a multi-platform tag to the index's digest and check there.
    registry = f"{server.host}/signed"
    entries = both_platforms(knowledge)
    push_children(server, registry, entries)
    key = SigningKey(private=ec.generate_private_key(ec.SECP256R1()), source="test")

    (index,) = publish_platform_indexes(
        registry, [(e, HASHES[e.platform]) for e in entries], on_published=lambda index: None,
        signing_key=key,
    )  # fmt: skip

    assert index.signature.startswith("sha256:")
    assert index.attestations.startswith("sha256:")
    subject = Subject(host=server.host, repository="signed/jax", digest=index.digest)
    with RegistryClient.for_host(server.host) as client:
        verified = verify_image(client, subject, key.public, (TEST_RESULT, SLSA_PROVENANCE))
        assert verified.predicates[TEST_RESULT]["passedTests"] == [AMD64, ARM64]
        dependencies = verified.predicates[SLSA_PROVENANCE]["buildDefinition"][
            "resolvedDependencies"
        ]
        assert [d["name"] for d in dependencies] == [f"{AMD64} image", f"{ARM64} image"]
        other = SigningKey(private=ec.generate_private_key(ec.SECP256R1()), source="other")
        with pytest.raises(SignatureError, match=r"no signature in .* verifies"):
            verify_image(client, subject, other.public, (TEST_RESULT, SLSA_PROVENANCE))
