"""Build entries: check the base, render, skip what already exists by content hash, build, tag."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from envbuild import __version__
from envbuild.build.render import INSTALLER, INSTALLER_NAME, render_entry, write_context
from envbuild.build.server import kept_context, serve_build, uv_for, write_mounted
from envbuild.core import labels as label_keys
from envbuild.core.errors import BadInput, BuildFailed, EngineFailed, EnvbuildError
from envbuild.core.interrupt import run_id, scratch_prefix
from envbuild.core.labels import SERVE_ARG
from envbuild.core.models import (
    BUILDKIT,
    BaseProbe,
    BuildContext,
    BuildOptions,
    BuiltImage,
    Entry,
    FrameworkImage,
    Knowledge,
    Lock,
    ProxySettings,
)
from envbuild.core.names import shown
from envbuild.core.places import log_dir
from envbuild.core.platforms import MACHINE, platform_ref
from envbuild.core.redact import redact
from envbuild.core.store import ResultStore
from envbuild.engine.interface import Engine, ImageInfo
from envbuild.lock.lockfile import pin_changes, pins
from envbuild.net.bounded import printable
from envbuild.net.credentials import docker_auth_config
from envbuild.net.proxy import with_direct

log = logging.getLogger(__name__)


def check_base(knowledge: Knowledge, entry: Entry, probe: BaseProbe) -> None:
    """Refuse a base whose Python or OS cannot give this entry what it asks for."""
    if probe.python is not None:
        if probe.python != entry.python:
            msg = (
                f"base image {probe.ref} brings Python {probe.python}, but {entry.id} needs "
                f"{entry.python}; use --python {probe.python} or a base with Python {entry.python}"
            )
            raise BadInput(msg)
        return
    base = knowledge.os_bases.get(entry.os)
    if base is None or probe.os_codename != base.codename:
        msg = (
            f"base image {probe.ref} is {probe.os_id} {probe.os_codename} without python3, but "
            f"{entry.id} is for {entry.os}; pass --os matching the base, or a base with Python "
            f"{entry.python}"
        )
        raise BadInput(msg)
    if base.python != entry.python:
        msg = (
            f"base image {probe.ref} has no python3 and {entry.os} provides Python {base.python}, "
            f"but {entry.id} needs {entry.python}; use --python {base.python}"
        )
        raise BadInput(msg)


def prepare(
    engine: Engine,
    knowledge: Knowledge,
    entry: Entry,
    options: BuildOptions,
    probes: dict[str, BaseProbe] | None,
    lock: Lock,
) -> BuildContext:
    """Probe the base image (once per reference in `probes`), check it fits, render the context
    that installs `lock`."""
    probe = probe_entry_base(engine, knowledge, entry, options, {} if probes is None else probes)
    context = render_entry(entry, options, probe, lock)
    if MACHINE[entry.platform] == os.uname().machine:
        return context
    # The install step runs uv in the image: the host's build of it cannot run there.
    served = dataclasses.replace(context.served, uv=uv_for(entry.platform, options))
    return dataclasses.replace(context, served=served)


def probe_entry_base(
    engine: Engine,
    knowledge: Knowledge,
    entry: Entry,
    options: BuildOptions,
    probes: dict[str, BaseProbe],
) -> BaseProbe:
    """The entry's base image probed (once per reference in `probes`) and checked to fit it.

    For a platform other than linux/amd64 the base is REF-arm64 where the engine has it (what
    `base bootstrap --platform` tags), else REF itself, which must then be of that platform."""
    base_ref = platform_base(engine, options.base_image or entry.base_image, entry.platform)
    if base_ref not in probes:
        probes[base_ref] = engine.probe_base(base_ref, entry.platform)
    check_base(knowledge, entry, probes[base_ref])
    check_base_platform(entry, probes[base_ref], options.base_image or entry.base_image)
    if options.offline and probes[base_ref].python is None:
        msg = (
            f"--offline: base image {base_ref} has no python3, and a build with no route off "
            "the host cannot install the OS's; use a base with it (`envbuild base bootstrap "
            "--with-python`) or drop --offline"
        )
        raise BadInput(msg)
    return probes[base_ref]


def platform_base(engine: Engine, ref: str, platform: str) -> str:
    """The reference of `ref`'s image for `platform`: its platform tag (corp/base:bookworm-arm64)
    when the engine holds one, else `ref`."""
    tagged = platform_ref(ref, platform)
    return tagged if tagged != ref and engine.image(tagged) is not None else ref


def check_base_platform(entry: Entry, probe: BaseProbe, asked: str) -> None:
    """Refuse a base of another platform: Docker's builders label the image with the base's
    platform whatever they are asked, so an arm64 entry on an amd64 base builds amd64 binaries."""
    if probe.platform == entry.platform:
        return
    made = platform_ref(asked, entry.platform)
    msg = (
        f"base image {probe.ref} is {probe.platform}, but {entry.id} is for {entry.platform}; "
        f"make one with `envbuild base bootstrap --platform {entry.platform} --tag {asked}` "
        f"(tagged {made}), or pass a {entry.platform} --base-image"
    )
    raise BadInput(msg)


def _built_before(
    engine: Engine, store: ResultStore, content_hash: str, label: str = label_keys.CONTENT_HASH
) -> ImageInfo | None:
    """The newest image envbuild built for this content hash (or framework key, under its
    `label`) that this engine still has.

    Found by an image id recorded at build time, never by the label alone: an image built FROM
    an envbuild image inherits that label and is not ours. Another engine's build of the same
    hash (one data folder, two engines) is another record, not a reason to build again here.
    """
    for record in store.built_images(content_hash):
        image = engine.image(record.image_id)
        if image is not None and image.labels.get(label) == content_hash:
            return image
    return None


def build_entry(
    engine: Engine,
    context: BuildContext,
    *,
    store: ResultStore,
    on_line: Callable[[str], None] = lambda line: None,
    on_note: Callable[[str], None] = lambda note: None,
    no_cache: bool = False,
    proxy: ProxySettings | None = None,
    framework_from: str | None = None,
) -> BuiltImage:
    """Build one rendered entry, or find the image envbuild built for its content hash; tag it.

    An entry with a framework image is built FROM it: the one this engine has for its key, else
    the one the registry holds as `framework_from`, else built first (`on_note` says which).
    `proxy` reaches the RUN steps as Docker's predefined proxy arguments, with the build
    server's address in NO_PROXY; an --offline build gets none (it has no route off the host)."""
    entry = context.entry
    start = time.monotonic()
    started = datetime.now(UTC)
    existing = None if no_cache else _built_before(engine, store, context.content_hash)
    if existing is not None:
        return _found(engine, entry, existing, start)
    logs = log_dir()
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{entry.id}.log"
    # A fresh file moved into place before the first line: two runs building the same entry on
    # one machine (parallel CI jobs) never write into one file; the later one owns the name.
    writing = logs / f".{entry.id}.{run_id()}.{threading.get_ident()}.log"
    note = ""
    with writing.open("w", encoding="utf-8", buffering=1) as log_file:
        writing.replace(log_path)

        def record(line: str) -> None:
            line = redact(line)
            log_file.write(line + "\n")
            on_line(line)

        try:
            framework = None
            if context.framework_image is not None:
                framework, note = have_framework(
                    engine, context, store, record, no_cache=no_cache, proxy=proxy,
                    remote=framework_from,
                )  # fmt: skip
                record(note)
                on_note(note)
            labels = {**context.labels, "org.opencontainers.image.created": _now()}
            image_id = _build(
                engine, context, record, tag=entry.image, labels=labels, no_cache=no_cache,
                proxy=proxy,
            )  # fmt: skip
            check_built_platform(engine, entry, image_id)
            if framework is not None:
                check_built_on(engine, image_id, framework)
        except BuildFailed as exc:
            msg = f"{entry.id}: build failed: {exc.message} (full log: {log_path})"
            raise BuildFailed(msg) from exc
    store.record_built(context.content_hash, entry.id, entry.image, image_id)
    store.record_provenance(image_id, _build_facts(engine, context, started))
    return BuiltImage(
        entry=entry,
        id=image_id,
        tags=(entry.image,),
        built=True,
        log_path=log_path,
        seconds=time.monotonic() - start,
        framework=note,
    )


