"""The page `envbuild bench --html` writes: one self-contained HTML file with plots.

It reads the bench document (the `--json` output) and nothing else.  The document
comes partly from inside images (names, errors, figures), so it is read as hostile:
every string is escaped and bounded, every number must be finite, every list is cut
(at most MAX_IMAGES images, MAX_POINTS points per series), and whatever is missing
is said in words instead of drawn as an empty plot.

The page loads nothing: the plots are matplotlib SVGs inlined (text drawn as
paths, so no font is needed), and a Content-Security-Policy lets the browser
refuse anything remote.  The same document always gives the same bytes.
"""

from __future__ import annotations

import html
import io
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envbuild.bench.figures import MAX_IMAGES, fmt, size_text

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# MAX_IMAGES (32) comes with the figures' reader.
MAX_POINTS = 64
MAX_TEXT = 2000
# Advice lines, comparison rows, errors and skipped items per image.
MAX_ROWS = 500
# Models, precisions or sweeps drawn per image and plot.
MAX_SERIES = 8
LEGEND_COLUMNS = 3
# A label inside a plot: longer ones are cut (the tables hold the whole text).
MAX_LABEL = 44
# Numbers beyond this are not figures of any bench: read as missing, not drawn.
MAX_MAGNITUDE = 1e18

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'unsafe-inline'"

PRECISION_ORDER = ("fp32", "bf16", "fp16")
MODEL_ORDER = ("conv", "transformer")


# --------------------------------------------------------------------------
# reading the document


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: object, limit: int = MAX_POINTS) -> list[Any]:
    return value[:limit] if isinstance(value, list) else []


def _num(value: object) -> float | None:
    """A finite number of sane size, or None (bools, strings, NaN, inf, 1e300 are not figures)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int) and abs(value) > MAX_MAGNITUDE:
        return None
    number = float(value)
    if not math.isfinite(number) or abs(number) > MAX_MAGNITUDE:
        return None
    return number


def _text(value: object, limit: int = MAX_TEXT) -> str:
    """A string of the document, bounded; '' for what holds no text."""
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, int | float):
        number = _num(value)
        text = "(a number out of range)" if number is None else fmt(number)
    else:
        text = f"({type(value).__name__})"
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    if not text.isascii():
        # JSON's \ud800 escapes give lone surrogates, which no UTF-8 file can hold.
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def _median(figure: object) -> float | None:
    return _num(_dict(figure).get("median"))


def _error(figure: object) -> float:
    """Half the figure's range, from its relative spread; 0 when it has none."""
    median, spread = _median(figure), _num(_dict(figure).get("spread"))
    return abs(median * spread) if median is not None and spread is not None else 0.0


