"""The page `envbuild bench --html` writes: one self-contained HTML file with plots.

It reads the bench document (the `--json` output) and nothing else, through `reading`: every
string of the document is escaped here and bounded there, every number is a figure or missing.
What is missing is said in words instead of drawn as an empty plot.

The page loads nothing: the plots are inlined SVGs (from `plots`), and a Content-Security-Policy
lets the browser refuse anything remote. The same document always gives the same bytes.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from envbuild.bench.figures import MAX_IMAGES, fmt, number, size_text
from envbuild.bench.html.plots import Plot, draw_plots
from envbuild.bench.html.reading import (
    MAX_ROWS,
    MAX_SERIES,
    Image,
    as_dict,
    cut_list,
    median_of,
    read_images,
    text_of,
)

# Nothing remote: the page's own style and script, and images only as data: URLs.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'unsafe-inline'"

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.5rem auto;max-width:72rem;
padding:0 1rem;color:#1b1b1b;background:#fff;line-height:1.4}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.25rem;margin-top:2rem;border-bottom:1px solid #ddd}
h3{font-size:1.05rem;margin-top:1.2rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.85rem}
th,td{border:1px solid #ddd;padding:.2rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f3f3}td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
tr.regression td{background:#fde2e1}.bad{color:#b00020;font-weight:600}.ok{color:#17663a}
figure{margin:1rem 0;padding:.5rem;border:1px solid #e3e3e3}figure svg{max-width:100%;height:auto;display:block;margin:0 auto}
figcaption{font-size:.85rem;color:#444;margin-top:.3rem}p.missing{font-style:italic;color:#555}
code{font-size:.85em;background:#f5f5f5;padding:0 .2em;overflow-wrap:anywhere}
li{margin:.2rem 0}.meta{color:#555;font-size:.9rem}
"""

# Counts the plots the browser lays out with a size: a test (and a curious reader) can check it.
_SCRIPT = """
(function () {
  var plots = document.querySelectorAll('figure[id^="plot-"] svg');
  var visible = 0;
  for (var i = 0; i < plots.length; i++) {
    var box = plots[i].getBoundingClientRect();
    if (box.width > 50 && box.height > 50) { visible++; }
  }
  document.body.setAttribute("data-visible-plots", String(visible));
})();
"""


