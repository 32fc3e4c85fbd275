"""Entry → BuildContext: the Dockerfile from templates/, the files it copies, the content hash."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

import jinja2
from packaging.requirements import Requirement

from envbuild.errors import BadInput
from envbuild.knowledge import cuda_tag
from envbuild.models import CPU, BaseProbe, BuildContext, BuildOptions, Entry
from envbuild.resources import templates_dir

_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-(?P<python>[^-]+)-[^-]+-[^-]+\.whl$")


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


def wheelhouse_files(entry: Entry, wheelhouse: Path) -> tuple[list[Path], bool]:
    """The wheelhouse files to give this entry's build, and whether they hold its framework wheel.

    Framework wheels of other versions or variants are left out: pip would otherwise be free
    to prefer a `+cpu` wheel over the PyPI CUDA build of the same version.
    """
    if not wheelhouse.is_dir():
        msg = f"--wheelhouse {wheelhouse}: not a directory; pass a folder of .whl files"
        raise BadInput(msg)
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
        if name == "envbuild/ca.crt":
            continue  # how to reach an index, not what the image holds
        # Wheels are named by name, version and tags; their size guards against a rebuilt file.
        digest.update(f"\nfile {name} {path.stat().st_size}".encode())
    return digest.hexdigest()


def render_entry(
    entry: Entry, options: BuildOptions, base: BaseProbe | None = None
) -> BuildContext:
    """Render one entry's Dockerfile and gather its context files; no Docker involved."""
    base_image = options.base_image or entry.base_image
    files: list[tuple[str, Path]] = []
    if options.ca_bundle is not None:
        if not options.ca_bundle.is_file():
            msg = f"--ca-bundle {options.ca_bundle}: no such file; pass a PEM bundle"
            raise BadInput(msg)
        files.append(("envbuild/ca.crt", options.ca_bundle))
    wheels_hold_framework = False
    if options.wheelhouse is not None:
        wheels, wheels_hold_framework = wheelhouse_files(entry, options.wheelhouse)
        files += [(f"envbuild/wheelhouse/{w.name}", w) for w in wheels]
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
    python_from_os = base is not None and base.python is None
    dockerfile = (
        _environment()
        .get_template("Dockerfile.j2")
        .render(
            entry=entry,
            base_image=base_image,
            cuda_label="CPU" if entry.cuda == CPU else f"CUDA {entry.cuda}, {cuda_tag(entry.cuda)}",
            python_from_os=python_from_os,
            index_args=index_args,
            has_helpers=bool(files),
            ca_bundle=options.ca_bundle is not None,
            wheelhouse=options.wheelhouse is not None,
            offline=options.offline,
            framework_index=framework_index,
        )
    )
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
        files=frozen_files,
        build_args=build_args,
        content_hash=content_hash,
        labels={"org.envbuild.content-hash": content_hash},
        offline=options.offline,
    )


def write_context(context: BuildContext, directory: Path) -> Path:
    """Lay the Dockerfile and its files out in `directory` (hard links where the disk allows)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "Dockerfile").write_text(context.dockerfile, encoding="utf-8")
    for name, source in context.files:
        target = directory / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            target.unlink()
        try:
            target.hardlink_to(source)
        except OSError:
            shutil.copyfile(source, target)
    return directory
