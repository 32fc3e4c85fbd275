"""Entry → BuildContext: the Dockerfile from templates/, the files it copies, the content hash."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import re
import shutil
import stat
from pathlib import Path

import jinja2
from packaging.requirements import Requirement

from envbuild import labels
from envbuild.errors import BadInput
from envbuild.knowledge import cuda_tag
from envbuild.models import CPU, BaseProbe, BuildContext, BuildOptions, Entry
from envbuild.references import image_reference_problem, index_url_problem, redact_url, shown
from envbuild.resources import templates_dir

_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-(?P<python>[^-]+)-[^-]+-[^-]+\.whl$")
CA_NAME = "envbuild/ca.crt"
CA_MAX_BYTES = 10 * 1024 * 1024
PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
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


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _wanted(entry: Entry) -> tuple[str, str]:
    """The framework package's normalized name and pinned version ("torch", "2.13.0+cpu")."""
    requirement = Requirement(entry.install.requirement)
    pins = [spec.version for spec in requirement.specifier if spec.operator == "=="]
    return _normalize(requirement.name), pins[0] if pins else ""


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
        # O_NONBLOCK: a FIFO swapped in after the check must not hang the read.
        fd = os.open(resolved, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                msg = f"{where}: not a regular file; pass a PEM bundle"
                raise BadInput(msg)
            data = handle.read(CA_MAX_BYTES + 1)
    except OSError as exc:
        msg = f"{where}: cannot read it ({exc.strerror}); pass a readable PEM bundle"
        raise BadInput(msg) from exc
    if len(data) > CA_MAX_BYTES:
        msg = f"{where}: larger than {CA_MAX_BYTES // (1024 * 1024)} MiB; pass a PEM bundle"
        raise BadInput(msg)
    if PEM_CERTIFICATE not in data:
        msg = (
            f"{where}: holds no PEM certificate ({PEM_CERTIFICATE.decode()}); "
            "pass the PEM bundle your proxy or index is signed by"
        )
        raise BadInput(msg)
    return resolved


def wheelhouse_files(entry: Entry, wheelhouse: Path) -> tuple[list[Path], bool]:
    """The wheelhouse files to give this entry's build, and whether they hold its framework wheel.

    Framework wheels of other versions or variants are left out: pip would otherwise be free
    to prefer a `+cpu` wheel over the PyPI CUDA build of the same version.
    """
    _wheelhouse(wheelhouse)
    package, wanted = _wanted(entry)
    python_tag = "cp" + entry.python.replace(".", "")
    files: list[Path] = []
    has_framework = False
    for path in sorted(wheelhouse.iterdir()):
        if not path.is_file():
            continue
        match = _WHEEL.match(path.name)
        if match and _normalize(match["name"]) == package:
            if match["version"] != wanted:
                continue
            tags = match["python"].split(".")
            # A pure wheel (jax) fits every Python 3; a binary one must be for this Python.
            has_framework = has_framework or python_tag in tags or "py3" in tags
        files.append(path)
    return files, has_framework


def _hash(base_id: str, dockerfile: str, files: tuple[tuple[str, Path], ...]) -> str:
    digest = hashlib.sha256()
    digest.update(f"base {base_id}\n".encode())
    digest.update(dockerfile.encode())
    for name, path in files:
        if name == CA_NAME:
            continue  # how to reach an index, not what the image holds
        # Wheels are named by name, version and tags; their size guards against a rebuilt file.
        digest.update(f"\nfile {name} {path.stat().st_size}".encode())
    return digest.hexdigest()


def render_entry(
    entry: Entry, options: BuildOptions, base: BaseProbe | None = None
) -> BuildContext:
    """Render one entry's Dockerfile and gather its context files; no Docker involved.

    Context files are the real files behind any links: a link would dangle inside the build.
    """
    base_image = options.base_image or entry.base_image
    _check_template_values(entry, base_image)
    files: list[tuple[str, Path]] = []
    if options.ca_bundle is not None:
        files.append((CA_NAME, _regular_file(options.ca_bundle, "--ca-bundle")))
    wheels_hold_framework = False
    if options.wheelhouse is not None:
        wheels, wheels_hold_framework = wheelhouse_files(entry, options.wheelhouse)
        files += [
            (
                f"envbuild/wheelhouse/{w.name}",
                _regular_file(w, "--wheelhouse", "check the wheelhouse"),
            )
            for w in wheels
        ]
    if options.offline and not wheels_hold_framework:
        msg = (
            f"--offline: the wheelhouse holds no {entry.install.requirement} wheel for "
            f"Python {entry.python}; add it to --wheelhouse or drop --offline"
        )
        raise BadInput(msg)
    framework_index = None
    if entry.install.index_url and not wheels_hold_framework and not options.offline:
        framework_index = entry.install.index_url
    index_args = []
    if options.index_url:
        index_args.append("PIP_INDEX_URL")
    if options.extra_index_urls:
        index_args.append("PIP_EXTRA_INDEX_URL")
    values = {
        "entry": entry,
        "base_image": base_image,
        "cuda_label": "CPU" if entry.cuda == CPU else f"CUDA {entry.cuda}, {cuda_tag(entry.cuda)}",
        "python_from_os": base is not None and base.python is None,
        "index_args": index_args,
        "has_helpers": bool(files),
        "ca_bundle": options.ca_bundle is not None,
        "wheelhouse": options.wheelhouse is not None,
        "offline": options.offline,
        "framework_index": framework_index,
        "label": labels.TEMPLATE_KEYS,
    }
    environment = _environment()
    dockerfile = environment.get_template("Dockerfile.j2").render(values)
    runtime_stage = environment.get_template("runtime.j2").render(values)
    build_args = {}
    if options.index_url:
        build_args["PIP_INDEX_URL"] = options.index_url
    if options.extra_index_urls:
        build_args["PIP_EXTRA_INDEX_URL"] = " ".join(options.extra_index_urls)
    frozen_files = tuple(files)
    content_hash = _hash(base.image_id if base else base_image, dockerfile, frozen_files)
    return BuildContext(
        entry=entry,
        base_image=base_image,
        dockerfile=dockerfile,
        runtime_stage=runtime_stage,
        files=frozen_files,
        build_args=build_args,
        content_hash=content_hash,
        labels={labels.CONTENT_HASH: content_hash},
        offline=options.offline,
    )


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


def write_context(
    context: BuildContext, root: Path, name: str = "", *, link_wheels: bool = False
) -> Path:
    """Lay the Dockerfile and its files out in `root`/`name`; return that folder.

    Nothing below `root` is followed: links found there are replaced by real folders and
    files, so a planted link cannot make envbuild write elsewhere. Files are copies, so editing
    the review copy never edits the original; `link_wheels` lets a build in a fresh temporary
    folder hard-link the (large, read-only) wheels instead. The CA bundle is always copied.
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
        with os.fdopen(_new_file(top, "Dockerfile"), "w", encoding="utf-8") as handle:
            handle.write(context.dockerfile)
        for target, source in context.files:
            *folders, filename = _parts(target)
            parent = folder((*parts, *folders))
            _place(source, parent, filename, link=link_wheels and target != CA_NAME)
    finally:
        for fd in opened.values():
            os.close(fd)
    return root.joinpath(*parts)


def _place(source: Path, parent: int, name: str, *, link: bool) -> None:
    if link:
        _remove(parent, name)
        try:
            os.link(source, name, dst_dir_fd=parent, follow_symlinks=True)
        except OSError:
            pass  # another file system: copy
        else:
            return
    with source.open("rb") as src, os.fdopen(_new_file(parent, name), "wb") as dst:
        shutil.copyfileobj(src, dst, 1024 * 1024)
