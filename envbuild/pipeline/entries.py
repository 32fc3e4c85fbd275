"""Build, smoke-test and record many entries: shared stages first, then N entries at a time."""

from __future__ import annotations

import dataclasses
import logging
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from envbuild.build.entry import build_entry, prepare, probe_entry_base
from envbuild.core.errors import BadInput, EnvbuildError
from envbuild.core.interrupt import remove_scratch, run_id, scratch_prefix
from envbuild.core.models import (
    BaseProbe,
    BuildContext,
    BuildOptions,
    Entry,
    Gpu,
    Knowledge,
    Lock,
    ProxySettings,
)
from envbuild.core.redact import register_url
from envbuild.core.results import EntryResult, SmokeResult
from envbuild.core.store import ResultStore
from envbuild.engine.interface import Engine, choose_builder
from envbuild.engine.interface import connect as connect_engine
from envbuild.host.emulation import platform_problem
from envbuild.publish.signing import SignatureError, Subject, verify_image
from envbuild.publish.verify import Target, entry_target, framework_target, published_already
from envbuild.registry import RegistryClient
from envbuild.smoke.static import fleet_refusal
from envbuild.smoke.vet import smoke_image

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ec import EllipticCurvePublicKey

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Event:
    """A change in one entry's progress, for the CLI to show."""

    entry_id: str
    state: str  # queued, building, step, smoke, passed, failed, skipped
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How a run of many entries behaves."""

    jobs: int = 1
    keep_going: bool = False
    smoke: bool = True
    gpus: str = "auto"
    no_cache: bool = False  # rebuild every layer, even when the content hash exists
    push_registry: str | None = None  # entries whose immutable tag it holds, vetted, are skipped
    fleet: tuple[Gpu, ...] = ()  # --gpu: an image without kernels for one of these fails
    # --push --sign: an image the registry holds is done only when this key's signature on it
    # verifies; otherwise the entry is built (found by its content hash), pushed and signed.
    signed_by: EllipticCurvePublicKey | None = None


def build_shared_stages(
    engine: Engine,
    contexts: list[BuildContext],
    on_event: Callable[[Event], None],
    proxy: ProxySettings | None = None,
) -> int:
    """Build each OS + Python stage that several entries share once, so that parallel builds
    find it in the layer cache instead of each building it; return how many were built."""
    stages: dict[str, list[BuildContext]] = {}
    for context in contexts:
        stages.setdefault(context.runtime_stage, []).append(context)
    built = 0
    for stage, sharing in stages.items():
        if len(sharing) < 2:
            continue
        for context in sharing:
            on_event(
                Event(
                    entry_id=context.entry.id, state="building", detail="shared OS + Python stage"
                )
            )
        with tempfile.TemporaryDirectory(prefix=scratch_prefix("stage")) as tmp:
            (Path(tmp) / "Dockerfile").write_text(stage, encoding="utf-8")
            engine.build(
                Path(tmp),
                tag=None,
                labels={},
                build_args={},
                on_line=lambda line: None,
                network=not sharing[0].offline,
                target="runtime",
                proxy=None if sharing[0].offline else proxy,  # its apt-get may need it
                builder=sharing[0].builder,  # each builder finds only its own layer cache
                platform=sharing[0].entry.platform,
            )
        built += 1
    return built


def check_platforms(engine: Engine, entries: tuple[Entry, ...]) -> None:
    """BadInput, before anything is resolved or built, for an entry of a platform the engine
    can neither build natively nor under this host's emulator."""
    facts = engine.describe()
    for entry in entries:
        problem = platform_problem(facts, entry.platform)
        if problem:
            msg = f"{entry.id}: {problem}"
            raise BadInput(msg)


