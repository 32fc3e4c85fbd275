"""The terminal's view of a bench document: a table per image, the images side by side, the
advice, and the change since an earlier run."""

from __future__ import annotations

from typing import Any

from envbuild.bench.figures import Figure, display_name, fmt, image_figures, number
from envbuild.bench.figures import image_runs as _images

_UNITS = {"samples/s": "samples/s", "batches/s": "batches/s", "GB/s": "GB/s", "s": "s"}


def _table(rows: list[list[str]], *, right: set[int]) -> list[str]:
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(widths[c]) if c in right else cell.ljust(widths[c])
            for c, cell in enumerate(row)
        ]
        lines.append("  " + "  ".join(cells).rstrip())
    return lines


def _value(figure: Figure) -> str:
    return f"{fmt(figure.median)} {_UNITS.get(figure.unit, figure.unit)}".rstrip()


def _spread(figure: Figure) -> str:
    return "" if figure.spread is None else f"±{figure.spread:.1%}"


def short_name(run: dict[str, Any]) -> str:
    """An image as a column heading: framework and version (the reference when there is none)."""
    framework, version = run.get("framework"), run.get("framework_version")
    if framework and version:
        return f"{framework} {version}"
    return str(run.get("image") or "?")


def image_lines(doc: dict[str, Any], index: int) -> list[str]:
    """One image's figures: median and spread, then what it skipped and its errors."""
    run = _images(doc)[index]
    image_id = str(run.get("image_id") or "")[:19]
    seconds = number(run.get("seconds"))
    took = f", {seconds:.0f} s" if seconds is not None else ""
    lines = [f"bench of {run.get('image')} ({image_id}{took})"]
    figures = image_figures(doc, index)
    if figures:
        rows = [["figure", "median", "spread"]]
        rows += [[display_name(f.key), _value(f), _spread(f)] for f in figures]
        lines += _table(rows, right={1, 2})
    else:
        lines.append("  no figures")
    for item in run.get("skipped") or []:
        lines.append(f"  skipped: {item}")
    for error in run.get("errors") or []:
        lines.append(f"  error: {error}")
    return lines


def side_by_side_lines(doc: dict[str, Any]) -> list[str]:
    """Every figure's median per image, one column per image (only when there are several)."""
    runs = _images(doc)
    if len(runs) < 2:
        return []
    columns = [{f.key: f for f in image_figures(doc, i)} for i in range(len(runs))]
    keys: list[str] = []
    units: dict[str, str] = {}
    for column in columns:
        for key, figure in column.items():
            if key not in units:
                keys.append(key)
                units[key] = figure.unit
    if not keys:
        return []
    rows = [["figure", "unit", *(short_name(r) for r in runs)]]
    for key in keys:
        cells = [fmt(c[key].median) if key in c else "-" for c in columns]
        rows.append([display_name(key), units[key], *cells])
    return ["side by side (medians)", *_table(rows, right=set(range(2, 2 + len(runs))))]


def advice_lines(doc: dict[str, Any]) -> list[str]:
    """The advice, one line each, naming the image it is about."""
    lines = []
    for item in doc.get("advice") or []:
        if not isinstance(item, dict):
            continue
        about = item.get("image")
        lines.append(f"  {about}: {item.get('text')}" if about else f"  {item.get('text')}")
    return ["advice", *lines] if lines else []


def comparison_lines(doc: dict[str, Any]) -> list[str]:
    """The change of every figure since the compared run; regressions marked."""
    comparison = doc.get("comparison")
    if not isinstance(comparison, dict):
        return []
    lines = [f"compared with {comparison.get('against')}"]
    rows = [["image", "figure", "before", "after", "change", ""]]
    for row in comparison.get("rows") or []:
        if not isinstance(row, dict):
            continue
        flag = "REGRESSION" if row.get("regression") else ""
        if row.get("rebuilt"):
            flag = (flag + " (rebuilt image)").strip()
        rows.append(
            [
                short_name({"image": row.get("image")}),
                display_name(str(row.get("figure"))),
                fmt(number(row.get("before")) or 0.0),
                fmt(number(row.get("after")) or 0.0),
                f"{number(row.get('change')) or 0.0:+.1%}",
                flag,
            ]
        )
    if len(rows) > 1:
        lines += _table(rows, right={2, 3, 4})
    else:
        lines.append("  no figure in common")
    for image in comparison.get("unmatched") or []:
        lines.append(f"  {image}: not in the earlier run")
    return lines


def bench_lines(doc: dict[str, Any]) -> list[str]:
    """The whole terminal report."""
    lines: list[str] = []
    for index in range(len(_images(doc))):
        lines += [*image_lines(doc, index), ""]
    for block in (side_by_side_lines(doc), advice_lines(doc), comparison_lines(doc)):
        if block:
            lines += [*block, ""]
    return lines[:-1] if lines and lines[-1] == "" else lines
