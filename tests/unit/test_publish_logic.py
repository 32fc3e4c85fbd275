"""What publish decides before any registry is contacted: which image, whether it is ours and
vetted, and which moving tags each entry gets. The push itself is proven in tests/e2e."""

from __future__ import annotations

import itertools

import pytest

from envbuild.build.entry import build_entry, prepare
from envbuild.core.errors import BadInput
from envbuild.core.models import HASH_LABEL, BuildOptions, Entry, Knowledge, Selection
from envbuild.core.results import SmokeCheck, SmokeResult
from envbuild.core.store import ResultStore
from envbuild.plan.matrix import default_matrix_path, knowledge_matrix, load_matrix, make_plan
from envbuild.publish.push import NotOurs, NotVetted, candidate, moving_tags, publish_image
from tests.support.engine_double import InMemoryEngine
from tests.support.lock_support import placeholder_lock

# Port 9 (discard) refuses connections: reaching the registry would fail differently.
REGISTRY = "127.0.0.1:9/team"


def entry_of(knowledge: Knowledge, framework: str, version: str, cuda: str = "cpu") -> Entry:
    chosen = Selection(framework=framework, framework_version=version, cuda=cuda, python="3.11")
    defaults = load_matrix(default_matrix_path(), knowledge)
    (found,) = make_plan(knowledge, knowledge_matrix(knowledge, chosen, defaults), chosen).entries
    return found


def built(double: InMemoryEngine, knowledge: Knowledge, store: ResultStore) -> tuple[Entry, str]:
    """jax on the CPU, built by envbuild; its image id."""
    entry = entry_of(knowledge, "jax", "0.10.2")
    double.add_base(entry.base_image, python=entry.python)
    context = prepare(double, knowledge, entry, BuildOptions(), None, placeholder_lock(entry))
    return entry, build_entry(double, context, store=store).id


def smoked(store: ResultStore, image: str, image_id: str, *, passed: bool) -> None:
    check = SmokeCheck(name="payload", passed=passed, detail="recorded by the test")
    store.record_smoke(
        SmokeResult(
            image=image, image_id=image_id, payload={}, checks=(check,), exit_code=0,
            seconds=1.0, stderr_tail="",
        )
    )  # fmt: skip