_KEY_LOCKS: dict[str, threading.Lock] = {}
_KEY_LOCKS_GUARD = threading.Lock()
# What a framework image found under its reference, not built here, must show it installed:
# every distribution of /opt/venv as name==version, one per line.
_LIST_DISTRIBUTIONS = (
    "import importlib.metadata as m\n"
    "for d in m.distributions():\n"
    "    print(f\"{d.metadata['Name']}=={d.version}\")\n"
)
_LIST_MAX_LINES = 10_000
# The distributions `python3 -m venv` seeds a venv with (pip, and setuptools before Python 3.12),
# which the installer seeds /opt/venv with too (install_env.seed_wheels) where the lock pins none.
VENV_SEEDS = frozenset({"pip", "setuptools"})


def _key_lock(key: str) -> threading.Lock:
    """One lock per framework key: entries built in parallel that share one build it once."""
    with _KEY_LOCKS_GUARD:
        return _KEY_LOCKS.setdefault(key, threading.Lock())


def have_framework(
    engine: Engine,
    context: BuildContext,
    store: ResultStore,
    on_line: Callable[[str], None],
    *,
    no_cache: bool = False,
    proxy: ProxySettings | None = None,
    remote: str | None = None,
) -> tuple[ImageInfo, str]:
    """The context's framework image on this engine, tagged with its reference, and how it was
    had: the image envbuild built for its key here; else one under its reference, or pulled
    from `remote` (host/repository:tag), whose key and installed distributions are the key's;
    else built now. One that does not match (pushed or tagged by hand) is never used: the note
    says why, and the image is built."""
    wanted = context.framework_image
    assert wanted is not None
    name = f"framework {wanted.title} (key {wanted.short})"
    with _key_lock(wanted.key):
        start = time.monotonic()
        refused = ""
        if not no_cache:
            found = _built_before(engine, store, wanted.key, label_keys.FRAMEWORK_KEY)
            if found is not None:
                if wanted.ref not in found.tags:
                    engine.tag(found.id, wanted.ref)
                return found, f"{name}: built before on this engine"
            for where in (wanted.ref, remote):
                if where is None:
                    continue
                local = where == wanted.ref
                candidate = engine.image(where) if local else _pull(engine, context, where)
                if isinstance(candidate, str):
                    refused += f"{where} {candidate}; "
                    continue
                if candidate is None:
                    continue
                problem = framework_problem(engine, wanted, candidate)
                if problem is None:
                    if wanted.ref not in candidate.tags:
                        engine.tag(candidate.id, wanted.ref)
                    store.record_built(wanted.key, name, wanted.ref, candidate.id)
                    said = "found" if local else "from the registry"
                    return candidate, f"{name}: {said} as {where}, its distributions checked"
                refused += f"{where} refused ({problem}); "
            if refused:
                log.warning("%s: %s", name, refused.removesuffix("; "))
        labels = {
            label_keys.FRAMEWORK_KEY: wanted.key,
            label_keys.PLATFORM: context.entry.platform,
        }
        image_id = _build(
            engine, dataclasses.replace(context, dockerfile=wanted.dockerfile), on_line,
            tag=wanted.ref, labels=labels, no_cache=no_cache, proxy=proxy,
            name=f"framework {wanted.key}",
        )  # fmt: skip
        check_built_platform(engine, context.entry, image_id)
        store.record_built(wanted.key, name, wanted.ref, image_id)
        built = engine.image(image_id)
        if built is None:
            msg = f"the engine lost {name} right after building it ({image_id[:19]})"
            raise BuildFailed(msg)
        return built, f"{name}: {refused}built in {time.monotonic() - start:.1f} s"


