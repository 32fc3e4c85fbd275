"""`plan --frameworks`: each entry's framework image, named by its key, and whether this engine
has it and a registry holds it, asked before anything is built. The key is computed as `build`
computes it (the base image's id, the rendered framework Dockerfile, the lock's framework part,
the installer), so it needs the engine for the base and a fresh lock; nothing is built, pulled,
tagged or written."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envbuild.build.entry import BUILT_HERE, UNDER_ITS_TAG, framework_on_engine, probe_entry_base
from envbuild.build.render import render_entry
from envbuild.core.errors import BadInput
from envbuild.core.models import BaseProbe, BuildOptions, Entry, Knowledge
from envbuild.core.store import ResultStore
from envbuild.engine.interface import Engine, choose_builder
from envbuild.lock.lockfile import lock_command, lock_for
from envbuild.publish.verify import framework_target, held_digest, split_registry
from envbuild.registry import RegistryClient

ON_ENGINE = {
    BUILT_HERE: "built on this engine",
    UNDER_ITS_TAG: "on this engine under its tag, not built here (checked when a build uses it)",
}
NOT_ON_ENGINE = "not on this engine"


@dataclass(frozen=True, kw_only=True)
class FrameworkState:
    """What the plan says of one entry's framework image: its key and where it is, or why it
    has none (`problem`)."""

    entry_id: str
    title: str = ""  # torch 2.4.1+cu121
    key: str = ""
    image: str = ""  # envbuild/framework:<framework>-<version>-<key prefix>
    on_engine: str = ""  # framework_on_engine's answer
    published: str | None = None  # host/repository:tag@digest where the registry holds it
    problem: str = ""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def line(self, registry: str | None) -> str:
        """One line of the plan's table."""
        if self.problem:
            return f"  {self.entry_id}: {self.problem}"
        where = ON_ENGINE.get(self.on_engine, NOT_ON_ENGINE)
        if registry is not None:
            where += (
                f"; published as {self.published}" if self.published else f"; not in {registry}"
            )
        return f"  {self.entry_id}: {self.title}, key {self.key[:12]}: {where}"


def framework_states(
    knowledge: Knowledge,
    entries: tuple[Entry, ...],
    options: BuildOptions,
    lock_states: dict[str, str],
    *,
    matrix_path: Path | None,
    registry: str | None,
    store: ResultStore,
    connect: Callable[[], Engine],
) -> tuple[str, list[FrameworkState]]:
    """The builder the keys are for, and each entry's framework state. An entry whose lock is
    not fresh or whose base does not fit it gets its problem; an engine that does not answer or a
    registry that cannot be asked is an error (one line), as for `build`: nothing is shown then."""
    if registry is not None:
        split_registry(registry)  # a registry without a host, refused before the engine
    engine = connect()
    options = dataclasses.replace(options, builder=choose_builder(engine, options.builder))
    probes: dict[str, BaseProbe] = {}

    def state_of(entry: Entry) -> FrameworkState:
        lock_state = lock_states.get(entry.id, "missing")
        if lock_state != "fresh":
            problem = f"its lock is {lock_state}: run {lock_command(matrix_path)} to know its key"
            return FrameworkState(entry_id=entry.id, problem=problem)
        try:
            probe = probe_entry_base(engine, knowledge, entry, options, probes)
            lock = lock_for(
                entry, options, matrix_path=matrix_path, locked=True, knowledge=knowledge
            )
            wanted = render_entry(entry, options, probe, lock).framework_image
        except BadInput as exc:  # this entry's (its base, its lock): said on its line
            return FrameworkState(entry_id=entry.id, problem=exc.message)
        if wanted is None:
            problem = "no framework image: its lock has no `# via` annotations (one install layer)"
            return FrameworkState(entry_id=entry.id, problem=problem)
        return FrameworkState(
            entry_id=entry.id, title=wanted.title, key=wanted.key, image=wanted.ref,
            on_engine=framework_on_engine(engine, store, wanted),
        )  # fmt: skip

    states = [state_of(entry) for entry in entries]
    if registry is not None:
        states = published_states(registry, states)
    return options.builder, states


def published_states(registry: str, states: list[FrameworkState]) -> list[FrameworkState]:
    """`states` with where `registry` holds each framework image (its `framework` repository,
    under the image's tag), each tag asked once, in one operation under one deadline."""
    found: dict[str, str | None] = {}
    with RegistryClient.for_host(split_registry(registry)[0]) as client, client.operation():
        for state in states:
            if state.image and state.image not in found:
                where = framework_target(registry, state.image)
                digest = held_digest(client, where)
                found[state.image] = f"{where.reference}@{digest}" if digest else None
    return [dataclasses.replace(s, published=found.get(s.image)) for s in states]


def framework_lines(builder: str, registry: str | None, states: list[FrameworkState]) -> list[str]:
    """What the plan's table says of the framework images, under the lock states."""
    keys = {s.key for s in states if s.key}
    head = f"framework images ({builder} builder{f', registry {registry}' if registry else ''}): "
    head += f"{_count(len(keys), 'key')} for {_count(len(states), 'entry', 'entries')}"
    return [head, *(state.line(registry) for state in states)]


def plan_frameworks_document(
    document: dict[str, Any], states: list[FrameworkState]
) -> dict[str, Any]:
    """`plan --format json` with each entry's framework state (null for an entry it lacks)."""
    by_id = {state.entry_id: state.as_dict() for state in states}
    entries = [{**item, "framework": by_id.get(item["id"])} for item in document["entries"]]
    return {**document, "entries": entries}


def _count(number: int, one: str, many: str = "") -> str:
    return f"{number} {one if number == 1 else many or one + 's'}"
