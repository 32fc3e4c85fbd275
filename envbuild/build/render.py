"""Entry + Lock → BuildContext: the Dockerfile from templates/, its context files, the content hash.

The context holds the Dockerfile, envbuild.lock and the installer script, nothing else: what
the install fetches but the image must not hold (CA bundle, index URLs, uv, the wheelhouse) is
described in `BuildContext.served` and served by envbuild/build/server.py during the build."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import shutil
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2

from envbuild.core import labels
from envbuild.core.errors import BadInput
from envbuild.core.files import FileTooLarge, NotRegularFile, read_small_file
from envbuild.core.models import (
    BUILDKIT,
    CPU,
    IMAGE_HOME,
    IMAGE_UID,
    IMAGE_USER,
    NO_FRAMEWORK_INDEX,
    ROOT_USER,
    USER_CHOICES,
    BaseProbe,
    BuildContext,
    BuildOptions,
    Entry,
    FrameworkImage,
    Lock,
    ServedInputs,
)
from envbuild.core.names import image_reference_problem, index_url_problem, redact_url, shown
from envbuild.core.resources import templates_dir
from envbuild.core.versions import cuda_tag
from envbuild.lock.lockfile import cuda_part, framework_part, pins
from envbuild.lock.wheelhouse import framework_index as framework_from
from envbuild.lock.wheelhouse import has_framework_wheel, wheelhouse_files
from envbuild.payload import install_env

if TYPE_CHECKING:
    pass

LOCK_NAME = "envbuild.lock"  # in the context; the image keeps it at /opt/venv/envbuild.lock
# The lock's framework part, in the context: installed first, in layers of its own.
FRAMEWORK_LOCK_NAME = "framework.lock"
# The framework image's Dockerfile beside the entry's, in a context written for review.
FRAMEWORK_DOCKERFILE = "framework.Dockerfile"
# Where framework images are kept on an engine, tagged <framework>-<version>-<key prefix>.
FRAMEWORK_REPOSITORY = "envbuild/framework"
# The CUDA libraries as wheels (torch's, JAX's and TensorFlow's nvidia-*-cu12 and -cu13): when a
# lock pins them, they are installed in a layer of their own, lowest, from their own lock file
# (templates/partials/install.j2), so that framework releases pinning the same ones share it.
CUDA_LIBRARIES = "nvidia-*"
CUDA_LOCK_NAME = "cuda.lock"
INSTALLER_NAME = "install_env.py"
INSTALLER = Path(__file__).resolve().parents[1] / "payload" / INSTALLER_NAME
LOCK_MAX_BYTES = 16 * 1024 * 1024
CA_MAX_BYTES = 10 * 1024 * 1024
PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
# With BuildKit, what the install RUN mounts (install_env.mounted_inputs reads it under
# BUILDKIT_ROOT): the secrets' ids, the context folder of uv and the wheelhouse, uv's cache.
BUILDKIT_ROOT = "/run/envbuild"
CONFIG_SECRET = "envbuild-config"
CA_SECRET = "envbuild-ca"
INPUTS_DIR = "envbuild-inputs"
# uv and the wheels of the lock's framework part alone: what the framework's RUNs bind, so that
# BuildKit's cache of them does not change with the team's packages.
FRAMEWORK_INPUTS_DIR = "envbuild-framework-inputs"
# uv's cache mounts: the framework's part (and a whole lock) in one, the team's packages in
# another. BuildKit makes the first build to mount a cache that another build has just filled
# wait in proportion to what it holds, before any step starts (measured: 1.5 s for the torch CPU
# framework's, 4.2 s for 600 MB in 40,000 files; a second use, or a later step of the same
# build, waits nothing). In one mount, every team build after a framework build paid that wait;
# a team's RUN now meets only the team packages' cache, and loses nothing: it installs none of
# the framework's packages.
UV_CACHE = "envbuild-uv"
TEAM_UV_CACHE = "envbuild-uv-team"
# The modification time of every file the install steps change and of every file in the context
# (COPY keeps a file's time): 1980-01-01, the earliest a wheel's zip can hold. A layer's digest
# hashes a tar that holds each file's time; fixed times make the framework's layers the same
# bytes wherever and whenever the same lock is built on the same layers.
EPOCH = 315532800
# What may reach the Dockerfile inside quotes or after FROM/LABEL: no quote, backslash,
# variable, newline or other control character.
_TEMPLATE_SAFE = re.compile(r"[A-Za-z0-9 _.,:;/@=+()\[\]<>!~*-]*")


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.do"],
        autoescape=False,
    )


def check_options(options: BuildOptions) -> BuildOptions:
    """Refuse build options that cannot be used, each naming its option; resolve the CA bundle.

    Every string here reaches a Dockerfile or a build argument, every file a build context.
    """
    if options.base_image is not None:
        problem = image_reference_problem(options.base_image)
        if problem is not None:
            msg = (
                f"--base-image {shown(options.base_image)}: {problem}; give an image reference "
                "such as python:3.11-slim-bookworm, registry.example.com/team/base:1 or sha256:<id>"
            )
            raise BadInput(msg)
    urls = [("--index-url", options.index_url)] if options.index_url is not None else []
    urls += [("--extra-index-url", url) for url in options.extra_index_urls]
    if options.framework_index not in (None, NO_FRAMEWORK_INDEX):
        urls.append(("--framework-index", options.framework_index))
    for option, url in urls:
        problem = index_url_problem(url)
        if problem is not None:
            msg = (
                f"{option} {shown(redact_url(url))}: {problem}; "
                "give an http(s) URL such as https://mirror.example/simple"
            )
            raise BadInput(msg)
    if options.wheelhouse is not None:
        _wheelhouse(options.wheelhouse)
    if options.ca_bundle is None:
        return options
    return dataclasses.replace(options, ca_bundle=check_ca_bundle(options.ca_bundle))


def _wheelhouse(wheelhouse: Path) -> None:
    try:
        is_dir = wheelhouse.is_dir()
    except (OSError, ValueError):
        is_dir = False
    if not is_dir:
        msg = f"--wheelhouse {shown(str(wheelhouse))}: not a directory; pass a folder of .whl files"
        raise BadInput(msg)


def _regular_file(path: Path, option: str, fix: str = "pass a PEM bundle") -> Path:
    """`path` with every link resolved; BadInput unless it ends at a regular file."""
    try:
        resolved = path.resolve(strict=True)
        mode = resolved.stat().st_mode
    except (OSError, RuntimeError, ValueError) as exc:  # RuntimeError: a link loop
        loop = isinstance(exc, RuntimeError)
        reason = "a loop of links" if loop else getattr(exc, "strerror", None) or "no such file"
        msg = f"{option} {shown(str(path))}: {reason.lower()}; {fix}"
        raise BadInput(msg) from exc
    if not stat.S_ISREG(mode):
        msg = f"{option} {shown(str(path))}: not a regular file; {fix}"
        raise BadInput(msg)
    return resolved


def check_ca_bundle(path: Path) -> Path:
    """The CA bundle's real file, once it is known to be a readable PEM bundle of sane size."""
    resolved = _regular_file(path, "--ca-bundle")
    where = f"--ca-bundle {shown(str(path))}"
    try:
        data = read_small_file(resolved, CA_MAX_BYTES, follow_links=False)
    except NotRegularFile:
        msg = f"{where}: not a regular file; pass a PEM bundle"
        raise BadInput(msg) from None
    except FileTooLarge:
        msg = f"{where}: larger than {CA_MAX_BYTES // (1024 * 1024)} MiB; pass a PEM bundle"
        raise BadInput(msg) from None
    except OSError as exc:
        msg = f"{where}: cannot read it ({exc.strerror}); pass a readable PEM bundle"
        raise BadInput(msg) from exc
    if PEM_CERTIFICATE not in data:
        msg = (
            f"{where}: holds no PEM certificate ({PEM_CERTIFICATE.decode()}); "
            "pass the PEM bundle your proxy or index is signed by"
        )
        raise BadInput(msg)
    return resolved


