"""What the registry already holds, asked of a real HTTP registry on loopback (tests/hostile_registry):
an entry's immutable tag with its evidence means "published already"; anything else under that tag
is never taken as vetted and never overwritten."""

from __future__ import annotations

import pytest

from envbuild.core.errors import BadInput, EnvbuildError
from envbuild.publish.verify import Target, entry_target, published_already, split_registry
from envbuild.registry import RegistryClient
from tests.support.hostile_registry import (
    OCI_INDEX,
    REPOSITORY,
    TAG,
    HostileRegistry,
    Published,
    canonical,
    oci_error,
)

HASH = "c0ffee" * 10 + "abcd"
PUBLISHED = Published()


def test_an_entry_is_published_as_its_name_and_tag_plus_the_content_hash() -> None:
    where = entry_target("127.0.0.1:5000/team", "envbuild/torch:2.13.0-cpu", HASH)
    assert (where.host, where.repository, where.tag) == (
        "127.0.0.1:5000",
        "team/torch",
        "2.13.0-cpu",
    )
    assert where.immutable == f"2.13.0-cpu-{HASH[:12]}"
    assert where.reference == f"127.0.0.1:5000/team/torch:2.13.0-cpu-{HASH[:12]}"
    assert entry_target("localhost:5000", "envbuild/jax", HASH).repository == "jax"


@pytest.mark.parametrize("registry", ["", "/", "team", "torch/x"])
def test_a_registry_without_a_host_is_bad_input(registry: str) -> None:
    with pytest.raises(BadInput, match="names no registry host"):
        split_registry(registry)


def ask(content: Published | None) -> object:
    """published_already for the tag TAG of REPOSITORY, on a registry serving `content`."""
    handler = (
        content.routes()
        if content is not None
        else lambda seen: oci_error(404, "NAME_UNKNOWN", "no")
    )
    with (
        HostileRegistry(handler) as server,
        RegistryClient(server.host, credentials=None, deadline=5) as client,
    ):
        where = Target(host=server.host, repository=REPOSITORY, tag="2", immutable=TAG)
        return published_already(client, where)


def test_a_published_and_vetted_tag_is_found_with_its_evidence() -> None:
    found = ask(PUBLISHED)
    assert found is not None
    assert getattr(found, "passed", None) is True
    assert getattr(found, "image_id", None) == PUBLISHED.image_id


def test_a_missing_tag_is_not_published() -> None:
    assert ask(None) is None


def test_a_tag_whose_evidence_failed_is_an_error_not_a_skip() -> None:
    failed = PUBLISHED.with_(smoke=canonical({"image_id": PUBLISHED.image_id, "passed": False}))
    with pytest.raises(EnvbuildError, match=r"evidence of a failed smoke test.*never overwritten"):
        ask(failed)


def test_a_tag_without_evidence_is_an_error_not_a_skip() -> None:
    bare = PUBLISHED.with_(
        referrers_index=canonical({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []})
    )
    with pytest.raises(EnvbuildError, match=r"no envbuild evidence.*delete it in the registry"):
        ask(bare)