@dataclass(frozen=True, kw_only=True)
class _Image:
    index: int
    ref: str
    label: str
    record: dict[str, Any]
    bench: dict[str, Any]

    def part(self, name: str) -> dict[str, Any]:
        return _dict(self.bench.get(name))

    @property
    def colour(self) -> str:
        return f"C{self.index % 10}"

    @property
    def dashes(self) -> str:
        return ("-", "--", ":", "-.")[(self.index // 10) % 4]

    def why_missing(self, section: str) -> str:
        """Why a section of this image has nothing to draw, from what the run recorded."""
        for item in _texts(self, "skipped") + _texts(self, "errors"):
            if item.startswith((f"{section}:", f"{section} ")):
                return _text(item, 200)
        if self.record.get("ok") is False:
            errors = _texts(self, "errors")
            return "the run failed" + (f": {_text(errors[0], 200)}" if errors else "")
        return f"{section}: nothing recorded"


def _images(doc: dict[str, Any]) -> list[_Image]:
    images = []
    for index, record in enumerate(_list(doc.get("images"), MAX_IMAGES)):
        record = _dict(record)
        ref = _text(record.get("image")) or "(unnamed image)"
        short = ref.rsplit("/", 1)[-1]
        images.append(
            _Image(
                index=index,
                ref=ref,
                label=f"{index + 1}. {short}",
                record=record,
                bench=_dict(record.get("bench")),
            )
        )
    return images


def _texts(image: _Image, key: str) -> list[str]:
    """The image's "errors" or "skipped": the host's, then those of the payload's own document
    that the host did not repeat."""
    found: dict[str, None] = {}
    for item in _list(image.record.get(key), MAX_ROWS) + _list(image.bench.get(key), MAX_ROWS):
        text = _text(item)
        if text:
            found.setdefault(text)
    return list(found)[:MAX_ROWS]


def _ordered(names: Iterable[str], order: tuple[str, ...]) -> list[str]:
    """Known names in their usual order first, then the others as they came; at most MAX_SERIES."""
    seen = list(dict.fromkeys(names))
    return ([n for n in order if n in seen] + [n for n in seen if n not in order])[:MAX_SERIES]


# --------------------------------------------------------------------------
# formatting


def _memory(value: float) -> str:
    """Memory in binary units, three significant digits (message sizes use size_text)."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def _percent(spread: float | None) -> str:
    return "" if spread is None else f"±{abs(spread) * 100:.1f}%"


def _plot_label(value: str, limit: int = MAX_LABEL) -> str:
    """Text safe to hand matplotlib: printable ASCII (DejaVu draws it all), no mathtext, no
    legend-hiding leading underscore, bounded."""
    text = "".join(c if " " <= c <= "~" else "?" for c in value.replace("…", "..."))
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    text = text.replace("\\", "/").replace("$", r"\$")
    return " " + text if text.startswith("_") else text


def _e(value: object) -> str:
    return html.escape(_text(value), quote=True)


# --------------------------------------------------------------------------
# plots


@dataclass(frozen=True, kw_only=True)
class _Plot:
    id: str
    title: str
    caption: str
    svg: str = ""
    missing: str = ""


# A plot's drawing: given the images, it returns (figure, caption) or (None, why there is none).
_Draw = Callable[[list[_Image], Callable[[float, float], "Figure"]], tuple["Figure | None", str]]


def _missing(what: str, images: list[_Image], section: str) -> str:
    """The sentence that stands in for a plot with nothing to draw."""
    if not images:
        return f"No {what} to plot: the document holds no images."
    return f"No {what} to plot ({_not_drawn(images, section)})."


def _not_drawn(images: list[_Image], section: str) -> str:
    """Why each of these images is not in a plot (the first five)."""
    reasons = "; ".join(f"{i.label}: {i.why_missing(section)}" for i in images[:5])
    return reasons + (f"; and {len(images) - 5} more" if len(images) > 5 else "")


def _grid(
    figure_of: Callable[[float, float], Figure],
    panels: int,
    *,
    legend_entries: int = 0,
    legend_columns: int = LEGEND_COLUMNS,
) -> tuple[Figure, list[Axes]]:
    """A figure of ``panels`` axes in up to two columns, with room below for a legend."""
    columns = 1 if panels == 1 else 2
    rows = math.ceil(panels / columns)
    legend_rows = math.ceil(legend_entries / legend_columns)
    figure = figure_of(10.0 if columns == 2 else 7.0, 3.6 * rows + 0.2 * legend_rows)
    axes = [figure.add_subplot(rows, columns, n + 1) for n in range(panels)]
    return figure, axes


def _figure_legend(figure: Figure, axes: list[Axes], columns: int = LEGEND_COLUMNS) -> None:
    """One legend for all panels, below them: with many images, a legend inside an axes would
    cover it (or squeeze it to nothing)."""
    entries: dict[str, Any] = {}
    for ax in axes:
        handles, labels = ax.get_legend_handles_labels()
        for handle, label in zip(handles, labels, strict=True):
            entries.setdefault(label, handle)
    if entries:
        figure.legend(
            list(entries.values()),
            list(entries.keys()),
            loc="outside lower center",
            ncols=min(columns, len(entries)),
        )


def _series(points: list[tuple[float, float, float]]) -> tuple[list[float], ...]:
    points.sort()
    return [p[0] for p in points], [p[1] for p in points], [p[2] for p in points]


def _draw_batch(
    images: list[_Image], figure_of: Callable[[float, float], Figure]
) -> tuple[Figure | None, str]:
    panels: list[tuple[_Image, list[dict[str, Any]]]] = []
    for image in images:
        sweeps = [
            s
            for s in (_dict(s) for s in _list(image.part("batch").get("sweeps"), MAX_SERIES))
            if _sweep_points(s)
        ]
        if sweeps:
            panels.append((image, sweeps))
    if not panels:
        return None, _missing("batch-size sweep", images, "batch")
    from matplotlib.ticker import FuncFormatter

    figure, axes = _grid(figure_of, len(panels))
    for ax, (image, sweeps) in zip(axes, panels, strict=True):
        models = {_text(s.get("model"), 40) for s in sweeps}
        for n, sweep in enumerate(sweeps):
            x, y, err = _series(_sweep_points(sweep))
            name = _text(sweep.get("precision"), 20) or "?"
            if len(models) > 1:
                name = f"{_text(sweep.get('model'), 20)} {name}"
            ax.errorbar(
                x,
                y,
                yerr=err,
                marker="o",
                ms=4,
                capsize=2,
                color=f"C{n % 10}",
                label=_plot_label(name),
            )
            fit = _num(sweep.get("largest_fit"))
            if fit is not None and fit in x:
                stopped = _text(sweep.get("stopped"), 200)
                fits = stopped.startswith(("out of memory", "memory"))
                ax.plot(
                    [fit],
                    [y[x.index(fit)]],
                    marker="*",
                    ms=14,
                    color=f"C{n % 10}",
                    markeredgecolor="black",
                    linestyle="none",
                    gid=f"largest-fit-{image.index}-{n}",
                )
                ax.annotate(
                    f"{'largest fit' if fits else 'largest run'} {fit:g}",
                    (fit, y[x.index(fit)]),
                    textcoords="offset points",
                    xytext=(-4, 8 + 10 * n),
                    ha="right",
                    fontsize=7,
                )
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
        ax.set_xlabel("batch size (log2)")
        ax.set_ylabel("samples/s")
        ax.margins(y=0.2)  # room for the largest-fit labels
        ax.set_ylim(bottom=0)
        ax.set_title(_plot_label(image.label), fontsize=9)
        ax.legend(loc="lower right")
    caption = (
        "Training throughput against batch size, one line per precision "
        "(the median of the repetitions, bars: spread). The star marks the largest batch that "
        "fit in memory (\u201clargest fit\u201d) or, when the sweep stopped for time or at its "
        "maximum, the largest that ran."
    )
    left_out = [i for i in images if all(p[0] is not i for p in panels)]
    if left_out:
        caption += f" Not drawn: {_not_drawn(left_out, 'batch')}."
    return figure, caption


def _sweep_points(sweep: dict[str, Any]) -> list[tuple[float, float, float]]:
    points = []
    for point in _list(sweep.get("points")):
        batch, median = _num(_dict(point).get("batch")), _median(point)
        if batch is not None and batch > 0 and median is not None:
            points.append((batch, median, _error(point)))
    return points


def _loader_points(image: _Image) -> list[tuple[float, float, float]]:
    points = []
    for point in _list(image.part("loader").get("points")):
        workers, median = _num(_dict(point).get("workers")), _median(point)
        if workers is not None and workers >= 0 and median is not None:
            points.append((workers, median, _error(point)))
    return points


def _draw_loader(
    images: list[_Image], figure_of: Callable[[float, float], Figure]
) -> tuple[Figure | None, str]:
    panels = [(i, p) for i in images if (p := _loader_points(i))]
    if not panels:
        return None, _missing("loader measurement", images, "loader")
    figure, axes = _grid(figure_of, len(panels))
    for ax, (image, points) in zip(axes, panels, strict=True):
        x, y, err = _series(points)
        ax.errorbar(
            x, y, yerr=err, marker="o", ms=5, capsize=2, color=image.colour, label="loader alone"
        )
        step = _median(image.part("loader").get("step"))
        if step is not None:
            ax.axhline(
                step,
                color="black",
                linestyle="--",
                linewidth=1.2,
                label=f"training step consumes {fmt(step)}",
                gid=f"step-{image.index}",
            )
            starved = [(a, b) for a, b in zip(x, y, strict=True) if b < step]
            if starved:
                ax.plot(
                    [a for a, _ in starved],
                    [b for _, b in starved],
                    marker="v",
                    ms=9,
                    color="#d62728",
                    linestyle="none",
                    label="starves the step",
                )
        ax.set_xticks(sorted(set(x)))
        ax.set_xlabel("loader workers")
        ax.set_ylabel("batches/s")
        ax.set_ylim(bottom=0)
        ax.set_title(_plot_label(image.label), fontsize=9)
        ax.legend(loc="best")
    caption = (
        "Batches per second from the data loader alone against its worker count, and the rate "
        "at which the training step consumes batches (dashed): a point below the line starves "
        "the step."
    )
    left_out = [i for i in images if all(p[0] is not i for p in panels)]
    if left_out:
        caption += f" Not drawn: {_not_drawn(left_out, 'loader')}."
    return figure, caption


def _one_rank(image: _Image) -> bool:
    return _num(image.part("allreduce").get("world_size")) == 1


def _allreduce_points(image: _Image) -> list[tuple[float, float, float]]:
    """(bytes, busbw, error) per message size; with one rank busbw is 0 by definition, so its
    algbw (a copy within the device) is drawn instead, and labelled so."""
    one_rank = _one_rank(image)
    points = []
    for point in _list(image.part("allreduce").get("points")):
        point = _dict(point)
        size = _num(point.get("bytes"))
        figure = None if one_rank else point.get("busbw")
        value = _median(figure)
        if value is None:
            value = _num(point.get("algbw_gbps" if one_rank else "busbw_gbps"))
        if size is not None and size > 0 and value is not None:
            points.append((size, value, _error(figure)))
    return points


def _draw_allreduce(
    images: list[_Image], figure_of: Callable[[float, float], Figure]
) -> tuple[Figure | None, str]:
    lines = [(i, p) for i in images if (p := _allreduce_points(i))]
    if not lines:
        return None, _missing("all-reduce measurement", images, "allreduce")
    from matplotlib.ticker import FuncFormatter

    figure, (ax,) = _grid(figure_of, 1, legend_entries=len(lines), legend_columns=1)
    notes = []
    for image, points in lines:
        part = image.part("allreduce")
        backend = _text(part.get("backend"), 40) or "?"
        world = _num(part.get("world_size"))
        ranks = f"{world:g} ranks" if world is not None else "ranks unknown"
        if world == 1:
            ranks = "one rank: algbw"
        x, y, err = _series(points)
        ax.errorbar(
            x,
            y,
            yerr=err,
            marker="o",
            ms=3,
            capsize=2,
            color=image.colour,
            linestyle=image.dashes,
            label=_plot_label(f"{image.label} ({backend}, {ranks})", 2 * MAX_LABEL),
        )
        if world == 1:
            notes.append(
                f"{image.label} ran one rank: no communication, so busbw is 0 and its line "
                "shows algbw instead (a copy within the device)"
            )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _pos: size_text(v)))
    ax.set_xlabel("message size (log2)")
    ax.set_ylabel("busbw GB/s")
    ax.set_ylim(bottom=0)
    _figure_legend(figure, [ax], columns=1)
    caption = (
        "All-reduce bus bandwidth against message size, one line per image (nccl-tests' "
        "busbw = algbw \u00d7 2(n\u22121)/n)."
    )
    if notes:
        caption += " " + "; ".join(notes[:5]) + "."
    left_out = [i for i in images if all(line[0] is not i for line in lines)]
    if left_out:
        caption += f" Not drawn: {_not_drawn(left_out, 'allreduce')}."
    return figure, caption


def _throughput_table(images: list[_Image]) -> dict[str, dict[str, dict[int, dict[str, Any]]]]:
    """model -> precision -> image index -> the result (a figure, or why there is none)."""
    table: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    for image in images:
        for result in _list(image.part("throughput").get("results")):
            result = _dict(result)
            model = _text(result.get("model"), 40) or "?"
            precision = _text(result.get("precision"), 20) or "?"
            table.setdefault(model, {}).setdefault(precision, {}).setdefault(image.index, result)
    return table


def _draw_throughput(
    images: list[_Image], figure_of: Callable[[float, float], Figure]
) -> tuple[Figure | None, str]:
    table = _throughput_table(images)
    models = [
        m
        for m in _ordered(table, MODEL_ORDER)
        if any(_median(r) is not None for p in table[m].values() for r in p.values())
    ]
    if not models:
        return None, _missing("throughput figure", images, "throughput")
    figure, axes = _grid(figure_of, len(models), legend_entries=len(images))
    width = 0.8 / max(1, len(images))
    drawn: set[int] = set()
    for ax, model in zip(axes, models, strict=True):
        precisions = [
            p
            for p in _ordered(table[model], PRECISION_ORDER)
            if any(_median(r) is not None for r in table[model][p].values())
        ]
        for n, image in enumerate(images):
            for g, precision in enumerate(precisions):
                result = table[model][precision].get(image.index)
                x = g - 0.4 + width * (n + 0.5)
                if result is None:
                    continue
                median = _median(result)
                if median is None:
                    ax.text(x, 0, "n/a", rotation=90, ha="center", va="bottom", fontsize=6)
                    continue
                drawn.add(image.index)
                ax.bar(
                    x,
                    median,
                    width=width,
                    yerr=_error(result),
                    capsize=2,
                    color=image.colour,
                    label=_plot_label(image.label),
                )
        ax.set_xticks(range(len(precisions)), [_plot_label(p) for p in precisions])
        ax.set_ylabel("samples/s")
        ax.set_title(_plot_label(model), fontsize=9)
    _figure_legend(figure, axes)
    modes = "; ".join(
        f"{i.label}: {_text(i.part('throughput').get('mode'), 60) or 'mode unknown'}"
        for i in images
        if i.index in drawn
    )
    caption = (
        "Training throughput per model and precision, images side by side "
        f"(median, bars: spread; \u201cn/a\u201d: not run on this device). Modes: {modes}."
    )
    left_out = [i for i in images if i.index not in drawn]
    if left_out:
        caption += f" Not drawn: {_not_drawn(left_out, 'throughput')}."
    return figure, caption


def _short_name(image: _Image) -> str:
    """A tick label: the image's number and its framework (the legends carry the whole name)."""
    framework = _text(image.record.get("framework"), 16) or image.label.split(" ", 1)[-1][:16]
    return f"{image.index + 1}. {framework}"


def _compile_results(image: _Image) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for result in _list(image.part("compile").get("results")):
        result = _dict(result)
        if _median(result.get("eager")) is not None or _median(result.get("compiled")) is not None:
            results.setdefault(_text(result.get("model"), 40) or "?", result)
    return results


def _draw_compile(
    images: list[_Image], figure_of: Callable[[float, float], Figure]
) -> tuple[Figure | None, str]:
    per_image = {i.index: _compile_results(i) for i in images}
    models = _ordered((m for r in per_image.values() for m in r), MODEL_ORDER)
    if not models:
        return None, _missing("compile measurement", images, "compile")
    figure, axes = _grid(figure_of, len(models), legend_entries=2)
    for ax, model in zip(axes, models, strict=True):
        shown = [i for i in images if model in per_image[i.index]]
        for n, image in enumerate(shown):
            result = per_image[image.index][model]
            eager, compiled = result.get("eager"), result.get("compiled")
            for offset, figure_, hatch, name in (
                (-0.2, eager, "", "eager / default mode"),
                (0.2, compiled, "//", "compiled"),
            ):
                median = _median(figure_)
                if median is None:
                    ax.text(n + offset, 0, "n/a", rotation=90, ha="center", va="bottom", fontsize=6)
                    continue
                ax.bar(
                    n + offset,
                    median,
                    width=0.38,
                    yerr=_error(figure_),
                    capsize=2,
                    color=image.colour,
                    hatch=hatch,
                    edgecolor="black",
                    linewidth=0.5,
                    label=name if n == 0 else None,
                )
            # Above the error bars too.
            top = max((_median(f) or 0.0) + _error(f) for f in (eager, compiled))
            seconds, speedup = _num(result.get("compile_seconds")), _num(result.get("speedup"))
            note = f"\u00d7{speedup:.2f}" if speedup is not None else "\u00d7?"
            note += f"\ncompile {seconds:.1f} s" if seconds is not None else "\ncompile ? s"
            ax.annotate(
                note, (n, top), textcoords="offset points", xytext=(0, 4), ha="center", fontsize=7
            )
        ax.set_xticks(
            range(len(shown)),
            [_plot_label(_short_name(i)) for i in shown],
            rotation=90 if len(shown) > 4 else 0,
        )
        ax.set_ylabel("samples/s")
        ax.margins(y=0.25)
        ax.set_ylim(bottom=0)
        ax.set_title(_plot_label(model), fontsize=9)
    _figure_legend(figure, axes)
    caption = (
        "Compiled against eager (the framework's default mode) per model, fp32 at the default "
        "batch (median, bars: spread); above each pair the speed-up and the seconds the first "
        "compiled step took to compile."
    )
    left_out = [i for i in images if not per_image[i.index]]
    if left_out:
        caption += f" Not drawn: {_not_drawn(left_out, 'compile')}."
    return figure, caption


PLOTS: tuple[tuple[str, str, _Draw], ...] = (
    ("plot-throughput", "Frameworks side by side", _draw_throughput),
    ("plot-batch", "Throughput against batch size", _draw_batch),
    ("plot-compile", "Compiled against eager", _draw_compile),
    ("plot-loader", "Data loading against the training step", _draw_loader),
    ("plot-allreduce", "All-reduce bandwidth", _draw_allreduce),
)


def _svg(figure: Figure, plot_id: str) -> str:
    """The figure as an inline <svg>: no XML prolog, metadata or comments, ids made unique to
    the plot so several SVGs share one page."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    text = re.sub(r"<!--.*?-->\s*", "", text, flags=re.S)
    # HTML's parser knows the SVG and XLink namespaces: the declarations are only URLs here.
    text = re.sub(r'\s+xmlns(?::xlink)?="[^"]*"', "", text)
    ids = set(re.findall(r'\bid="([^"]+)"', text))
    text = re.sub(
        r'(\bid="|href="#|url\(#)([^")]+)',
        lambda m: m.group(1) + (f"{plot_id}-{m.group(2)}" if m.group(2) in ids else m.group(2)),
        text,
    )
    return text.replace("<svg ", f'<svg role="img" aria-labelledby="{plot_id}-caption" ', 1)


def _plots(images: list[_Image]) -> list[_Plot]:
    import matplotlib
    from matplotlib.figure import Figure

    def figure_of(width: float, height: float) -> Figure:
        return Figure(figsize=(width, height), layout="constrained")

    plots = []
    with matplotlib.rc_context():
        # Fixed: the output must not depend on the user's matplotlibrc.
        matplotlib.rcdefaults()
        rc = matplotlib.rcParams
        rc["svg.fonttype"] = "path"  # text as paths: the page needs no font
        rc["font.family"] = "DejaVu Sans"
        rc["font.size"] = 9.0
        rc["legend.fontsize"] = 8.0
        rc["axes.grid"] = True
        rc["grid.alpha"] = 0.3
        for plot_id, title, draw in PLOTS:
            # Each plot its own salt: equal ids in two SVGs of one page would clash.
            rc["svg.hashsalt"] = f"envbuild-bench-{plot_id}"

            try:
                figure, caption = draw(images, figure_of)
                svg = _svg(figure, plot_id) if figure is not None else ""
            except (ValueError, OverflowError, RuntimeError) as exc:
                # Odd but finite values can still defeat a layout; the page says so and goes on.
                figure, svg = None, ""
                caption = (
                    f"This plot could not be drawn from the document's values ({_text(exc, 200)})."
                )
            if figure is None:
                plots.append(_Plot(id=plot_id, title=title, caption="", missing=caption))
            else:
                plots.append(_Plot(id=plot_id, title=title, caption=caption, svg=svg))
    return plots


# --------------------------------------------------------------------------
# the page

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
    number = _num(value)
    return "unknown" if number is None else _memory(number)


def _host(doc: dict[str, Any]) -> str:
    host = _dict(doc.get("host"))
    cores = _num(host.get("cores"))
    rows = [
        ["CPU", _e(host.get("cpu_model")) or "unknown"],
        ["cores", f"{cores:g}" if cores is not None else "unknown"],
        ["memory", _e(_bytes_text(host.get("memory_bytes")))],
        ["engine", _e(host.get("engine")) or "unknown"],
    ]
    gpus = _list(host.get("gpus"))
    for gpu in gpus:
        gpu = _dict(gpu)
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


def _overview(images: list[_Image]) -> str:
    if not images:
        return '<h2>Images</h2><p class="missing">The document holds no images.</p>'
    rows = []
    for image in images:
        r = image.record
        seconds = _num(r.get("seconds"))
        ok = r.get("ok") is True
        rows.append(
            [
                _td(_e(image.index + 1), numeric=True),
                _td(f'<a href="#image-{image.index + 1}">{_e(image.ref)}</a>'),
                _td(
                    f'<code title="{_e(r.get("image_id"))}">'
                    f"{_e(_text(r.get('image_id'), 19))}</code>"
                ),
                _td(f"{_e(r.get('framework'))} {_e(r.get('framework_version'))}"),
                _td(_e(r.get("cuda"))),
                _td(_e(r.get("python"))),
                _td("yes" if r.get("gpus") is True else "no"),
                _td(f"{seconds:.1f} s" if seconds is not None else "?", numeric=True),
                _td('<span class="ok">ok</span>' if ok else '<span class="bad">FAILED</span>'),
                _td(str(len(_texts(image, "errors"))), numeric=True),
                _td(str(len(_texts(image, "skipped"))), numeric=True),
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
    lines = _list(doc.get("advice"), MAX_ROWS)
    if not lines:
        return '<h2>Advice</h2><p class="missing">No advice: the figures gave no rule anything to say.</p>'
    # Grouped by image, in the order the advice came; lines about no one image come first.
    groups: dict[str, list[str]] = {}
    for line in lines:
        line = _dict(line)
        cites = []
        for figure in _list(line.get("figures"), 16):
            figure = _dict(figure)
            value = _num(figure.get("value"))
            shown = fmt(value) if value is not None else "?"
            cites.append(f"<code>{_e(_text(figure.get('path'), 300))} = {_e(shown)}</code>")
        image = _text(line.get("image"))
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
    for row in _list(comparison.get("rows"), MAX_ROWS):
        row = _dict(row)
        before, after = _num(row.get("before")), _num(row.get("after"))
        relative = _num(row.get("change"))
        if relative is None and before is not None and after is not None and before != 0:
            relative = after / before - 1.0
        change = f"{relative * 100:+.1f}%" if relative is not None else "?"
        regression = row.get("regression") is True
        rows.append(
            [
                _td(_e(row.get("image"))),
                _td(f"<code>{_e(_text(row.get('figure'), 300))}</code>"),
                _td(_e(fmt(before)) if before is not None else "?", numeric=True),
                _td(_e(fmt(after)) if after is not None else "?", numeric=True),
                _td(_e(row.get("unit"))),
                _td(_e(change), numeric=True),
                _td(_e(_percent(_num(row.get("spread")))), numeric=True),
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
    unmatched = [_e(u) for u in _list(comparison.get("unmatched"), MAX_IMAGES)]
    if unmatched:
        body += f"<p>Not in the earlier run: {', '.join(unmatched)}.</p>"
    return (
        f"<h2>Compared with {against}</h2><p>{count} regression{'s' if count != 1 else ''} "
        "beyond the measured spread.</p>" + body
    )


def _figure_row(part: str, what: str, figure: object, note: str = "") -> list[str]:
    median = _median(figure)
    unit = _e(_dict(figure).get("unit"))
    value = f"{_e(fmt(median))} {unit}" if median is not None else "—"
    spread = _percent(_num(_dict(figure).get("spread"))) if median is not None else ""
    return [
        _td(_e(part)),
        _td(_e(what)),
        _td(value, numeric=True),
        _td(_e(spread), numeric=True),
        _td(_e(note)),
    ]


def _figure_rows(image: _Image) -> list[list[str]]:
    rows: list[list[str]] = []
    throughput = image.part("throughput")
    for result in _list(throughput.get("results")):
        result = _dict(result)
        what = f"{_text(result.get('model'), 40)} {_text(result.get('precision'), 20)}"
        why = _text(result.get("unsupported") or result.get("skipped"), 300)
        note = why or f"batch {_text(result.get('batch'), 20)}, {_text(result.get('mode'), 60)}"
        rows.append(_figure_row("throughput", what, result, note))
    for result in _list(image.part("compile").get("results")):
        result = _dict(result)
        model = _text(result.get("model"), 40)
        seconds, speedup = _num(result.get("compile_seconds")), _num(result.get("speedup"))
        note = (f"compile {seconds:.1f} s" if seconds is not None else "compile time unknown") + (
            f", speed-up \u00d7{speedup:.2f}" if speedup is not None else ""
        )
        rows.append(_figure_row("compile", f"{model} eager", result.get("eager")))
        rows.append(_figure_row("compile", f"{model} compiled", result.get("compiled"), note))
    for sweep in _list(image.part("batch").get("sweeps"), MAX_SERIES):
        sweep = _dict(sweep)
        name = f"{_text(sweep.get('model'), 40)} {_text(sweep.get('precision'), 20)}"
        for point in _list(sweep.get("points")):
            point = _dict(point)
            peak = _num(point.get("peak_bytes"))
            rows.append(
                _figure_row(
                    "batch",
                    f"{name} @ {_text(point.get('batch'), 20)}",
                    point,
                    f"peak {_memory(peak)}" if peak is not None else "",
                )
            )
        fit, fit_peak = _num(sweep.get("largest_fit")), _num(sweep.get("largest_fit_peak_bytes"))
        end = f"largest {fit:g}" if fit is not None else "no batch ran"
        if fit_peak is not None:
            end += f" ({_memory(fit_peak)})"
        rows.append(
            _figure_row(
                "batch",
                f"{name}: sweep",
                None,
                f"{end}; stopped: {_text(sweep.get('stopped'), 300) or '?'}",
            )
        )
    loader = image.part("loader")
    if loader.get("step") is not None:
        rows.append(
            _figure_row(
                "loader", "training step", loader.get("step"), _text(loader.get("kind"), 100)
            )
        )
    for point in _list(loader.get("points")):
        point = _dict(point)
        rows.append(_figure_row("loader", f"{_text(point.get('workers'), 20)} workers", point))
    allreduce = image.part("allreduce")
    for point in _list(allreduce.get("points")):
        point = _dict(point)
        size, algbw = _num(point.get("bytes")), _num(point.get("algbw_gbps"))
        busbw = point.get("busbw")
        if not isinstance(busbw, dict):
            busbw = {"median": point.get("busbw_gbps"), "unit": "GB/s"}
        note = f"algbw {fmt(algbw)} GB/s" if algbw is not None else ""
        if point.get("note"):
            note += f"; {_text(point.get('note'), 200)}"
        rows.append(
            _figure_row(
                "allreduce", f"busbw @ {size_text(size) if size is not None else '?'}", busbw, note
            )
        )
    if allreduce.get("points"):
        correct = allreduce.get("correct")
        verdict = "yes" if correct is True else "NO" if correct is False else "unknown"
        rows.append(
            _figure_row(
                "allreduce",
                "correct",
                None,
                f"{verdict}; {_text(allreduce.get('backend'), 100)}, "
                f"world size {_text(allreduce.get('world_size'), 20)}",
            )
        )
    return rows


# How each part says it measured: (part, keys naming the method).
_METHODS = (
    ("throughput", ("mode",)),
    ("compile", ("eager_mode", "compiled_mode")),
    ("batch", ("memory",)),
    ("loader", ("kind",)),
    ("allreduce", ("backend",)),
)


def _how_measured(image: _Image) -> list[str]:
    """One line per part: its method, device and seconds, as the payload reported them."""
    lines = []
    for name, keys in _METHODS:
        part = image.part(name)
        method = " against ".join(_text(part.get(k), 200) for k in keys if part.get(k) is not None)
        device = _text(part.get("device"), 200)
        seconds = _num(part.get("seconds"))
        said = [method, f"on {device}" if device else "", f"{seconds:.1f} s" if seconds else ""]
        if any(said):
            lines.append(f"{name}: " + _e(", ".join(x for x in said if x)))
    return lines


def _image_section(image: _Image) -> str:
    versions = image.part("versions")
    facts = ", ".join(
        f"{k} {_e(_text(versions.get(k), 80))}"
        for k in ("python", "framework", "cuda", "cudnn", "nccl")
        if versions.get(k) is not None
    )
    devices = [
        f"{_e(_text(_dict(d).get('kind'), 20))} {_e(_text(_dict(d).get('name'), 100))}"
        for d in _list(image.bench.get("devices"), 16)
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
    errors, skipped = _texts(image, "errors"), _texts(image, "skipped")
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


def _plot_html(plot: _Plot) -> str:
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
    doc = _dict(doc)
    images = _images(doc)
    plots = _plots(images)
    budget = _num(doc.get("budget_s"))
    total = len(_list(doc.get("images"), 10**9))
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