BUILT_HERE, UNDER_ITS_TAG, ABSENT = "built", "tagged", "absent"


def framework_on_engine(engine: Engine, store: ResultStore, wanted: FrameworkImage) -> str:
    """Where the framework image of `wanted`'s key stands on this engine, as have_framework
    would find it, without checking or changing anything: BUILT_HERE (envbuild built it here and
    would use it as it is), UNDER_ITS_TAG (an image under its reference with the key's label,
    whose distributions a build checks before using it), else ABSENT (a build makes or pulls it)."""
    if _built_before(engine, store, wanted.key, label_keys.FRAMEWORK_KEY) is not None:
        return BUILT_HERE
    found = engine.image(wanted.ref)
    if found is not None and found.labels.get(label_keys.FRAMEWORK_KEY) == wanted.key:
        return UNDER_ITS_TAG
    return ABSENT


def _pull(engine: Engine, context: BuildContext, remote: str) -> ImageInfo | str | None:
    """The framework image pulled from `remote` (host/repository:tag), None where the registry
    has no such tag, or why the pull failed."""
    try:
        return engine.pull(
            remote,
            platform=context.entry.platform,
            auth_config=docker_auth_config(remote.partition("/")[0]),
        )
    except EnvbuildError as exc:
        return f"not pulled ({exc.message})"


