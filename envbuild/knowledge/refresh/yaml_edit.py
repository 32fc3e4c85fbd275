"""The knowledge file as text: one release block per version, one variant per line.

PyPI-derived values are replaced only where they differ, new releases are inserted in order,
and everything curated by hand (other variants, comments, sources) stays byte for byte; the
result is read back as YAML and must say exactly what the facts say.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from packaging.version import InvalidVersion, Version

from envbuild.core.errors import EnvbuildError, MatrixError
from envbuild.knowledge.refresh.facts import ReleaseFacts

PYPI_SOURCE = "pypi"  # the `source:` key of facts this module maintains
NEW_RELEASE_COMMENT = "# new: other CUDA variants not yet curated"
_FIELDS = ("released", "requires_python", "python", "pypi_variant", "source", "variants")

_RELEASES_LINE = re.compile(r"releases:\s*(#.*)?")
_TOP_LEVEL = re.compile(r"[^\s#]")
_RELEASE_HEAD = re.compile(r"  (?P<key>\"[^\"]+\"|'[^']+'|[^\s#\"'][^:#]*?):\s*(#.*)?")
_FIELD = re.compile(r"    (?P<key>[A-Za-z_]+):(?P<value>.*)")
_VARIANT = re.compile(r"      (?P<key>\"[^\"]+\"|'[^']+'|[^\s#\"'][^:#]*?):\s*\{.*\}\s*(#.*)?")


def _quote(value: str | None) -> str:
    return "null" if value is None else json.dumps(value)


def _variant_key(cuda: str) -> str:
    return cuda if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_-]*", cuda) else _quote(cuda)


def _variant_order(cuda: str) -> tuple[int, Version]:
    try:
        return (0, Version("0")) if cuda == "cpu" else (1, Version(cuda))
    except InvalidVersion:
        return 2, Version("0")


def _pypi_variant_value(facts: ReleaseFacts) -> dict[str, str | None]:
    value: dict[str, str | None] = {"cudnn": facts.cudnn, "nccl": facts.nccl}
    if facts.cuda_runtime is not None:
        value["cuda_runtime"] = facts.cuda_runtime
    value["source"] = PYPI_SOURCE
    return value


def _variant_line(cuda: str, value: Mapping[str, str | None]) -> str:
    body = ", ".join(f"{k}: {v if k == 'source' else _quote(v)}" for k, v in value.items())
    return f"      {_variant_key(cuda)}: {{{body}}}"


def _field_values(facts: ReleaseFacts) -> dict[str, Any]:
    return {
        "released": facts.released,
        "requires_python": facts.requires_python,
        "python": list(facts.python),
        "pypi_variant": facts.pypi_variant,
    }


def _field_line(key: str, value: Any) -> str:
    if isinstance(value, list):
        return f"    {key}: [{', '.join(_quote(str(v)) for v in value)}]"
    return f"    {key}: {_quote(value)}"


def _parse_line(line: str) -> dict[Any, Any] | None:
    """The one-key mapping a single YAML line holds, or None."""
    try:
        data = yaml.safe_load(line.strip())
    except yaml.YAMLError:
        return None
    return data if isinstance(data, dict) and len(data) == 1 else None


def _release_block(facts: ReleaseFacts, cpu_source: str, newline: str) -> list[str]:
    lines = [f"  {_quote(facts.version)}:", f"    {NEW_RELEASE_COMMENT}"]
    lines += [_field_line(k, v) for k, v in _field_values(facts).items()]
    lines += [f"    source: {PYPI_SOURCE}", "    variants:"]
    if facts.pypi_variant != "cpu":
        lines.append(_variant_line("cpu", {"cudnn": None, "nccl": None, "source": cpu_source}))
    if facts.pypi_variant is not None:
        lines.append(_variant_line(facts.pypi_variant, _pypi_variant_value(facts)))
    return [line + newline for line in lines]


@dataclass(frozen=True, kw_only=True)
class _Block:
    version: str
    start: int  # index of the head line in the file's lines
    end: int  # one past the last line


def _blocks(lines: list[str], name: str) -> tuple[list[_Block], int]:
    """The release blocks and the index where the releases section ends."""
    start = next(
        (i for i, line in enumerate(lines) if _RELEASES_LINE.fullmatch(line.rstrip("\r\n"))),
        None,
    )
    if start is None:
        raise MatrixError([f"{name}: no top-level 'releases:' line"])
    end = next((i for i in range(start + 1, len(lines)) if _TOP_LEVEL.match(lines[i])), len(lines))
    heads: list[tuple[int, str]] = []
    for i in range(start + 1, end):
        text = lines[i].rstrip("\r\n")
        head = _RELEASE_HEAD.fullmatch(text)
        if head:
            heads.append((i, str(yaml.safe_load(head.group("key")))))
        elif text.strip() and not text.lstrip().startswith("#") and not text.startswith("    "):
            raise MatrixError([f"{name}:{i + 1}: expected a release line like '  \"2.4.1\":'"])
    blocks = [
        _Block(version=v, start=i, end=heads[n + 1][0] if n + 1 < len(heads) else end)
        for n, (i, v) in enumerate(heads)
    ]
    return blocks, end


def _update_block(lines: list[str], facts: ReleaseFacts, name: str, newline: str) -> list[str]:
    """The block's lines with exactly the PyPI-derived values replaced where they differ."""
    out = list(lines)
    wanted = _field_values(facts)
    present: dict[str, int] = {}  # field -> index of its line
    for i, line in enumerate(out):
        field = _FIELD.fullmatch(line.rstrip("\r\n"))
        if field and field.group("key") in _FIELDS:
            present[field.group("key")] = i
            if field.group("key") in wanted and not field.group("value").split("#")[0].strip():
                key = field.group("key")
                msg = f"{name}: releases.{facts.version}.{key}: write the value on the same line"
                raise MatrixError([msg])
    if "variants" not in present:
        msg = f"{name}: releases.{facts.version} has no 'variants:' line"
        raise MatrixError([msg])
    for key, value in wanted.items():
        if key in present:
            i = present[key]
            parsed = _parse_line(out[i])
            if parsed is None or parsed.get(key) != value:
                out[i] = _field_line(key, value) + _ending(out[i], newline)
    # Missing fields go before the next field that is present, keeping the usual order.
    for n, key in enumerate(_FIELDS[:4]):
        if key not in present:
            after = [present[k] for k in _FIELDS[n + 1 :] if k in present]
            at = min(after)
            out.insert(at, _field_line(key, wanted[key]) + newline)
            present = {k: (v + 1 if v >= at else v) for k, v in present.items()}
            present[key] = at
    return _update_variants(out, present["variants"], facts, name, newline)


