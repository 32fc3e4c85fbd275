"""Compare a framework's knowledge file with PyPI and rewrite it (atomically) where they differ."""

from __future__ import annotations

import difflib
import tempfile
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from envbuild.core.errors import BadInput, EnvbuildError, MatrixError
from envbuild.core.resources import matrices_dir
from envbuild.knowledge.refresh.facts import fetch_release_facts
from envbuild.knowledge.refresh.pypi import PypiClient
from envbuild.knowledge.refresh.yaml_edit import apply_facts, safe_version
from envbuild.net.proxy import current, route_session

FRAMEWORK_PACKAGES = {"torch": "torch"}


@dataclass(frozen=True, kw_only=True)
class RefreshResult:
    """What a refresh found: whether the file disagrees with PyPI, and the diff."""

    changed: bool
    diff: tuple[str, ...]
    path: Path
    notes: tuple[str, ...] = ()  # things worth telling that are not differences


def diff(old: str, new: str, name: str) -> list[str]:
    """Unified diff of two versions of a file, one line per item, without line endings."""
    a, b = old.splitlines(), new.splitlines()
    # autojunk off: lines repeated in every release block must still anchor the diff
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    lines: list[str] = []
    for group in matcher.get_grouped_opcodes(3):
        if not lines:
            lines += [f"--- a/{name}", f"+++ b/{name}"]
        first, last = group[0], group[-1]
        old_range = _hunk_range(first[1], last[2])
        new_range = _hunk_range(first[3], last[4])
        lines.append(f"@@ -{old_range} +{new_range} @@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines += [" " + line for line in a[i1:i2]]
                continue
            lines += ["-" + line for line in a[i1:i2]]
            lines += ["+" + line for line in b[j1:j2]]
    return lines


def _hunk_range(start: int, stop: int) -> str:
    """A hunk's line range as unified diff writes it (difflib's _format_range_unified)."""
    length = stop - start
    first = start + 1 if length else start
    return str(first) if length == 1 else f"{first},{length}"


def _listed_releases(text: str, path: Path) -> list[str]:
    """The release versions a knowledge file lists, ascending."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise MatrixError([f"{path}: not valid YAML: {exc}"]) from exc
    releases = data.get("releases") if isinstance(data, dict) else None
    if not isinstance(releases, dict):
        raise MatrixError([f"{path}: expected a 'releases:' mapping"])
    return sorted((str(v) for v in releases), key=safe_version)


def refresh(
    framework: str,
    *,
    check: bool,
    client: PypiClient | None = None,
    knowledge_dir: Path | None = None,
) -> RefreshResult:
    """Compare a framework's knowledge file with PyPI; rewrite it unless `check`."""
    package = FRAMEWORK_PACKAGES.get(framework)
    if package is None:
        known = ", ".join(sorted(FRAMEWORK_PACKAGES))
        msg = f"cannot refresh {framework!r}: known frameworks are {known}"
        raise BadInput(msg)
    path = (knowledge_dir or matrices_dir() / "knowledge") / f"{framework}.yaml"
    try:
        old = path.read_bytes().decode("utf-8")  # bytes: keep the file's own line endings
    except (OSError, UnicodeDecodeError) as exc:
        msg = f"{path}: cannot read the knowledge file: {exc}"
        raise BadInput(msg) from exc
    listed = _listed_releases(old, path)
    oldest = listed[0] if listed else None  # older releases than the file holds stay out
    if client is None:
        with requests.Session() as session:
            route_session(session, current())  # --proxy, else the environment's, else Docker's
            facts = fetch_release_facts(PypiClient(session), package, oldest=oldest)
    else:
        facts = fetch_release_facts(client, package, oldest=oldest)
    new = apply_facts(old, facts, name=str(path))
    notes = tuple(
        f"{v}: in {path.name} but PyPI lists no such final, non-yanked release; left as is"
        for v in listed
        if v not in facts
    )
    changed = new != old
    if changed and not check:
        _write_atomically(path, new)
    return RefreshResult(
        changed=changed, diff=tuple(diff(old, new, str(path))), path=path, notes=notes
    )


def _write_atomically(path: Path, text: str) -> None:
    """Replace `path` by `text` in one rename, so a reader never sees half a file."""
    temporary: Path | None = None
    try:
        with tempfile.NamedTemporaryFile(
            "wb", dir=path.parent, prefix=f".{path.name}.", delete=False
        ) as handle:
            temporary = Path(handle.name)
            handle.write(text.encode("utf-8"))
        temporary.chmod(path.stat().st_mode & 0o7777)
        temporary.replace(path)
    except OSError as exc:
        if temporary is not None:
            temporary.unlink(missing_ok=True)
        msg = f"cannot write {path}: {exc}; run with --check to compare without writing"
        raise EnvbuildError(msg) from exc