def _memory(value: float) -> str:
    """Memory in binary units, three significant digits (message sizes use size_text)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def _percent(spread: float | None) -> str:
    return "" if spread is None else f"±{abs(spread) * 100:.1f}%"


def _e(value: object) -> str:
    """A value of the document as HTML text: bounded, then escaped."""
    return html.escape(text_of(value), quote=True)


def _table(head: list[str], rows: list[list[str]], *, classes: list[str] | None = None) -> str:
    """An HTML table from cells that are ALREADY escaped HTML."""
    out = ["<table><thead><tr>", *(f"<th>{h}</th>" for h in head), "</tr></thead><tbody>"]
    for n, row in enumerate(rows):
        css = f' class="{classes[n]}"' if classes and classes[n] else ""
        out.append(f"<tr{css}>" + "".join(row) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _td(value: str, *, numeric: bool = False) -> str:
    return f'<td class="num">{value}</td>' if numeric else f"<td>{value}</td>"


def _bytes_text(value: object) -> str:
    figure = number(value)
    return "unknown" if figure is None else _memory(figure)


def _host(doc: dict[str, Any]) -> str:
    host = as_dict(doc.get("host"))
    cores = number(host.get("cores"))
    rows = [
        ["CPU", _e(host.get("cpu_model")) or "unknown"],
        ["cores", f"{cores:g}" if cores is not None else "unknown"],
        ["memory", _e(_bytes_text(host.get("memory_bytes")))],
        ["engine", _e(host.get("engine")) or "unknown"],
    ]
    gpus = cut_list(host.get("gpus"))
    for gpu in gpus:
        gpu = as_dict(gpu)
        rows.append(
            [
                f"GPU {_e(gpu.get('index'))}",
                f"{_e(gpu.get('name')) or 'unknown'}, {_e(_bytes_text(gpu.get('memory_bytes')))}, "
                f"driver {_e(gpu.get('driver')) or '?'}, capability {_e(gpu.get('capability')) or '?'}",
            ]
        )
    if not gpus:
        rows.append(["GPUs", "none seen"])
    return "<h2>Host</h2>" + _table(["fact", "value"], [[_td(k), _td(v)] for k, v in rows])


def _overview(images: list[Image]) -> str:
    if not images:
        return '<h2>Images</h2><p class="missing">The document holds no images.</p>'
    rows = []
    for image in images:
        r = image.record
        seconds = number(r.get("seconds"))
        ok = r.get("ok") is True
        rows.append(
            [
                _td(_e(image.index + 1), numeric=True),
                _td(f'<a href="#image-{image.index + 1}">{_e(image.ref)}</a>'),
                _td(
                    f'<code title="{_e(r.get("image_id"))}">'
                    f"{_e(text_of(r.get('image_id'), 19))}</code>"
                ),
                _td(f"{_e(r.get('framework'))} {_e(r.get('framework_version'))}"),
                _td(_e(r.get("cuda"))),
                _td(_e(r.get("python"))),
                _td("yes" if r.get("gpus") is True else "no"),
                _td(f"{seconds:.1f} s" if seconds is not None else "?", numeric=True),
                _td('<span class="ok">ok</span>' if ok else '<span class="bad">FAILED</span>'),
                _td(str(len(image.messages("errors"))), numeric=True),
                _td(str(len(image.messages("skipped"))), numeric=True),
            ]
        )
    head = [
        "#",
        "image",
        "image id",
        "framework",
        "cuda",
        "python",
        "GPUs",
        "time",
        "status",
        "errors",
        "skipped",
    ]
    return "<h2>Images</h2>" + _table(head, rows)


def _advice(doc: dict[str, Any]) -> str:
    lines = cut_list(doc.get("advice"), MAX_ROWS)
    if not lines:
        return '<h2>Advice</h2><p class="missing">No advice: the figures gave no rule anything to say.</p>'
    # Grouped by image, in the order the advice came; lines about no one image come first.
    groups: dict[str, list[str]] = {}
    for line in lines:
        line = as_dict(line)
        cites = []
        for figure in cut_list(line.get("figures"), 16):
            figure = as_dict(figure)
            value = number(figure.get("value"))
            shown = fmt(value) if value is not None else "?"
            cites.append(f"<code>{_e(text_of(figure.get('path'), 300))} = {_e(shown)}</code>")
        image = text_of(line.get("image"))
        groups.setdefault(image, []).append(
            f"<li><strong>{_e(line.get('topic')) or 'advice'}</strong>: {_e(line.get('text'))}"
            + (f'<br><span class="meta">from {", ".join(cites)}</span>' if cites else "")
            + "</li>"
        )
    out = ["<h2>Advice</h2>"]
    for image in sorted(groups, key=lambda name: name != ""):
        out.append(f"<h3>{_e(image) if image else 'All images'}</h3>")
        out.append("<ul>" + "".join(groups[image]) + "</ul>")
    return "".join(out)


def _comparison(doc: dict[str, Any]) -> str:
    comparison = doc.get("comparison")
    if not isinstance(comparison, dict):
        return ""
    rows, classes = [], []
    for row in cut_list(comparison.get("rows"), MAX_ROWS):
        row = as_dict(row)
        before, after = number(row.get("before")), number(row.get("after"))
        relative = number(row.get("change"))
        if relative is None and before is not None and after is not None and before != 0:
            relative = after / before - 1.0
        change = f"{relative * 100:+.1f}%" if relative is not None else "?"
        regression = row.get("regression") is True
        rows.append(
            [
                _td(_e(row.get("image"))),
                _td(f"<code>{_e(text_of(row.get('figure'), 300))}</code>"),
                _td(_e(fmt(before)) if before is not None else "?", numeric=True),
                _td(_e(fmt(after)) if after is not None else "?", numeric=True),
                _td(_e(row.get("unit"))),
                _td(_e(change), numeric=True),
                _td(_e(_percent(number(row.get("spread")))), numeric=True),
                _td(
                    ('<span class="bad">REGRESSION</span>' if regression else "")
                    + (" rebuilt (another image id)" if row.get("rebuilt") is True else "")
                ),
            ]
        )
        classes.append("regression" if regression else "")
    head = ["image", "figure", "before", "after", "unit", "change", "allowed (spread)", ""]
    against = _e(comparison.get("against")) or "an earlier run"
    count = sum(1 for c in classes if c)
    body = (
        _table(head, rows, classes=classes)
        if rows
        else '<p class="missing">No figure in common.</p>'
    )
    unmatched = [_e(u) for u in cut_list(comparison.get("unmatched"), MAX_IMAGES)]
    if unmatched:
        body += f"<p>Not in the earlier run: {', '.join(unmatched)}.</p>"
    return (
        f"<h2>Compared with {against}</h2><p>{count} regression{'s' if count != 1 else ''} "
        "beyond the measured spread.</p>" + body
    )


def _figure_row(part: str, what: str, figure: object, note: str = "") -> list[str]:
    median = median_of(figure)
    unit = _e(as_dict(figure).get("unit"))
    value = f"{_e(fmt(median))} {unit}" if median is not None else "—"
    spread = _percent(number(as_dict(figure).get("spread"))) if median is not None else ""
    return [
        _td(_e(part)),
        _td(_e(what)),
        _td(value, numeric=True),
        _td(_e(spread), numeric=True),
        _td(_e(note)),
    ]


def _figure_rows(image: Image) -> list[list[str]]:
    """The rows of the image's figures table, part by part."""
    return [row for name, rows_of in _PART_ROWS for row in rows_of(image.part(name))]


