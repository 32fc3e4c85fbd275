"""Framework images over an in-memory engine: an entry whose lock has a framework part is built
FROM the image of its framework key, which is built once per key, found again by key, and never
taken from under its reference unless its key and installed distributions are the key's.

Only the engine is a double; the knowledge base, rendering, the locks and the store are real."""

from __future__ import annotations

import dataclasses
import hashlib
import threading

import pytest

from envbuild.build.entry import (
    ABSENT,
    BUILT_HERE,
    UNDER_ITS_TAG,
    build_entry,
    framework_on_engine,
    prepare,
)
from envbuild.core import labels
from envbuild.core.errors import BuildFailed
from envbuild.core.models import (
    BuildContext,
    BuildOptions,
    Entry,
    FrameworkImage,
    Knowledge,
    Lock,
    Selection,
)
from envbuild.core.store import ResultStore
from envbuild.engine.interface import RunResult
from envbuild.pipeline.frameworks import FrameworkState, framework_lines, plan_frameworks_document
from envbuild.plan.matrix import default_matrix_path, load_matrix, make_plan
from tests.support.engine_double import Image, InMemoryEngine

FRAMEWORK = (
    ("filelock==3.0.0", "    # via torch\n"),
    ("torch==2.13.0+cpu", ""),
)


def lock_with(entry: Entry, *team: str) -> Lock:
    """A lock of the framework part above and the team's pins `team` (`name==version`)."""
    pins = [*FRAMEWORK, *((pin, "") for pin in team)]
    text = f'# input framework: "{entry.install.requirement}"\n' + "".join(
        f"{pin} \\\n    --hash=sha256:{hashlib.sha256(pin.encode()).hexdigest()}\n{via}"
        for pin, via in sorted(pins)
    )
    return Lock(entry_id=entry.id, text=text)


def context_for(
    double: InMemoryEngine, knowledge: Knowledge, *team: str, image: str = ""
) -> BuildContext:
    chosen = Selection(framework="torch", framework_version="2.13.0", cuda="cpu")
    (entry,) = make_plan(knowledge, load_matrix(default_matrix_path(), knowledge), chosen).entries
    if image:
        entry = dataclasses.replace(entry, image=image)
    if entry.base_image not in double.bases:
        double.add_base(entry.base_image, python=entry.python)
    return prepare(double, knowledge, entry, BuildOptions(), None, lock_with(entry, *team))


def framework_of(context: BuildContext) -> FrameworkImage:
    """The framework image the context's entry is built FROM (its lock has a framework part)."""
    assert context.framework_image is not None
    return context.framework_image


def listing(*pins: str) -> RunResult:
    """What the distributions' listing prints in an image holding `pins`."""
    return RunResult(
        exit_code=0, stdout="".join(f"{p}\n" for p in pins), stderr="", timed_out=False, seconds=0.1
    )


