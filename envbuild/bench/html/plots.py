"""The page's plots: matplotlib figures drawn from the document, inlined as SVG.

The one module of envbuild that imports matplotlib, and only inside the functions that draw:
importing it (or the page) loads none of matplotlib until a page is rendered. Each plot is
drawn under fixed settings (not the user's matplotlibrc), with text as paths (the page needs
no font) and ids made unique to the plot, so the same document always gives the same SVG.
A plot with nothing to draw is a sentence saying why, never empty axes.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envbuild.bench.figures import fmt, number, size_text
from envbuild.bench.html.reading import (
    MAX_SERIES,
    Image,
    as_dict,
    cut_list,
    half_range,
    median_of,
    text_of,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

LEGEND_COLUMNS = 3
# A label inside a plot: longer ones are cut (the tables hold the whole text).
MAX_LABEL = 44

PRECISION_ORDER = ("fp32", "bf16", "fp16")
MODEL_ORDER = ("conv", "transformer")


def _ordered(names: Iterable[str], order: tuple[str, ...]) -> list[str]:
    """Known names in their usual order first, then the others as they came; at most MAX_SERIES."""
    seen = list(dict.fromkeys(names))
    return ([n for n in order if n in seen] + [n for n in seen if n not in order])[:MAX_SERIES]


def _plot_label(value: str, limit: int = MAX_LABEL) -> str:
    """Text safe to hand matplotlib: printable ASCII (DejaVu draws it all), no mathtext, no
    legend-hiding leading underscore, bounded."""
    text = "".join(c if " " <= c <= "~" else "?" for c in value.replace("…", "..."))
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    text = text.replace("\\", "/").replace("$", r"\$")
    return " " + text if text.startswith("_") else text


@dataclass(frozen=True, kw_only=True)
class Plot:
    """One plot of the page: its SVG and caption, or the sentence that says why there is none."""

    id: str
    title: str
    caption: str
    svg: str = ""
    missing: str = ""


# A plot's drawing: given the images, it returns (figure, caption) or (None, why there is none).
_Draw = Callable[[list[Image], Callable[[float, float], "Figure"]], tuple["Figure | None", str]]


def _missing(what: str, images: list[Image], section: str) -> str:
    """The sentence that stands in for a plot with nothing to draw."""
    if not images:
        return f"No {what} to plot: the document holds no images."
    return f"No {what} to plot ({_not_drawn(images, section)})."


def _not_drawn(images: list[Image], section: str) -> str:
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
    images: list[Image], figure_of: Callable[[float, float], Figure]
) -> tuple[Figure | None, str]:
    panels: list[tuple[Image, list[dict[str, Any]]]] = []
    for image in images:
        sweeps = [
            s
            for s in (as_dict(s) for s in cut_list(image.part("batch").get("sweeps"), MAX_SERIES))
            if _sweep_points(s)
        ]
        if sweeps:
            panels.append((image, sweeps))
    if not panels:
        return None, _missing("batch-size sweep", images, "batch")
    from matplotlib.ticker import FuncFormatter

    figure, axes = _grid(figure_of, len(panels))
    for ax, (image, sweeps) in zip(axes, panels, strict=True):
        models = {text_of(s.get("model"), 40) for s in sweeps}
        for n, sweep in enumerate(sweeps):
            x, y, err = _series(_sweep_points(sweep))
            name = text_of(sweep.get("precision"), 20) or "?"
            if len(models) > 1:
                name = f"{text_of(sweep.get('model'), 20)} {name}"
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
            fit = number(sweep.get("largest_fit"))
            if fit is not None and fit in x:
                stopped = text_of(sweep.get("stopped"), 200)
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
    for point in cut_list(sweep.get("points")):
        batch, median = number(as_dict(point).get("batch")), median_of(point)
        if batch is not None and batch > 0 and median is not None:
            points.append((batch, median, half_range(point)))
    return points


def _loader_points(image: Image) -> list[tuple[float, float, float]]:
    points = []
    for point in cut_list(image.part("loader").get("points")):
        workers, median = number(as_dict(point).get("workers")), median_of(point)
        if workers is not None and workers >= 0 and median is not None:
            points.append((workers, median, half_range(point)))
    return points


def _draw_loader(
    images: list[Image], figure_of: Callable[[float, float], Figure]
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
        step = median_of(image.part("loader").get("step"))
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


def _one_rank(image: Image) -> bool:
    return number(image.part("allreduce").get("world_size")) == 1


def _allreduce_points(image: Image) -> list[tuple[float, float, float]]:
    """(bytes, busbw, error) per message size; with one rank busbw is 0 by definition, so its
    algbw (a copy within the device) is drawn instead, and labelled so."""
    one_rank = _one_rank(image)
    points = []
    for point in cut_list(image.part("allreduce").get("points")):
        point = as_dict(point)
        size = number(point.get("bytes"))
        figure = None if one_rank else point.get("busbw")
        value = median_of(figure)
        if value is None:
            value = number(point.get("algbw_gbps" if one_rank else "busbw_gbps"))
        if size is not None and size > 0 and value is not None:
            points.append((size, value, half_range(figure)))
    return points


def _draw_allreduce(
    images: list[Image], figure_of: Callable[[float, float], Figure]
) -> tuple[Figure | None, str]:
    lines = [(i, p) for i in images if (p := _allreduce_points(i))]
    if not lines:
        return None, _missing("all-reduce measurement", images, "allreduce")
    from matplotlib.ticker import FuncFormatter

    figure, (ax,) = _grid(figure_of, 1, legend_entries=len(lines), legend_columns=1)
    notes = []
    for image, points in lines:
        part = image.part("allreduce")
        backend = text_of(part.get("backend"), 40) or "?"
        world = number(part.get("world_size"))
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


def _throughput_table(images: list[Image]) -> dict[str, dict[str, dict[int, dict[str, Any]]]]:
    """model -> precision -> image index -> the result (a figure, or why there is none)."""
    table: dict[str, dict[str, dict[int, dict[str, Any]]]] = {}
    for image in images:
        for result in cut_list(image.part("throughput").get("results")):
            result = as_dict(result)
            model = text_of(result.get("model"), 40) or "?"
            precision = text_of(result.get("precision"), 20) or "?"
            table.setdefault(model, {}).setdefault(precision, {}).setdefault(image.index, result)
    return table


def _draw_throughput(
    images: list[Image], figure_of: Callable[[float, float], Figure]
) -> tuple[Figure | None, str]:
    table = _throughput_table(images)
    models = [
        m
        for m in _ordered(table, MODEL_ORDER)
        if any(median_of(r) is not None for p in table[m].values() for r in p.values())
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
            if any(median_of(r) is not None for r in table[model][p].values())
        ]
        for n, image in enumerate(images):
            for g, precision in enumerate(precisions):
                result = table[model][precision].get(image.index)
                x = g - 0.4 + width * (n + 0.5)
                if result is None:
                    continue
                median = median_of(result)
                if median is None:
                    ax.text(x, 0, "n/a", rotation=90, ha="center", va="bottom", fontsize=6)
                    continue
                drawn.add(image.index)
                ax.bar(
                    x,
                    median,
                    width=width,
                    yerr=half_range(result),
                    capsize=2,
                    color=image.colour,
                    label=_plot_label(image.label),
                )
        ax.set_xticks(range(len(precisions)), [_plot_label(p) for p in precisions])
        ax.set_ylabel("samples/s")
        ax.set_title(_plot_label(model), fontsize=9)
    _figure_legend(figure, axes)
    modes = "; ".join(
        f"{i.label}: {text_of(i.part('throughput').get('mode'), 60) or 'mode unknown'}"
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


def _short_name(image: Image) -> str:
    """A tick label: the image's number and its framework (the legends carry the whole name)."""
    framework = text_of(image.record.get("framework"), 16) or image.label.split(" ", 1)[-1][:16]
    return f"{image.index + 1}. {framework}"