def check_lock(lock: Lock) -> None:
    """Refuse a lock the image cannot install as it is: too big, or carrying pip options (an
    `--index-url` or `-r` line would change where packages come from or what is read)."""
    where = f"lock {shown(str(lock.path or lock.entry_id))}"
    if len(lock.text.encode()) > LOCK_MAX_BYTES:
        msg = (
            f"{where}: larger than {LOCK_MAX_BYTES // (1024 * 1024)} MiB; run `envbuild lock` again"
        )
        raise BadInput(msg)
    for number, line in enumerate(lock.text.splitlines(), 1):
        stripped = line.strip()
        if "\0" in line or (stripped.startswith("-") and not stripped.startswith("--hash=")):
            msg = (
                f"{where}:{number}: {shown(stripped, 40)} is not a pinned requirement or its "
                "hash; locks hold only `name==version --hash=...`: run `envbuild lock` again"
            )
            raise BadInput(msg)


def _hash(base_id: str, *parts: str | bytes) -> str:
    """What names an image: the base and every text and file it is built from (the Dockerfiles,
    the lock, the installer). Never the CA bundle or the index settings (how to reach a package,
    not what is installed) nor the wheelhouse (the lock's hashes already fix every file the
    image gets)."""
    digest = hashlib.sha256()
    for part in (f"base {base_id}", *parts):
        data = part.encode() if isinstance(part, str) else part
        digest.update(f"{len(data)}\n".encode())
        digest.update(data)
    return digest.hexdigest()