def test_entries_sharing_a_framework_key_build_its_image_once_and_stand_on_it(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    first = context_for(double, knowledge, "six==1.16.0", image="team/a:1")
    second = context_for(double, knowledge, "tqdm==4.67.1", image="team/b:1")
    assert first.framework_image is not None
    assert second.framework_image is not None
    assert first.framework_image.key == second.framework_image.key
    assert first.content_hash != second.content_hash
    notes: list[str] = []
    built = [build_entry(double, c, store=store, on_note=notes.append) for c in (first, second)]
    framework_builds = [b for b in double.builds if b.tag == first.framework_image.ref]
    assert len(framework_builds) == 1
    assert framework_builds[0].labels[labels.FRAMEWORK_KEY] == first.framework_image.key
    assert "built in" in notes[0]
    assert "built before on this engine" in notes[1]
    assert all(n.startswith("framework torch 2.13.0+cpu (key ") for n in notes)
    # Both images hold the framework image's layers below their own, and name its key.
    framework = double.image(first.framework_image.ref)
    assert framework is not None
    for image in built:
        found = double.image(image.id)
        assert found is not None
        assert found.layers[: len(framework.layers)] == framework.layers
        assert len(found.layers) == len(framework.layers) + 2  # the lock's COPY, the team's RUN
        assert found.labels[labels.FRAMEWORK_KEY] == first.framework_image.key
        assert image.framework.startswith("framework torch 2.13.0+cpu")


def test_the_key_follows_what_decides_the_framework_images_bytes(
    double: InMemoryEngine, knowledge: Knowledge
) -> None:
    plain = context_for(double, knowledge, "six==1.16.0").framework_image
    bumped = context_for(double, knowledge, "six==1.17.0").framework_image
    assert plain is not None
    assert bumped is not None
    assert plain.key == bumped.key  # the team's packages are not the framework's
    root = context_for(double, knowledge, "six==1.16.0")
    root = prepare(
        double, knowledge, dataclasses.replace(root.entry, user="root"), BuildOptions(), None,
        root.lock or lock_with(root.entry),
    )  # fmt: skip
    assert root.framework_image is not None
    assert root.framework_image.key != plain.key  # the image's user is made in its first RUN
    other_base = InMemoryEngine()
    entry = context_for(double, knowledge).entry
    other_base.add_image("another base", tags=(entry.base_image,))
    other_base.bases[entry.base_image] = dataclasses.replace(
        double.bases[entry.base_image], image_id="sha256:" + "1" * 64
    )
    moved = prepare(other_base, knowledge, entry, BuildOptions(), None, lock_with(entry))
    assert moved.framework_image is not None
    assert moved.framework_image.key != plain.key


def test_an_image_under_the_reference_with_the_keys_distributions_is_used(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    context = context_for(double, knowledge, "six==1.16.0")
    wanted = framework_of(context)
    # As a pull from the registry, or a load of another machine's build, would leave it.
    loaded = double.add_image(
        "loaded", tags=(wanted.ref,), labels={labels.FRAMEWORK_KEY: wanted.key}
    )
    # The venv's seeds are in every venv, locked or not.
    double.outputs[loaded] = listing("filelock==3.0.0", "torch==2.13.0+cpu", "pip==23.0.1")
    notes: list[str] = []
    build_entry(double, context, store=store, on_note=notes.append)
    assert not [b for b in double.builds if b.tag == wanted.ref]
    assert "its distributions checked" in notes[0]
    assert double.runs[-1].image_id == loaded


@pytest.mark.parametrize(
    ("key", "listed", "said"),
    [
        ("other", ("filelock==3.0.0", "torch==2.13.0+cpu"), "its key label is 'other', not"),
        (
            None,
            ("filelock==3.0.0", "torch==2.13.0+cpu"),
            "it has no org.envbuild.framework-key label",
        ),
        ("right", ("filelock==3.0.0", "torch==2.12.0+cpu"), "torch 2.13.0+cpu → 2.12.0+cpu"),
        ("right", ("filelock==3.0.0",), "- torch"),
        ("right", ("filelock==3.0.0", "torch==2.13.0+cpu", "evil==6.6.6"), "+ evil 6.6.6"),
        ("right", None, "listing its distributions failed"),
        ("right", "unstartable", "listing its distributions failed: it did not start (…exec:"),
    ],
)
def test_an_image_under_the_reference_that_is_not_the_keys_is_refused_and_rebuilt(
    double: InMemoryEngine,
    knowledge: Knowledge,
    store: ResultStore,
    key: str | None,
    listed: tuple[str, ...] | str | None,
    said: str,
) -> None:
    context = context_for(double, knowledge, "six==1.16.0")
    wanted = framework_of(context)
    given = {} if key is None else {labels.FRAMEWORK_KEY: wanted.key if key == "right" else key}
    planted = double.add_image("pushed by hand", tags=(wanted.ref,), labels=given)
    if listed == "unstartable":  # no /opt/venv/bin/python in it: the engine cannot start it
        double.unstartable[planted] = 'exec: "/opt/venv/bin/python": no such file or directory'
    elif listed is not None:
        double.outputs[planted] = listing(*listed)
    notes: list[str] = []
    built = build_entry(double, context, store=store, on_note=notes.append)
    assert f"{wanted.ref} refused (" in notes[0]
    assert said in notes[0]
    assert "built in" in notes[0]
    assert "\n" not in notes[0]
    rebuilt = double.image(wanted.ref)
    assert rebuilt is not None
    assert rebuilt.id != planted
    image = double.image(built.id)
    assert image is not None
    assert image.layers[: len(rebuilt.layers)] == rebuilt.layers


def test_a_framework_image_moved_during_the_build_fails_it(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    context = context_for(double, knowledge, "six==1.16.0")
    wanted = framework_of(context)
    moved = threading.Event()

    def retag(arguments: dict[str, str]) -> None:
        if not moved.is_set() and double.image(wanted.ref) is not None:
            moved.set()  # the framework image is built: its tag moves before the entry's build
            double.add_image("another", tags=(wanted.ref,))

    double.during_build = retag
    with pytest.raises(BuildFailed, match="is not built on the framework image"):
        build_entry(double, context, store=store)


def test_no_cache_builds_the_framework_image_again(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    context = context_for(double, knowledge, "six==1.16.0")
    build_entry(double, context, store=store)
    build_entry(double, context, store=store, no_cache=True)
    assert context.framework_image is not None
    framework_builds = [b for b in double.builds if b.tag == context.framework_image.ref]
    assert [b.no_cache for b in framework_builds] == [False, True]


REMOTE = "127.0.0.1:5000/team/framework:"


def remote_image(key: str, seed: str = "pushed by another machine") -> Image:
    """A framework image as a registry holds it: its key label and its layers."""
    return Image(
        id="sha256:" + hashlib.sha256(seed.encode()).hexdigest(),
        tags=[],
        labels={labels.FRAMEWORK_KEY: key},
        layers=("base", "os", "copy", "framework"),
    )


def test_a_framework_image_in_the_registry_is_pulled_checked_and_used(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    context = context_for(double, knowledge, "six==1.16.0")
    wanted = framework_of(context)
    remote = REMOTE + wanted.ref.rpartition(":")[2]
    held = remote_image(wanted.key)
    double.remote[remote] = held
    double.outputs[held.id] = listing("filelock==3.0.0", "torch==2.13.0+cpu")
    notes: list[str] = []
    built = build_entry(double, context, store=store, on_note=notes.append, framework_from=remote)
    assert double.pulls == [remote]
    assert not [b for b in double.builds if b.tag == wanted.ref]
    assert f"from the registry as {remote}, its distributions checked" in notes[0]
    local = double.image(wanted.ref)
    assert local is not None
    assert local.id == held.id
    image = double.image(built.id)
    assert image is not None
    assert image.layers[:4] == held.layers
    # Recorded: the next build of the key finds it here without asking the registry.
    build_entry(double, context_for(double, knowledge, "six==1.17.0"), store=store,
                on_note=notes.append, framework_from=remote)  # fmt: skip
    assert double.pulls == [remote]
    assert "built before on this engine" in notes[1]


@pytest.mark.parametrize(
    ("listed", "reachable", "said"),
    [
        (("filelock==3.0.0", "torch==2.12.0+cpu"), True, "refused (its distributions differ"),
        (("filelock==3.0.0", "torch==2.13.0+cpu"), False, "not pulled (pull of"),
    ],
)
def test_a_framework_image_the_registry_cannot_give_as_the_key_is_built_here(
    double: InMemoryEngine,
    knowledge: Knowledge,
    store: ResultStore,
    listed: tuple[str, ...],
    reachable: bool,
    said: str,
) -> None:
    context = context_for(double, knowledge, "six==1.16.0")
    wanted = framework_of(context)
    remote = REMOTE + wanted.ref.rpartition(":")[2]
    held = remote_image(wanted.key)
    double.remote[remote] = held if reachable else None
    double.outputs[held.id] = listing(*listed)
    notes: list[str] = []
    build_entry(double, context, store=store, on_note=notes.append, framework_from=remote)
    assert f"{remote} {said}" in notes[0]
    assert "built in" in notes[0]
    rebuilt = double.image(wanted.ref)
    assert rebuilt is not None
    assert rebuilt.id != held.id


@pytest.mark.parametrize(("key", "expected"), [("right", UNDER_ITS_TAG), ("other", ABSENT)])
def test_plan_says_where_the_framework_image_stands_and_changes_nothing(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore, key: str, expected: str
) -> None:
    context = context_for(double, knowledge, "six==1.16.0")
    wanted = framework_of(context)
    assert framework_on_engine(double, store, wanted) == ABSENT
    label = wanted.key if key == "right" else key
    planted = double.add_image("loaded", tags=(wanted.ref,), labels={labels.FRAMEWORK_KEY: label})
    double.outputs[planted] = listing("filelock==3.0.0", "torch==2.13.0+cpu")
    assert framework_on_engine(double, store, wanted) == expected
    assert not double.runs  # nothing checked, started, built or tagged to say so
    assert not double.builds
    assert double.image(wanted.ref) == double.image(planted)
    build_entry(double, context, store=store)
    assert framework_on_engine(double, store, wanted) == BUILT_HERE


def test_plan_lines_name_the_key_where_the_image_is_and_why_an_entry_has_none() -> None:
    key = "ab" * 32
    here = FrameworkState(
        entry_id="e1", title="torch 2.4.1+cu121", key=key, image="envbuild/framework:t",
        on_engine=BUILT_HERE, published="r:5000/framework:t@sha256:" + "1" * 64,
    )  # fmt: skip
    away = dataclasses.replace(here, entry_id="e2", on_engine=ABSENT, published=None)
    stale = FrameworkState(entry_id="e3", problem="its lock is stale: run envbuild lock")
    lines = framework_lines("classic", "r:5000", [here, away, stale])
    assert lines == [
        "framework images (classic builder, registry r:5000): 1 key for 3 entries",
        f"  e1: torch 2.4.1+cu121, key {key[:12]}: built on this engine; published as "
        f"r:5000/framework:t@sha256:{'1' * 64}",
        f"  e2: torch 2.4.1+cu121, key {key[:12]}: not on this engine; not in r:5000",
        "  e3: its lock is stale: run envbuild lock",
    ]
    assert framework_lines("buildkit", None, [here])[1].endswith(": built on this engine")
    tagged = dataclasses.replace(here, on_engine=UNDER_ITS_TAG)
    assert framework_lines("classic", None, [tagged])[1].endswith(
        ": on this engine under its tag, not built here (checked when a build uses it)"
    )


def test_plan_json_gives_each_entry_its_framework_state_or_null() -> None:
    state = FrameworkState(entry_id="e1", title="torch 2.13.0+cpu", key="ab" * 32, on_engine=ABSENT)
    document = {"entries": [{"id": "e1"}, {"id": "e2"}], "excluded": []}
    merged = plan_frameworks_document(document, [state])
    assert merged["entries"][0]["framework"]["key"] == "ab" * 32
    assert merged["entries"][0]["framework"]["on_engine"] == ABSENT
    assert merged["entries"][1]["framework"] is None
    assert "framework" not in document["entries"][0]  # the plan's own document is left as it was