def test_the_image_envbuild_built_is_a_candidate_under_its_tag(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    entry, image_id = built(double, knowledge, store)
    item = candidate(double, store, entry.image, moving=("latest",))

    assert item.image_id == image_id
    assert (item.name, item.tag) == ("jax", "0.10.2-cpu-py3.11-bookworm")
    record = store.built_image(item.content_hash or "")
    assert record is not None
    assert record.image_id == image_id
    assert item.moving == ("latest",)


def test_an_image_not_in_the_engine_is_bad_input(
    double: InMemoryEngine, store: ResultStore
) -> None:
    with pytest.raises(BadInput, match=r"image team/x:1 is not in the local engine; build it"):
        candidate(double, store, "team/x:1")


def test_an_inherited_content_hash_without_a_build_record_is_refused(
    double: InMemoryEngine, store: ResultStore
) -> None:
    double.add_image("derived", tags=("team/derived:1",), labels={HASH_LABEL: "ab" * 32})
    with pytest.raises(NotOurs, match="envbuild has no record of building it here"):
        candidate(double, store, "team/derived:1")


def test_a_tag_moved_to_another_image_is_refused(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    entry, image_id = built(double, knowledge, store)
    labels = (double.image(image_id) or pytest.fail("built image missing")).labels
    derived = double.add_image("derived", labels=labels)  # FROM the entry's image
    double.tag(derived, entry.image)

    with pytest.raises(NotOurs) as refused:
        candidate(double, store, entry.image)
    assert f"envbuild built {image_id[:19]} for {entry.id}" in refused.value.message
    assert "restore the tag" in refused.value.message


def test_each_engines_own_build_of_one_entry_is_a_candidate_there(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    # One data folder, two engines: the later build on the other engine (a newer record of the
    # same content hash) does not make this engine's own image look moved.
    entry, image_id = built(double, knowledge, store)
    other = InMemoryEngine(name="remote")
    _, elsewhere = built(other, knowledge, store)
    assert elsewhere != image_id

    assert candidate(double, store, entry.image).image_id == image_id
    assert candidate(other, store, entry.image).image_id == elsewhere


def test_an_image_without_envbuild_labels_is_named_by_its_reference(
    double: InMemoryEngine, store: ResultStore
) -> None:
    double.add_image("plain", tags=("registry.example/ml/custom:7",))
    item = candidate(double, store, "registry.example/ml/custom:7")
    assert (item.name, item.tag, item.content_hash) == ("custom", "7", None)

    by_id = double.add_image("by-id", labels={"org.envbuild.framework": "torch"})
    item = candidate(double, store, by_id)
    assert (item.name, item.tag) == ("torch", by_id[7:19])


@pytest.mark.parametrize("last", [None, False], ids=["never-tested", "failed"])
def test_an_unvetted_image_is_refused_before_any_push(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore, last: bool | None
) -> None:
    entry, image_id = built(double, knowledge, store)
    if last is not None:
        smoked(store, entry.image, image_id, passed=last)
    item = candidate(double, store, entry.image)

    with pytest.raises(NotVetted) as refused:
        publish_image(double, store, item, REGISTRY, on_line=lambda line: None)
    why = "has never been smoke-tested" if last is None else "failed its last smoke test"
    assert why in refused.value.message
    assert f"`envbuild smoke {entry.image}`" in refused.value.message
    assert double.pushes == []
    assert store.publications(image_id) == []


def test_a_pass_for_another_image_id_does_not_vet_this_one(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    entry, image_id = built(double, knowledge, store)
    smoked(store, entry.image, "sha256:" + "0" * 64, passed=True)  # same tag, other image
    smoked(store, entry.image, image_id, passed=False)
    smoked(store, entry.image, "sha256:" + "1" * 64, passed=True)
    with pytest.raises(NotVetted, match="failed its last smoke test"):
        publish_image(
            double, store, candidate(double, store, entry.image), REGISTRY,
            on_line=lambda line: None,
        )  # fmt: skip
    assert double.pushes == []


@pytest.mark.parametrize("registry", ["team", "ml/team", ""])
def test_a_registry_without_a_host_is_bad_input_before_any_push(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore, registry: str
) -> None:
    entry, image_id = built(double, knowledge, store)
    smoked(store, entry.image, image_id, passed=True)
    with pytest.raises(BadInput, match="names no registry host"):
        publish_image(
            double, store, candidate(double, store, entry.image), registry,
            on_line=lambda line: None,
        )  # fmt: skip
    assert double.pushes == []


RUN = [
    ("torch", "2.9.1", "cpu"),
    ("torch", "2.10.0", "cpu"),  # newer than 2.9.1, though "2.10" < "2.9" as text
    ("torch", "2.10.0", "12.6"),
    ("tensorflow", "2.20.0", "cpu"),
]


@pytest.mark.parametrize("order", list(itertools.permutations(range(len(RUN)))))
def test_moving_tags_are_the_series_and_latest_for_each_frameworks_newest(
    knowledge: Knowledge, order: tuple[int, ...]
) -> None:
    entries = [entry_of(knowledge, *RUN[i]) for i in order]
    tags = moving_tags(entries)
    by_run = {(e.framework, e.framework_version, e.cuda): tags[e.id] for e in entries}

    assert by_run[("torch", "2.9.1", "cpu")] == ("torch2.9-cpu-py3.11",)
    assert by_run[("tensorflow", "2.20.0", "cpu")] == ("tensorflow2.20-cpu-py3.11", "latest")
    newest_torch = [by_run[("torch", "2.10.0", c)] for c in ("cpu", "12.6")]
    assert {t[0] for t in newest_torch} == {"torch2.10-cpu-py3.11", "torch2.10-cu126-py3.11"}
    # `latest` names one image per framework: one of the newest release's entries.
    assert sum("latest" in t for t in newest_torch) == 1
    assert sum("latest" in t for t in tags.values()) == 2