def render_entry(
    entry: Entry, options: BuildOptions, base: BaseProbe | None, lock: Lock
) -> BuildContext:
    """Render one entry's Dockerfile for its lock and gather what its build is served; no
    Docker involved. `base` is the probed base image (None: assume it brings Python), its
    reference the one for the entry's platform."""
    base_image = base.ref if base is not None else options.base_image or entry.base_image
    _check_template_values(entry, base_image)
    check_lock(lock)
    ca_bundle = None
    if options.ca_bundle is not None:
        ca_bundle = _regular_file(options.ca_bundle, "--ca-bundle")
    wheels: tuple[Path, ...] = ()
    if options.wheelhouse is not None:
        _wheelhouse(options.wheelhouse)
        wheels = wheelhouse_files(options.wheelhouse)
    wheels_hold_framework = has_framework_wheel(entry, wheels)
    if options.offline and not wheels_hold_framework:
        msg = (
            f"--offline: the wheelhouse holds no {entry.install.requirement} wheel for "
            f"Python {entry.python}; add it to --wheelhouse or drop --offline"
        )
        raise BadInput(msg)
    framework_index = framework_from(entry, options)
    framework = framework_part(lock.text)
    # What the first install step installs (the framework part, or the whole lock): its CUDA
    # libraries go below it.
    cuda = cuda_part(framework or lock.text, CUDA_LIBRARIES)
    extra_index_urls = options.extra_index_urls + ((framework_index,) if framework_index else ())
    served = ServedInputs(
        ca_bundle=ca_bundle,
        wheels=wheels,
        index_url=None if options.offline else options.index_url,
        extra_index_urls=() if options.offline else extra_index_urls,
        offline=options.offline,
    )
    values = {
        "entry": entry,
        "base_image": base_image,
        "cuda_label": "CPU" if entry.cuda == CPU else f"CUDA {entry.cuda}, {cuda_tag(entry.cuda)}",
        "python_from_os": base is not None and base.python is None,
        "framework_index": framework_index,
        "lock_digest": lock.digest,
        "label": labels.TEMPLATE_KEYS,
        # torch's DataLoader workers hand batches over through /dev/shm.
        "run_shm_size": labels.TORCH_SHM_SIZE if entry.framework == "torch" else "",
        "user": _user_values(entry),
        "cuda_libraries": CUDA_LIBRARIES if cuda else None,
        "cuda_lock": CUDA_LOCK_NAME,
        "buildkit": _buildkit_values() if options.builder == BUILDKIT else None,
        "framework_lock": FRAMEWORK_LOCK_NAME if framework else None,
        # How many of the lock's pins the team's step installs above the framework image.
        "team_packages": len(pins(lock.text).items() - pins(framework).items()) if framework else 0,
        "epoch": EPOCH,
        "bytecode": entry.bytecode,
    }
    environment = _environment()
    base_id = base.image_id if base else base_image
    installer = INSTALLER.read_bytes()
    image = None
    if framework:
        text = environment.get_template("framework.j2").render(values)
        image = framework_image(entry, text, framework, _hash(base_id, text, framework, installer))
    dockerfile = environment.get_template("Dockerfile.j2").render(
        {**values, "framework_image": image}
    )
    runtime_stage = environment.get_template("runtime.j2").render(values)
    content_hash = _hash(
        base_id, image.dockerfile if image else "", dockerfile, lock.text, installer
    )
    return BuildContext(
        entry=entry,
        base_image=base_image,
        dockerfile=dockerfile,
        runtime_stage=runtime_stage,
        files=((INSTALLER_NAME, INSTALLER),),
        build_args={},
        content_hash=content_hash,
        # The lock digest is in the Dockerfile; the platform is the base's (its id is hashed).
        labels={labels.CONTENT_HASH: content_hash, labels.PLATFORM: entry.platform},
        offline=options.offline,
        lock=lock,
        served=served,
        builder=options.builder,
        framework_lock=framework,
        framework_image=image,
        cuda_lock=cuda,
    )


