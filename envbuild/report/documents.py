"""Reports of a run: the JSON file `--report` writes, and the lines the terminal shows."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from envbuild import __version__
from envbuild.core.atomic import write_atomically
from envbuild.core.errors import BadInput
from envbuild.core.models import Fact, Plan
from envbuild.core.platforms import AMD64
from envbuild.core.redact import redact
from envbuild.core.results import EntryResult, SmokeResult


def plan_document(plan: Plan, *, explain: bool = False) -> dict[str, Any]:
    """The object `plan --format json` prints; with `explain`, each item's facts and sources."""
    entries = [e.as_dict() for e in plan.entries]
    excluded = [x.as_dict() for x in plan.excluded]
    if explain:
        for item, entry in zip(entries, plan.entries, strict=True):
            item["facts"] = [f.as_dict() for f in entry.facts]
        for item, exclusion in zip(excluded, plan.excluded, strict=True):
            item["facts"] = [f.as_dict() for f in exclusion.facts]
    return {"entries": entries, "excluded": excluded}


def build_document(results: list[EntryResult]) -> dict[str, Any]:
    """The object `build --report` writes."""
    return {
        "envbuild_version": __version__,
        "passed": all(r.passed for r in results),
        "results": [r.as_dict() for r in results],
    }


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Write JSON atomically: a reader never sees half a report."""
    write_text(path, json.dumps(document, indent=2) + "\n")


def write_text(path: Path, text: str) -> None:
    """Write a report atomically, secrets taken out; BadInput naming the path if it cannot be."""
    text = redact(text)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text)
    except OSError as exc:
        msg = f"cannot write {path}: {exc.strerror or type(exc).__name__}; choose a writable path"
        raise BadInput(msg) from None


def smoke_lines(result: SmokeResult) -> list[str]:
    """One line per host-side check, for the terminal."""
    lines = [f"{'PASS' if result.passed else 'FAIL'} smoke {result.image} ({result.seconds:.1f}s)"]
    for check in result.checks:
        lines.append(f"  {'ok  ' if check.passed else 'FAIL'} {check.name}: {check.detail}")
    if result.passed:
        flags = str(result.payload.get("run_with") or "")
        lines.append(
            f"  run it as it was tested: docker run {flags + ' ' if flags else ''}{result.image}"
        )
    return lines


def _fact_lines(facts: tuple[Fact, ...]) -> list[str]:
    return [
        f"      {'yes' if f.holds else 'NO '} {f.text}\n          source: {f.source}" for f in facts
    ]


def plan_table(plan: Plan, *, explain: bool = False) -> list[str]:
    """The plan as a fixed-width table, then the exclusions with reasons."""
    rows = [("ID", "CUDA", "cuDNN", "PYTHON", "BASE", "IMAGE")]
    rows += [(e.id, e.cuda, e.cudnn or "-", e.python, e.base_image, e.image) for e in plan.entries]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows
    ]
    if explain:
        for entry in plan.entries:
            lines.append(f"  {entry.id}:")
            lines += _fact_lines(entry.facts)
    lines.append(f"{len(plan.entries)} entries to build, {len(plan.excluded)} excluded")
    for excluded in plan.excluded:
        c = excluded.combination
        lines.append(
            f"  excluded {c.framework} {c.framework_version} {c.cuda} py{c.python} {c.os}"
            f"{'' if c.platform == AMD64 else ' ' + c.platform}: {excluded.reason}"
        )
        if explain:
            lines += _fact_lines(excluded.facts)
    return lines


def junit_xml(results: list[EntryResult]) -> str:
    """One JUnit test case per entry; a failure carries the reason."""
    suite = ET.Element(
        "testsuite",
        name="envbuild",
        tests=str(len(results)),
        failures=str(sum(not r.passed for r in results)),
        time=f"{sum(r.seconds for r in results):.3f}",
    )
    for result in results:
        case = ET.SubElement(
            suite, "testcase", classname=f"envbuild.{result.entry.framework}", name=result.entry.id,
            time=f"{result.seconds:.3f}",
        )  # fmt: skip
        if not result.passed:
            reason = _xml_text(result.failure_reason)
            failure = ET.SubElement(case, "failure", message=reason[:500])
            failure.text = reason
        elif result.smoke is not None:
            out = ET.SubElement(case, "system-out")
            out.text = _xml_text("\n".join(smoke_lines(result.smoke)))
    ET.indent(suite)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"


# XML 1.0 allows no C0 control characters but tab, newline and carriage return; a build's
# output (ANSI colours) would otherwise make the whole JUnit file unreadable.
_XML_FORBIDDEN = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _xml_text(text: str) -> str:
    return _XML_FORBIDDEN.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def markdown_summary(results: list[EntryResult]) -> str:
    """A Markdown table of the run, for $GITHUB_STEP_SUMMARY."""
    passed = sum(r.passed for r in results)
    lines = [
        f"### envbuild: {passed}/{len(results)} entries passed",
        "",
        "| entry | result | image | loss | all-reduce | time |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for result in results:
        image = (
            f"`{result.image.id[7:19]}` ({'built' if result.image.built else 'found'})"
            if result.image
            else "published already"
            if result.published
            else "-"
        )
        loss = allreduce = "-"
        if result.smoke is not None:
            train = result.smoke.payload.get("train") or {}
            reduce = result.smoke.payload.get("allreduce") or {}
            if train.get("loss_first") is not None:
                loss = f"{train['loss_first']:.3f} → {train['loss_last']:.3f}"
            if reduce.get("world_size"):
                allreduce = f"{reduce.get('backend')} x{reduce['world_size']}, {reduce.get('busbw_gbps', 0):.2f} GB/s"
        verdict = (
            "✅ passed"
            if result.passed
            else "❌ " + (result.error or "smoke test failed").replace("|", "/")[:200]
        )
        lines.append(
            f"| `{result.entry.id}` | {verdict} | {image} | {loss} | {allreduce} | {result.seconds:.0f}s |"
        )
    return "\n".join(lines) + "\n"


def write_build_reports(
    results: list[EntryResult], *, json_file: Path | None, junit_file: Path | None
) -> None:
    """Write the reports `build --report` and `--junit` ask for (each atomically)."""
    if json_file is not None:
        write_json(json_file, build_document(results))
    if junit_file is not None:
        write_text(junit_file, junit_xml(results))


def append_step_summary(path: Path, results: list[EntryResult]) -> None:
    """Append the Markdown summary, secrets taken out, to a GitHub step summary file."""
    with path.open("a", encoding="utf-8") as handle:
        handle.write(redact(markdown_summary(results)))
