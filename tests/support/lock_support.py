"""Locks for tests that never install one: the in-memory engine builds nothing, so a lock only
has to be well formed (what render accepts) and belong to its entry. Real locks come from uv
(tests/unit/test_lock.py, the integration and e2e tiers), here from tiny wheels (`make_wheel`)
when a test resolves offline."""

from __future__ import annotations

import zipfile
from pathlib import Path

from envbuild.core.models import BuildOptions, Entry, Knowledge, Lock, Selection
from envbuild.lock.lockfile import header, inputs_digest, lock_inputs, lock_path
from envbuild.plan.matrix import default_matrix_path, knowledge_matrix, load_matrix, make_plan


def placeholder_lock(entry: Entry, *, salt: str = "0") -> Lock:
    """A one-requirement lock for `entry`; another `salt` gives another hash (another lock)."""
    digest = (salt * 64)[:64]
    return Lock(
        entry_id=entry.id,
        text=f"{entry.install.requirement} \\\n    --hash=sha256:{digest}\n",
    )


def fresh_lock(
    entry: Entry, options: BuildOptions, knowledge: Knowledge, matrix_path: Path | None = None
) -> Lock:
    """Write the lock `envbuild lock` would leave for `entry` under `options` (its header, so it
    is fresh), with a placeholder body; for CLI tests of rendering that must not resolve over
    the network. Without a matrix it goes to $XDG_CACHE_HOME/envbuild/locks."""
    inputs = lock_inputs(entry, options, knowledge)
    digest = inputs_digest(inputs)
    path = lock_path(entry, matrix_path, digest)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = header(entry, inputs, digest) + placeholder_lock(entry).text
    path.write_text(text, encoding="utf-8")
    return Lock(entry_id=entry.id, text=text, path=path)


def the_entry(knowledge: Knowledge, selection: Selection) -> Entry:
    """The one entry `selection` picks among the knowledge base's (at the default matrix's
    Python and OS), as the CLI without -m picks it."""
    defaults = load_matrix(default_matrix_path(), knowledge)
    (entry,) = make_plan(
        knowledge, knowledge_matrix(knowledge, selection, defaults), selection
    ).entries
    return entry


def make_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A tiny pure wheel `name`-`version` in `folder`: what uv needs to resolve offline."""
    dist = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires)
    wheel = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files = {f"{name}/__init__.py": "", f"{dist}/METADATA": metadata, f"{dist}/WHEEL": wheel}
    files[f"{dist}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