def framework_problem(engine: Engine, wanted: FrameworkImage, found: ImageInfo) -> str | None:
    """Why the image `found` under the framework image's reference is not it, or None: its key
    label, and the distributions installed in /opt/venv against its lock, name for name and
    version for version."""
    key = found.labels.get(label_keys.FRAMEWORK_KEY)
    if key is None:
        return f"it has no {label_keys.FRAMEWORK_KEY} label"
    if key != wanted.key:
        return f"its key label is {shown(key, 16)}, not {wanted.short}"
    try:
        result = engine.run(
            found.id, ["/opt/venv/bin/python", "-c", _LIST_DISTRIBUTIONS], timeout=120
        )
    except EngineFailed as exc:  # the engine could not start it: no /opt/venv/bin/python
        # What the engine said, without the advice about DOCKER_HOST: its end names the cause.
        said = exc.message.split("; check that DOCKER_HOST", 1)[0]
        return f"listing its distributions failed: it did not start (…{printable(said[-160:])})"
    if result.exit_code != 0:
        return f"listing its distributions failed ({shown(result.stderr.strip(), 120)})"
    lines = result.stdout.splitlines()
    if len(lines) > _LIST_MAX_LINES:
        return f"it lists more than {_LIST_MAX_LINES} distributions"
    locked = pins(wanted.lock)
    installed: dict[str, str] = {}
    for line in lines:
        name, _, version = line.partition("==")
        canonical = canonicalize_name(name)
        if canonical in VENV_SEEDS and canonical not in locked:
            continue  # what `python3 -m venv` seeds every venv with, as the installer does
        installed[canonical] = version.strip()
    changes = pin_changes(locked, installed)
    if changes:
        more = f" and {len(changes) - 3} more" if len(changes) > 3 else ""
        shown_changes = ", ".join(printable(change, 120) for change in changes[:3])
        return f"its distributions differ from framework.lock: {shown_changes}{more}"
    return None


def check_built_on(engine: Engine, image_id: str, framework: ImageInfo) -> None:
    """BuildFailed unless the image's layers start with the framework image's: built FROM a
    reference, it must have got the image that was checked, not one tagged there since."""
    image = engine.image(image_id)
    layers = image.layers if image is not None else ()
    if layers[: len(framework.layers)] != framework.layers:
        msg = (
            f"the image is not built on the framework image {framework.id[:19]} it was checked "
            "against (its reference moved during the build?); build again"
        )
        raise BuildFailed(msg)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_built_platform(engine: Engine, entry: Entry, image_id: str) -> None:
    """BuildFailed unless the image's config records the entry's platform: neither of Docker's
    builders checks a local base's, so a mislabelled base gives binaries of one platform
    labelled as another, and an image that would run (or be published) as the wrong one."""
    image = engine.image(image_id)
    recorded = image.platform if image is not None else "nothing (the image is gone)"
    if recorded != entry.platform:
        msg = (
            f"the engine built an image recorded as {recorded} for a {entry.platform} entry; "
            "check that the base image's platform is the entry's (docker image inspect "
            "--format '{{.Os}}/{{.Architecture}}' BASE)"
        )
        raise BuildFailed(msg)


def _build_facts(engine: Engine, context: BuildContext, started: datetime) -> dict[str, Any]:
    """What the image's signed provenance will say about this build (publish/attestations)."""
    base = engine.image(context.base_image)
    return {
        "base_image": context.base_image,
        "base_image_id": base.id if base is not None else None,
        "dockerfile_sha256": hashlib.sha256(context.dockerfile.encode()).hexdigest(),
        "installer": f"{INSTALLER_NAME} sha256:{hashlib.sha256(INSTALLER.read_bytes()).hexdigest()}",
        "started": started.isoformat(),
        "finished": datetime.now(UTC).isoformat(),
        "invocation": run_id(),
        "builder": context.builder,
    }


