"""One tag for several platforms, decided without a registry: which entries share an index, its
bytes, which candidates give up their moving tags to it, and stretched payload deadlines.

The registry's side (pushing, reading back, refusing) is tests/integration/test_platform_index.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envbuild.core.models import Entry, Knowledge, Selection
from envbuild.core.platforms import AMD64, ARM64
from envbuild.core.store import ResultStore
from envbuild.payload import smoke_harness
from envbuild.plan.matrix import knowledge_matrix, make_plan
from envbuild.plan.matrix_file import default_matrix_path, load_matrix
from envbuild.publish.platform_index import Child, index_document, platform_groups, shared_tag
from envbuild.publish.push import entry_candidates, moving_tags
from envbuild.registry import DOCKER_MANIFEST, DOCKER_MANIFEST_LIST, OCI_INDEX, OCI_MANIFEST
from tests.support.engine_double import InMemoryEngine


def planned(knowledge: Knowledge, platform: str, framework: str = "jax") -> list[Entry]:
    chosen = Selection(framework=framework, cuda="cpu", platform=platform)
    matrix = knowledge_matrix(knowledge, chosen, load_matrix(default_matrix_path(), knowledge))
    entries = make_plan(knowledge, matrix, chosen).entries
    newest = entries[-1].framework_version
    return [e for e in entries if e.framework_version == newest]


def test_entries_that_differ_only_in_platform_share_one_index(knowledge: Knowledge) -> None:
    both = planned(knowledge, f"{AMD64},{ARM64}")
    only_amd64 = planned(knowledge, AMD64, framework="torch")

    groups = platform_groups([*both, *only_amd64])

    amd64 = next(e for e in both if e.platform == AMD64)
    assert list(groups) == [amd64.id]
    assert [e.platform for e in groups[amd64.id]] == [AMD64, ARM64]
    assert shared_tag(groups[amd64.id]) == ("jax", amd64.image.rsplit(":", 1)[1])
    assert platform_groups(only_amd64) == {}
    arm64_alone = [e for e in both if e.platform == ARM64]
    assert platform_groups(arm64_alone) == {}


def test_an_index_over_docker_manifests_is_dockers_list_in_platform_order() -> None:
    children = [
        Child(platform=ARM64, digest="sha256:" + "b" * 64, media_type=DOCKER_MANIFEST, size=2),
        Child(platform=AMD64, digest="sha256:" + "a" * 64, media_type=DOCKER_MANIFEST, size=1),
    ]
    body, media_type = index_document(children)
    document = json.loads(body)
    assert media_type == document["mediaType"] == DOCKER_MANIFEST_LIST
    assert document["schemaVersion"] == 2
    assert [m["platform"]["architecture"] for m in document["manifests"]] == ["amd64", "arm64"]
    assert document["manifests"][1]["platform"]["variant"] == "v8"
    assert index_document(list(reversed(children))) == (body, media_type)  # same bytes

    mixed = [
        children[0],
        Child(platform=AMD64, digest=children[1].digest, media_type=OCI_MANIFEST, size=1),
    ]
    assert index_document(mixed)[1] == OCI_INDEX


def test_an_entry_built_for_two_platforms_leaves_its_moving_tags_to_the_index(
    knowledge: Knowledge, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store = ResultStore(tmp_path / "results.sqlite3")
    double = InMemoryEngine()
    entries = [*planned(knowledge, f"{AMD64},{ARM64}"), *planned(knowledge, AMD64, "torch")]
    for entry in entries:
        double.add_image(entry.id, tags=(entry.image,), platform=entry.platform)

    candidates = {c.source: c for c in entry_candidates(double, store, entries)}

    jax = [e for e in entries if e.framework == "jax"]
    assert all(candidates[e.image].moving == () for e in jax)
    torch = next(e for e in entries if e.framework == "torch")
    assert "latest" in candidates[torch.image].moving


@pytest.mark.parametrize(
    ("given", "factor"),
    [(None, 1.0), ("10", 10.0), ("0.1", 1.0), ("1e9", 50.0), ("nan", 1.0), ("ten", 1.0),
     ("-3", 1.0), ("2.5", 2.5)],
)  # fmt: skip
def test_payload_deadlines_stretch_by_the_hosts_slowdown_and_never_shrink(
    monkeypatch: pytest.MonkeyPatch, given: str | None, factor: float
) -> None:
    if given is None:
        monkeypatch.delenv("ENVBUILD_SLOWDOWN", raising=False)
    else:
        monkeypatch.setenv("ENVBUILD_SLOWDOWN", given)
    run = smoke_harness.Run("test", total_s=100)
    assert run.slowdown == factor
    assert run.total_s == pytest.approx(100 * factor)
    assert run.time_left() == pytest.approx(100 * factor, abs=1)
    assert ("slowdown" in run.extra) == (factor != 1.0)


def test_an_arm64_image_alone_moves_its_own_tags_not_the_shared_ones(knowledge: Knowledge) -> None:
    # A CI job per platform: the arm64 job must not move `latest` to the arm64 image.
    both = planned(knowledge, f"{AMD64},{ARM64}")
    arm64 = [e for e in both if e.platform == ARM64]
    amd64 = [e for e in both if e.platform == AMD64]
    series = f"jax{arm64[0].framework_version.rsplit('.', 1)[0]}-cpu-py3.11"

    assert moving_tags(arm64)[arm64[0].id] == (f"{series}-arm64", "latest-arm64")
    assert moving_tags(amd64)[amd64[0].id] == (series, "latest")
    together = moving_tags(both)
    assert together[amd64[0].id] == (series, "latest") == together[arm64[0].id]


def test_when_one_platform_failed_the_other_leaves_the_shared_tags_where_they_were(
    knowledge: Knowledge, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    store = ResultStore(tmp_path / "results.sqlite3")
    double = InMemoryEngine()
    both = planned(knowledge, f"{AMD64},{ARM64}")
    passed = [e for e in both if e.platform == AMD64]
    double.add_image(passed[0].id, tags=(passed[0].image,))

    (alone,) = entry_candidates(double, store, passed)
    (beside_a_failure,) = entry_candidates(double, store, passed, run=both)

    assert "latest" in alone.moving
    assert beside_a_failure.moving == ()