def framework_image(entry: Entry, dockerfile: str, lock: str, key: str) -> FrameworkImage:
    """The framework image of `key` (the hash of its base's id, `dockerfile`, `lock` and the
    installer), named FRAMEWORK_REPOSITORY:<framework>-<version>-<key>: one name for every
    entry with that key, whatever its repository, so that the entry's Dockerfile (its FROM),
    and so its content hash, stay the same when only the repository it is tagged in differs."""
    version = pins(lock).get(entry.framework, entry.framework_version)
    title = f"{entry.framework} {version}"
    readable = re.sub(r"[^A-Za-z0-9_.-]", "-", f"{entry.framework}-{version}")[:60]
    return FrameworkImage(
        key=key,
        ref=f"{FRAMEWORK_REPOSITORY}:{readable}-{key[:32]}",
        dockerfile=dockerfile,
        lock=lock,
        title=title,
    )


def _buildkit_values() -> dict[str, object]:
    """What partials/install.j2 needs for BuildKit: each install part's RUN mounts (by its
    `part`: framework, team, whole) and their root."""
    root = BUILDKIT_ROOT
    secrets, inputs = f"{root}/{install_env.SECRETS_DIR}", f"{root}/{install_env.INPUTS_DIR}"

    def mounts(bound: str, cache: str) -> str:
        return " \\\n    ".join((
            f"--mount=type=secret,id={CONFIG_SECRET},target={secrets}/{install_env.CONFIG_NAME}",
            f"--mount=type=secret,id={CA_SECRET},target={secrets}/{install_env.CA_NAME}",
            f"--mount=type=bind,source={bound},target={inputs}",
            f"--mount=type=cache,id={cache},target={root}/{install_env.CACHE_DIR}",
        ))  # fmt: skip

    return {
        "root": root,
        "mounts": {
            "framework": mounts(FRAMEWORK_INPUTS_DIR, UV_CACHE),
            "team": mounts(INPUTS_DIR, TEAM_UV_CACHE),
            "whole": mounts(INPUTS_DIR, UV_CACHE),
        },
    }


def _user_values(entry: Entry) -> dict[str, object]:
    """What partials/user.j2 needs: root or not, and the non-root user's name, ids and HOME."""
    root = entry.user == ROOT_USER
    return {
        "root": root,
        "name": IMAGE_USER,
        "uid": IMAGE_UID,
        "home": IMAGE_HOME,
        "spec": entry.user_spec,
    }