def _throughput_rows(part: dict[str, Any]) -> list[list[str]]:
    rows = []
    for result in cut_list(part.get("results")):
        result = as_dict(result)
        what = f"{text_of(result.get('model'), 40)} {text_of(result.get('precision'), 20)}"
        why = text_of(result.get("unsupported") or result.get("skipped"), 300)
        note = why or f"batch {text_of(result.get('batch'), 20)}, {text_of(result.get('mode'), 60)}"
        rows.append(_figure_row("throughput", what, result, note))
    return rows


def _compile_rows(part: dict[str, Any]) -> list[list[str]]:
    rows = []
    for result in cut_list(part.get("results")):
        result = as_dict(result)
        model = text_of(result.get("model"), 40)
        seconds, speedup = number(result.get("compile_seconds")), number(result.get("speedup"))
        note = (f"compile {seconds:.1f} s" if seconds is not None else "compile time unknown") + (
            f", speed-up \u00d7{speedup:.2f}" if speedup is not None else ""
        )
        rows.append(_figure_row("compile", f"{model} eager", result.get("eager")))
        rows.append(_figure_row("compile", f"{model} compiled", result.get("compiled"), note))
    return rows


def _batch_rows(part: dict[str, Any]) -> list[list[str]]:
    """Each sweep's points, then a row saying where the sweep ended and why."""
    rows = []
    for sweep in cut_list(part.get("sweeps"), MAX_SERIES):
        sweep = as_dict(sweep)
        name = f"{text_of(sweep.get('model'), 40)} {text_of(sweep.get('precision'), 20)}"
        for point in cut_list(sweep.get("points")):
            point = as_dict(point)
            peak = number(point.get("peak_bytes"))
            rows.append(
                _figure_row(
                    "batch",
                    f"{name} @ {text_of(point.get('batch'), 20)}",
                    point,
                    f"peak {_memory(peak)}" if peak is not None else "",
                )
            )
        fit, fit_peak = (
            number(sweep.get("largest_fit")),
            number(sweep.get("largest_fit_peak_bytes")),
        )
        end = f"largest {fit:g}" if fit is not None else "no batch ran"
        if fit_peak is not None:
            end += f" ({_memory(fit_peak)})"
        stopped = text_of(sweep.get("stopped"), 300) or "?"
        rows.append(_figure_row("batch", f"{name}: sweep", None, f"{end}; stopped: {stopped}"))
    return rows


def _loader_rows(part: dict[str, Any]) -> list[list[str]]:
    rows = []
    if part.get("step") is not None:
        kind = text_of(part.get("kind"), 100)
        rows.append(_figure_row("loader", "training step", part.get("step"), kind))
    for point in cut_list(part.get("points")):
        point = as_dict(point)
        rows.append(_figure_row("loader", f"{text_of(point.get('workers'), 20)} workers", point))
    return rows


def _allreduce_rows(part: dict[str, Any]) -> list[list[str]]:
    """The bus bandwidth per message size, then whether the sums came out right."""
    rows = []
    for point in cut_list(part.get("points")):
        point = as_dict(point)
        size, algbw = number(point.get("bytes")), number(point.get("algbw_gbps"))
        busbw = point.get("busbw")
        if not isinstance(busbw, dict):
            busbw = {"median": point.get("busbw_gbps"), "unit": "GB/s"}
        note = f"algbw {fmt(algbw)} GB/s" if algbw is not None else ""
        if point.get("note"):
            note += f"; {text_of(point.get('note'), 200)}"
        what = f"busbw @ {size_text(size) if size is not None else '?'}"
        rows.append(_figure_row("allreduce", what, busbw, note))
    if part.get("points"):
        correct = part.get("correct")
        verdict = "yes" if correct is True else "NO" if correct is False else "unknown"
        rows.append(
            _figure_row(
                "allreduce",
                "correct",
                None,
                f"{verdict}; {text_of(part.get('backend'), 100)}, "
                f"world size {text_of(part.get('world_size'), 20)}",
            )
        )
    return rows