def _ending(line: str, newline: str) -> str:
    return line[len(line.rstrip("\r\n")) :] or newline


def _update_variants(
    lines: list[str], variants_at: int, facts: ReleaseFacts, name: str, newline: str
) -> list[str]:
    out = lines[: variants_at + 1]
    rest = lines[variants_at + 1 :]
    region = 0
    while region < len(rest) and (not rest[region].strip() or rest[region].startswith("      ")):
        region += 1
    wanted = _pypi_variant_value(facts)
    kept: list[tuple[str | None, str]] = []  # (variant or None for comments/blank, line)
    for line in rest[:region]:
        text = line.rstrip("\r\n")
        if not text.strip() or text.lstrip().startswith("#"):
            kept.append((None, line))
            continue
        match = _VARIANT.fullmatch(text)
        parsed = _parse_line(line) if match else None
        value = next(iter(parsed.values())) if parsed else None
        if match is None or not isinstance(value, dict):
            msg = (
                f"{name}: releases.{facts.version}.variants: expected one "
                f"'<cuda>: {{...}}' per line, got {text.strip()!r}"
            )
            raise MatrixError([msg])
        cuda = str(yaml.safe_load(match.group("key")))
        if cuda == facts.pypi_variant:
            if value != wanted:
                line = _variant_line(cuda, wanted) + _ending(line, newline)
            kept.append((cuda, line))
        elif value.get("source") != PYPI_SOURCE:
            kept.append((cuda, line))
        # else: a variant only PyPI vouched for, and PyPI's wheel is now another one: dropped
    if facts.pypi_variant is not None and facts.pypi_variant not in {c for c, _ in kept}:
        new_line = _variant_line(facts.pypi_variant, wanted) + newline
        order = _variant_order(facts.pypi_variant)
        at = next(
            (i for i, (c, _) in enumerate(kept) if c is not None and _variant_order(c) > order),
            None,
        )
        if at is None:
            last = max((i for i, (c, _) in enumerate(kept) if c is not None), default=-1)
            at = last + 1
        kept.insert(at, (facts.pypi_variant, new_line))
    return out + [line for _, line in kept] + rest[region:]