def _check_template_values(entry: Entry, base_image: str) -> None:
    """Defence in depth: what FROM and LABEL lines receive is checked here, whoever made it."""
    for what, reference in (("base image", base_image), ("image", entry.image)):
        problem = image_reference_problem(reference)
        if problem is not None:
            msg = f"{what} {shown(reference)} of {shown(entry.id)}: {problem}"
            raise BadInput(msg)
    values = {
        "id": entry.id, "framework": entry.framework, "framework_version": entry.framework_version,
        "cuda": entry.cuda, "cudnn": entry.cudnn or "", "nccl": entry.nccl or "",
        "python": entry.python, "os": entry.os, "requirement": entry.install.requirement,
        "index_url": entry.install.index_url or "",
    }  # fmt: skip
    if entry.user not in USER_CHOICES:
        msg = (
            f"entry {shown(entry.id)}: user {shown(entry.user)}: choose {' or '.join(USER_CHOICES)}"
        )
        raise BadInput(msg)
    for field, value in values.items():
        if not _TEMPLATE_SAFE.fullmatch(value):
            msg = f"entry {shown(entry.id)}: {field} {shown(value)} cannot go into a Dockerfile"
            raise BadInput(msg)


_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def _parts(name: str) -> list[str]:
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        msg = f"context path {shown(name)} is not a plain relative path"
        raise BadInput(msg)
    return parts


def _real_directory(parent: int, name: str) -> int:
    """Open the folder `name` in `parent`, made if missing; a link there is replaced, never followed."""
    try:
        mode = os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode
    except FileNotFoundError:
        os.mkdir(name, 0o755, dir_fd=parent)
    else:
        if stat.S_ISLNK(mode):
            os.unlink(name, dir_fd=parent)
            os.mkdir(name, 0o755, dir_fd=parent)
    return os.open(name, _DIRECTORY_FLAGS, dir_fd=parent)


def _remove(parent: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=parent)


def _new_file(parent: int, name: str) -> int:
    """A fresh file `name` in `parent`: whatever was there (a link, a hard link, a FIFO) is
    removed first, so writing never reaches another file."""
    _remove(parent, name)
    return os.open(name, _NEW_FILE_FLAGS, 0o644, dir_fd=parent)


def write_context(context: BuildContext, root: Path, name: str = "") -> Path:
    """Lay the build context out in `root`/`name`: the Dockerfile, envbuild.lock, the installer,
    for a lock with a framework part, framework.lock and the framework image's Dockerfile, and
    for one with CUDA libraries as wheels, cuda.lock; return that folder. Nothing secret is in
    it (see `BuildContext.served`).

    Nothing below `root` is followed: links found there are replaced by real folders and
    files, so a planted link cannot make envbuild write elsewhere. Files are copies.
    """
    root.mkdir(parents=True, exist_ok=True)
    parts = tuple(_parts(name)) if name else ()
    opened: dict[tuple[str, ...], int] = {(): os.open(root, os.O_RDONLY | os.O_DIRECTORY)}

    def folder(path: tuple[str, ...]) -> int:
        if path not in opened:
            opened[path] = _real_directory(folder(path[:-1]), path[-1])
        return opened[path]

    try:
        top = folder(parts)
        texts = {"Dockerfile": context.dockerfile}
        if context.lock is not None:
            texts[LOCK_NAME] = context.lock.text
        if context.framework_lock:
            texts[FRAMEWORK_LOCK_NAME] = context.framework_lock
        if context.cuda_lock:
            texts[CUDA_LOCK_NAME] = context.cuda_lock
        if context.framework_image is not None:
            texts[FRAMEWORK_DOCKERFILE] = context.framework_image.dockerfile
        for filename, text in texts.items():
            with os.fdopen(_new_file(top, filename), "w", encoding="utf-8") as handle:
                handle.write(text)
                handle.flush()
                os.utime(handle.fileno(), (EPOCH, EPOCH))
        for target, source in context.files:
            *folders, filename = _parts(target)
            parent = folder((*parts, *folders))
            with source.open("rb") as src, os.fdopen(_new_file(parent, filename), "wb") as dst:
                shutil.copyfileobj(src, dst, 1024 * 1024)
                dst.flush()
                os.utime(dst.fileno(), (EPOCH, EPOCH))
    finally:
        for fd in opened.values():
            os.close(fd)
    return root.joinpath(*parts)