# Each part of an image's document and how its rows are read, in the order the table shows them.
_PART_ROWS: tuple[tuple[str, Callable[[dict[str, Any]], list[list[str]]]], ...] = (
    ("throughput", _throughput_rows),
    ("compile", _compile_rows),
    ("batch", _batch_rows),
    ("loader", _loader_rows),
    ("allreduce", _allreduce_rows),
)


# How each part says it measured: (part, keys naming the method).
_METHODS = (
    ("throughput", ("mode",)),
    ("compile", ("eager_mode", "compiled_mode")),
    ("batch", ("memory",)),
    ("loader", ("kind",)),
    ("allreduce", ("backend",)),
)


def _how_measured(image: Image) -> list[str]:
    """One line per part: its method, device and seconds, as the payload reported them."""
    lines = []
    for name, keys in _METHODS:
        part = image.part(name)
        method = " against ".join(
            text_of(part.get(k), 200) for k in keys if part.get(k) is not None
        )
        device = text_of(part.get("device"), 200)
        seconds = number(part.get("seconds"))
        said = [method, f"on {device}" if device else "", f"{seconds:.1f} s" if seconds else ""]
        if any(said):
            lines.append(f"{name}: " + _e(", ".join(x for x in said if x)))
    return lines


def _image_section(image: Image) -> str:
    versions = image.part("versions")
    facts = ", ".join(
        f"{k} {_e(text_of(versions.get(k), 80))}"
        for k in ("python", "framework", "cuda", "cudnn", "nccl")
        if versions.get(k) is not None
    )
    devices = [
        f"{_e(text_of(as_dict(d).get('kind'), 20))} {_e(text_of(as_dict(d).get('name'), 100))}"
        for d in cut_list(image.bench.get("devices"), 16)
    ]
    out = [
        f'<h2 id="image-{image.index + 1}">{_e(image.label)}</h2>',
        f"<p><code>{_e(image.ref)}</code></p>",
    ]
    meta = [
        f"versions: {facts}" if facts else "",
        f"devices: {', '.join(devices)}" if devices else "",
        *_how_measured(image),
    ]
    if any(meta):
        out.append(f'<p class="meta">{"<br>".join(m for m in meta if m)}</p>')
    errors, skipped = image.messages("errors"), image.messages("skipped")
    if errors:
        out.append(
            '<h3 class="bad">Errors</h3><ul>'
            + "".join(f"<li>{_e(e)}</li>" for e in errors)
            + "</ul>"
        )
    if skipped:
        out.append("<h3>Skipped</h3><ul>" + "".join(f"<li>{_e(s)}</li>" for s in skipped) + "</ul>")
    rows = _figure_rows(image)
    out.append("<h3>Figures</h3>")
    if rows:
        out.append(_table(["part", "what", "median", "spread", "note"], rows))
    else:
        out.append('<p class="missing">No figures: the bench recorded nothing for this image.</p>')
    return "".join(out)


def _plot_html(plot: Plot) -> str:
    title = html.escape(plot.title)
    if plot.missing:
        return (
            f'<section id="{plot.id}-missing"><h3>{title}</h3>'
            f'<p class="missing">{_e(plot.missing)}</p></section>'
        )
    return (
        f'<figure id="{plot.id}"><h3>{title}</h3>{plot.svg}'
        f'<figcaption id="{plot.id}-caption">{_e(plot.caption)}</figcaption></figure>'
    )


def render_html(doc: dict[str, Any]) -> str:
    """The bench document as one self-contained HTML page with plots (same document, same bytes)."""
    doc = as_dict(doc)
    images = read_images(doc)
    plots = draw_plots(images)
    budget = number(doc.get("budget_s"))
    total = len(cut_list(doc.get("images"), 10**9))
    cut = f" (the first {MAX_IMAGES} of {total} shown)" if total > MAX_IMAGES else ""
    header = (
        f'<h1>envbuild bench</h1><p class="meta">{_e(doc.get("created")) or "date unknown"}'
        f" · {len(images)} image{'s' if len(images) != 1 else ''}{cut}"
        + (f" · budget {budget:g} s per image" if budget is not None else "")
        + "</p>"
    )
    body = [
        header,
        _host(doc),
        _overview(images),
        "<h2>Plots</h2>",
        *(_plot_html(p) for p in plots),
        _advice(doc),
        _comparison(doc),
        *(_image_section(i) for i in images),
    ]
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>envbuild bench</title>"
        f"<style>{_STYLE}</style></head><body>\n"
        + "\n".join(b for b in body if b)
        + f"\n<script>{_SCRIPT}</script>\n</body></html>\n"
    )