def _compile_results(image: Image) -> dict[str, dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    for result in cut_list(image.part("compile").get("results")):
        result = as_dict(result)
        if (
            median_of(result.get("eager")) is not None
            or median_of(result.get("compiled")) is not None
        ):
            results.setdefault(text_of(result.get("model"), 40) or "?", result)
    return results


def _draw_compile(
    images: list[Image], figure_of: Callable[[float, float], Figure]
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
                median = median_of(figure_)
                if median is None:
                    ax.text(n + offset, 0, "n/a", rotation=90, ha="center", va="bottom", fontsize=6)
                    continue
                ax.bar(
                    n + offset,
                    median,
                    width=0.38,
                    yerr=half_range(figure_),
                    capsize=2,
                    color=image.colour,
                    hatch=hatch,
                    edgecolor="black",
                    linewidth=0.5,
                    label=name if n == 0 else None,
                )
            # Above the error bars too.
            top = max((median_of(f) or 0.0) + half_range(f) for f in (eager, compiled))
            seconds, speedup = number(result.get("compile_seconds")), number(result.get("speedup"))
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


def draw_plots(images: list[Image]) -> list[Plot]:
    """Every plot of the page, in order, drawn from the images under fixed settings."""
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
                    "This plot could not be drawn from the document's values "
                    f"({text_of(exc, 200)})."
                )
            if figure is None:
                plots.append(Plot(id=plot_id, title=title, caption="", missing=caption))
            else:
                plots.append(Plot(id=plot_id, title=title, caption=caption, svg=svg))
    return plots