def apply_facts(
    text: str, facts: Mapping[str, ReleaseFacts], *, name: str = "knowledge file"
) -> str:
    """The knowledge file `text` with its PyPI-derived facts replaced by `facts`."""
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith(("\n", "\r")):
        lines[-1] += newline
    blocks, section_end = _blocks(lines, name)
    by_version = {b.version: b for b in blocks}
    cpu_source = _newest_cpu_source(lines, blocks)
    out: list[str] = lines[: blocks[0].start if blocks else section_end]
    pending = sorted(
        (f for v, f in facts.items() if v not in by_version), key=lambda f: Version(f.version)
    )
    for block in blocks:
        while pending and Version(pending[0].version) < safe_version(block.version):
            out += _release_block(pending.pop(0), cpu_source, newline)
        block_lines = lines[block.start : block.end]
        if block.version in facts:
            block_lines = _update_block(block_lines, facts[block.version], name, newline)
        out += block_lines
    for new in pending:
        out += _release_block(new, cpu_source, newline)
    out += lines[section_end:]
    result = "".join(out)
    if not text.endswith(("\n", "\r")) and result == text + newline:
        result = text
    _verify(result, facts, name)
    return result


def safe_version(text: str) -> Version:
    """The version `text` names, or 0 for one that is not a version (sorted first)."""
    try:
        return Version(text)
    except InvalidVersion:
        return Version("0")


def _newest_cpu_source(lines: list[str], blocks: list[_Block]) -> str:
    """The `source:` of the newest release's cpu variant: where new releases' CPU wheels are."""
    for block in sorted(blocks, key=lambda b: safe_version(b.version), reverse=True):
        for line in lines[block.start : block.end]:
            if line.startswith("      cpu:"):
                parsed = _parse_line(line)
                if parsed is not None and isinstance(parsed.get("cpu"), dict):
                    return str(parsed["cpu"].get("source", PYPI_SOURCE))
    return PYPI_SOURCE


def _verify(text: str, facts: Mapping[str, ReleaseFacts], name: str) -> None:
    """Refuse to hand back text whose YAML does not say exactly what `facts` say."""
    try:
        releases = (yaml.safe_load(text) or {}).get("releases") or {}
    except (yaml.YAMLError, AttributeError) as exc:
        msg = f"{name}: the refreshed text is not valid YAML ({exc}); nothing written"
        raise EnvbuildError(msg) from exc
    for version, f in facts.items():
        item = releases.get(version) or {}
        got = {k: item.get(k) for k in _field_values(f)}
        variant = (item.get("variants") or {}).get(f.pypi_variant) if f.pypi_variant else None
        if got != _field_values(f) or (f.pypi_variant and variant != _pypi_variant_value(f)):
            msg = (
                f"{name}: releases.{version} does not read back as PyPI's facts after "
                "the update (a bug in envbuild's refresh); nothing written"
            )
            raise EnvbuildError(msg)