def _found(engine: Engine, entry: Entry, existing: ImageInfo, start: float) -> BuiltImage:
    """The image envbuild built before for this content, its tag restored if it was moved."""
    tagged = engine.image(entry.image)
    moved_from = tagged.id if tagged is not None and tagged.id != existing.id else None
    if moved_from is not None:
        log.warning(
            "%s pointed at %s, not at %s that envbuild built for it; tag restored",
            entry.image, moved_from[:19], existing.id[:19],
        )  # fmt: skip
    if tagged is None or moved_from is not None:
        engine.tag(existing.id, entry.image)
    return BuiltImage(
        entry=entry,
        id=existing.id,
        tags=tuple(dict.fromkeys((*existing.tags, entry.image))),
        built=False,
        log_path=None,
        seconds=time.monotonic() - start,
        tag_restored_from=moved_from,
    )


def serves(dockerfile: str) -> bool:
    """Whether a classic build of `dockerfile` needs envbuild's build server: whether it takes
    the server's URL (`ARG ENVBUILD_SERVE`). One that installs nothing (an entry whose packages
    are all its framework image's, templates/partials/install.j2) does not, and is not given
    the argument, which the classic builder would say went unused."""
    return re.search(rf"(?m)^ARG {SERVE_ARG}$", dockerfile) is not None


def _build(
    engine: Engine,
    context: BuildContext,
    on_line: Callable[[str], None],
    *,
    tag: str,
    labels: dict[str, str],
    no_cache: bool,
    proxy: ProxySettings | None,
    name: str = "",
) -> str:
    """The engine's build of a context written to a scratch folder, tagged `tag` and labelled
    `labels` (and envbuild's version), with its inputs as BuildKit mounts or served for the
    build's duration (the classic builder); the image id. `name`: whose BuildKit context
    folder it is (the entry's id unless given)."""
    labels = {**labels, label_keys.VERSION: __version__}
    network = not context.offline
    with tempfile.TemporaryDirectory(prefix=scratch_prefix("context")) as tmp:
        if context.builder == BUILDKIT:
            # A folder per content: BuildKit takes a file of the last context sent from the same
            # path as unchanged when its size and time are (and the context's are fixed, EPOCH),
            # so a lock or Dockerfile changed at the same size would be built stale.
            identity = hashlib.sha256(
                b"\0".join(
                    text.encode()
                    for text in (
                        context.dockerfile,
                        context.lock.text if context.lock else "",
                        context.framework_lock,
                        INSTALLER.read_text(encoding="utf-8"),
                    )
                )
            ).hexdigest()
            with kept_context(f"{name or context.entry.id} {identity}", Path(tmp)) as folder:
                write_context(context, folder)
                secrets = write_mounted(context, folder, Path(tmp) / "secrets")
                return engine.build(
                    folder, tag=tag, labels=labels, build_args=context.build_args,
                    on_line=on_line, network=network, no_cache=no_cache,
                    proxy=proxy if proxy is not None and not proxy.empty and network else None,
                    builder=BUILDKIT, secrets=secrets, platform=context.entry.platform,
                )  # fmt: skip
        folder = Path(tmp) / "context"
        write_context(context, folder)
        # The server lives exactly as long as the build: its URL, kept in the image history by
        # the classic builder, names a closed port afterwards. A build that installs nothing
        # has none, and no proxy.
        server: contextlib.AbstractContextManager[str] = contextlib.nullcontext("")
        gateway = ""
        if serves(context.dockerfile):
            gateway = engine.bridge_gateway(network=network)
            server = serve_build(gateway, context.served)
        with server as url:
            return engine.build(
                folder,
                tag=tag,
                labels=labels,
                build_args={**context.build_args, **({SERVE_ARG: url} if url else {})},
                on_line=on_line,
                network=network,
                no_cache=no_cache,
                proxy=(
                    with_direct(proxy, gateway)
                    if url and proxy is not None and not proxy.empty and network
                    else None
                ),
                platform=context.entry.platform,
            )