def run_entries(
    knowledge: Knowledge,
    entries: tuple[Entry, ...],
    options: BuildOptions,
    run: RunOptions,
    *,
    store: ResultStore,
    on_event: Callable[[Event], None],
    locks: Callable[[], Mapping[str, Lock]],
    connect: Callable[[], Engine] = connect_engine,
) -> list[EntryResult]:
    """Check the engine and every base, then get the locks (`locks()`: by entry id; resolving
    one takes the network, so what is quickly wrong is said first), build shared stages, then
    build and smoke-test the entries, each installing exactly its lock."""
    for url in (options.index_url, *options.extra_index_urls):
        register_url(url)  # before anything can print or log a build request
    engine = connect()
    builder = choose_builder(engine, options.builder)
    log.info("building with %s", builder)
    check_platforms(engine, entries)
    options = dataclasses.replace(options, builder=builder)
    engine.remove_leftovers()  # of an earlier run whose engine or process died mid-way
    probes: dict[str, BaseProbe] = {}
    # Every entry is checked against its base before its lock is resolved or anything built.
    for entry in entries:
        probe_entry_base(engine, knowledge, entry, options, probes)
    resolved = locks()
    contexts = [
        prepare(engine, knowledge, entry, options, probes, resolved[entry.id]) for entry in entries
    ]
    done = (
        published_entries(run.push_registry, contexts, options.proxy, signed_by=run.signed_by)
        if run.push_registry
        else {}
    )
    for context in contexts:
        entry_id = context.entry.id
        found = done.get(entry_id)
        if found is None:
            on_event(Event(entry_id=entry_id, state="queued"))
        else:
            detail = f"published already as {found}: not built"
            on_event(Event(entry_id=entry_id, state="published", detail=detail))
    todo = [c for c in contexts if c.entry.id not in done]
    if run.jobs > 1 and not run.no_cache:
        build_shared_stages(engine, todo, on_event, options.proxy)
    work = _Work(knowledge=knowledge, options=options, run=run, store=store, on_event=on_event)
    return work.entries(contexts, done, connect)


@dataclass(kw_only=True)
class _Work:
    """What every entry of a run is built and smoke-tested with, and the run's stop signal."""

    knowledge: Knowledge
    options: BuildOptions
    run: RunOptions
    store: ResultStore
    on_event: Callable[[Event], None]
    stop: threading.Event = field(default_factory=threading.Event)

    def entries(
        self, contexts: list[BuildContext], done: dict[str, str], connect: Callable[[], Engine]
    ) -> list[EntryResult]:
        """Each context built and smoke-tested, `run.jobs` at a time, each thread with its own
        engine client (docker-py sessions are not shared); `done` are published already."""
        local = threading.local()

        def thread_engine() -> Engine:
            if not hasattr(local, "engine"):
                local.engine = connect()
            return local.engine  # type: ignore[no-any-return]

        def one(context: BuildContext) -> EntryResult:
            entry = context.entry
            if entry.id in done:
                return EntryResult(
                    entry=entry, image=None, smoke=None, error=None, published=done[entry.id]
                )
            return self.entry(thread_engine, context)

        pool = ThreadPoolExecutor(max_workers=max(1, self.run.jobs), thread_name_prefix="envbuild")
        try:
            results = list(pool.map(one, contexts))
        except KeyboardInterrupt:
            # Workers may be blocked on the engine: schedule nothing more, remove what this run
            # made from here, and let the CLI exit without waiting for them.
            self.stop.set()
            pool.shutdown(wait=False, cancel_futures=True)
            abandon_run(connect)
            raise
        pool.shutdown()
        return results

    def entry(self, engine: Callable[[], Engine], context: BuildContext) -> EntryResult:
        """One entry built and smoke-tested (or skipped after an earlier failure), with its time."""
        entry, on_event = context.entry, self.on_event
        start = time.monotonic()
        if self.stop.is_set():
            on_event(Event(entry_id=entry.id, state="skipped", detail="an earlier entry failed"))
            return EntryResult(
                entry=entry, image=None, smoke=None,
                error="not built: an earlier entry failed (use --keep-going to build the rest)",
            )  # fmt: skip
        try:
            result = _build_and_smoke(
                engine(),
                context,
                self.knowledge,
                self.run,
                self.store,
                on_event,
                self.options.proxy,
            )
        except EnvbuildError as exc:
            result = EntryResult(entry=entry, image=None, smoke=None, error=exc.message)
        result = dataclasses.replace(result, seconds=time.monotonic() - start)
        if result.passed:
            on_event(Event(entry_id=entry.id, state="passed", detail=f"{result.seconds:.1f}s"))
        else:
            reason = result.failure_reason if result.smoke or result.error else "failed"
            on_event(Event(entry_id=entry.id, state="failed", detail=reason))
            if not self.run.keep_going:
                self.stop.set()
        return result


def published_entries(
    registry: str,
    contexts: list[BuildContext],
    proxy: ProxySettings | None = None,
    *,
    signed_by: EllipticCurvePublicKey | None = None,
) -> dict[str, str]:
    """Entry id → the reference@digest under which the registry already holds its image,
    vetted (immutable tag `<tag>-<content hash>` with passing evidence) and, with `signed_by`,
    signed with that key: those need no build. Asked before anything is built, so an
    unreachable registry stops the run at once."""
    found: dict[str, str] = {}
    clients: dict[str, RegistryClient] = {}
    try:
        for context in contexts:
            where = entry_target(registry, context.entry.image, context.content_hash)
            if where.host not in clients:
                clients[where.host] = RegistryClient.for_host(where.host, proxy=proxy)
            vetted = published_already(clients[where.host], where)
            if vetted is not None and _signed(clients[where.host], where, vetted.digest, signed_by):
                found[context.entry.id] = f"{where.reference}@{vetted.digest}"
    finally:
        for client in clients.values():
            client.close()
    return found


def _signed(
    client: RegistryClient, where: Target, digest: str, key: EllipticCurvePublicKey | None
) -> bool:
    """True without a key; with one, whether its signature and attestations on the digest verify."""
    if key is None:
        return True
    subject = Subject(host=where.host, repository=where.repository, digest=digest)
    try:
        verify_image(client, subject, key)
    except SignatureError as exc:
        log.info(
            "%s is published but not signed with the key (%s): it is signed now",
            where.reference,
            exc,
        )
        return False
    return True


def abandon_run(connect: Callable[[], Engine]) -> None:
    """Remove the containers and temporary contexts of this run (after an interrupt)."""
    remove_scratch()
    try:
        connect().remove_run_containers(run_id())
    except EnvbuildError as exc:
        log.warning("could not clean up after the interrupt: %s", exc.message)


def _build_and_smoke(
    engine: Engine,
    context: BuildContext,
    knowledge: Knowledge,
    run: RunOptions,
    store: ResultStore,
    on_event: Callable[[Event], None],
    proxy: ProxySettings | None = None,
) -> EntryResult:
    entry = context.entry
    on_event(Event(entry_id=entry.id, state="building"))

    def line(text: str) -> None:
        if text.startswith("Step "):
            on_event(Event(entry_id=entry.id, state="step", detail=text.split(" :", 1)[0][5:]))

    def note(text: str) -> None:
        on_event(Event(entry_id=entry.id, state="building", detail=text))

    framework = context.framework_image
    built = build_entry(
        engine, context, store=store, on_line=line, on_note=note, no_cache=run.no_cache,
        proxy=proxy,
        framework_from=(
            framework_target(run.push_registry, framework.ref).reference
            if framework is not None and run.push_registry
            else None
        ),
    )  # fmt: skip
    if not built.built:
        detail = "same content hash exists: not rebuilt"
        if built.tag_restored_from is not None:
            detail += f"; tag moved back from {built.tag_restored_from[:19]}"
        on_event(Event(entry_id=entry.id, state="building", detail=detail))
    if not run.smoke:
        return EntryResult(entry=entry, image=built, smoke=None, error=None)
    record = store.latest_smoke(built.id)
    reused = not built.built and record is not None and record.passed
    if reused and record is not None:
        on_event(Event(entry_id=entry.id, state="smoke", detail="vetted before: not rerun"))
        smoke = SmokeResult.from_report(record.report, image=entry.image, image_id=built.id)
    else:
        on_event(Event(entry_id=entry.id, state="smoke"))
        smoke = smoke_image(engine, built.id, knowledge=knowledge, gpus=run.gpus)
        smoke = dataclasses.replace(smoke, image=entry.image)  # the entry's tag, not the image id
        store.record_smoke(smoke)
    found = engine.image(built.id) if run.fleet and smoke.passed else None
    refusal = found and fleet_refusal(smoke.payload, found.labels, run.fleet)
    error = f"passed, but not for --gpu: {refusal}" if refusal else None
    return EntryResult(entry=entry, image=built, smoke=smoke, error=error, smoke_reused=reused)
