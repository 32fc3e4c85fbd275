"""The figures of a bench document, each with its JSON pointer: what tables, advice and
comparisons read, so that each of them names figures the same way and cites where they are."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Bounds on what is read from a document (a --compare file is hostile input).
MAX_IMAGES = 32
MAX_ITEMS = 64
# Numbers beyond this are not figures of any bench (1e18 bytes is an exabyte): read as missing.
MAX_MAGNITUDE = 1e18


@dataclass(frozen=True, kw_only=True)
class Figure:
    """One measured figure of one image: a median with its spread, where it is in the document."""

    key: str  # stable name across runs: "throughput conv bf16"
    label: str  # for people: "conv bf16"
    unit: str
    median: float
    spread: float | None  # half the range over the median
    path: str  # JSON pointer to the median: /images/0/bench/throughput/results/1/median
    higher_is_better: bool = True


def pointer(doc: Any, path: str) -> Any:
    """The value at a JSON pointer (RFC 6901) in ``doc``; KeyError when there is none."""
    node = doc
    for raw in path.split("/")[1:]:
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, list):
            if not token.isdigit() or int(token) >= len(node):
                raise KeyError(path)
            node = node[int(token)]
        elif isinstance(node, dict) and token in node:
            node = node[token]
        else:
            raise KeyError(path)
    return node


def number(value: Any) -> float | None:
    """A figure from a document value: a finite int or float within MAX_MAGNITUDE, else None."""
    # Python counts a bool as an int, but `true` in a document is no figure.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    # Before float(): an int of 400 digits would overflow it.
    if isinstance(value, int) and abs(value) > MAX_MAGNITUDE:
        return None
    figure = float(value)
    return figure if math.isfinite(figure) and abs(figure) <= MAX_MAGNITUDE else None


def image_runs(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The document's images (at most MAX_IMAGES), each a dict ({} for one that is not)."""
    images = doc.get("images")
    if not isinstance(images, list):
        return []
    return [run if isinstance(run, dict) else {} for run in images[:MAX_IMAGES]]


def bench_part(run: dict[str, Any], name: str) -> dict[str, Any]:
    """A part of an image's payload document ({} when it is missing or not a dict)."""
    bench = run.get("bench")
    part = bench.get(name) if isinstance(bench, dict) else None
    return part if isinstance(part, dict) else {}


def dict_items(part: dict[str, Any], key: str) -> list[tuple[int, dict[str, Any]]]:
    """(index, item) of the dicts in a part's list (at most MAX_ITEMS)."""
    items = part.get(key)
    if not isinstance(items, list):
        return []
    return [(i, item) for i, item in enumerate(items[:MAX_ITEMS]) if isinstance(item, dict)]


def _figure(
    item: dict[str, Any],
    base: str,
    *,
    key: str,
    label: str,
    higher: bool = True,
    value: str = "median",
) -> Figure | None:
    median = number(item.get(value))
    if median is None:
        return None
    spread = number(item.get("spread")) if value == "median" else None
    return Figure(
        key=key,
        label=label,
        unit=str(item.get("unit") or ""),
        median=median,
        spread=spread,
        path=f"{base}/{value}",
        higher_is_better=higher,
    )


def image_figures(doc: dict[str, Any], index: int) -> list[Figure]:
    """Every figure of image ``index`` of the document, in a stable order."""
    images = doc.get("images")
    if not isinstance(images, list) or not 0 <= index < min(len(images), MAX_IMAGES):
        return []
    run = images[index]
    if not isinstance(run, dict):
        return []
    found: list[Figure | None] = []
    for name, read in _PART_FIGURES:
        found += read(bench_part(run, name), f"/images/{index}/bench/{name}")
    return [f for f in found if f is not None]


def _throughput_figures(part: dict[str, Any], base: str) -> list[Figure | None]:
    found = []
    for i, item in dict_items(part, "results"):
        model, precision = str(item.get("model")), str(item.get("precision"))
        found.append(
            _figure(
                item, f"{base}/results/{i}",
                key=f"throughput {model} {precision}", label=f"{model} {precision}",
            )
        )  # fmt: skip
    return found


def _compile_figures(part: dict[str, Any], base: str) -> list[Figure | None]:
    found: list[Figure | None] = []
    for i, item in dict_items(part, "results"):
        model = str(item.get("model"))
        for side in ("eager", "compiled"):
            inner = item.get(side)
            if isinstance(inner, dict):
                found.append(
                    _figure(
                        inner, f"{base}/results/{i}/{side}",
                        key=f"compile {model} {side}", label=f"{model} {side}",
                    )
                )  # fmt: skip
        seconds = number(item.get("compile_seconds"))
        if seconds is not None:
            found.append(
                Figure(
                    key=f"compile {model} compile seconds", label=f"{model} compiling",
                    unit="s", median=seconds, spread=None,
                    path=f"{base}/results/{i}/compile_seconds", higher_is_better=False,
                )
            )  # fmt: skip
    return found


def _batch_figures(part: dict[str, Any], base: str) -> list[Figure | None]:
    """Per sweep: its best point, and the largest batch it ran."""
    found: list[Figure | None] = []
    for i, sweep in dict_items(part, "sweeps"):
        model, precision = str(sweep.get("model")), str(sweep.get("precision"))
        best = best_point(sweep)
        if best is not None:
            j, point = best
            found.append(
                _figure(
                    point, f"{base}/sweeps/{i}/points/{j}",
                    key=f"batch {model} {precision} best", label=f"{model} {precision} best (batch {point.get('batch')})",
                )
            )  # fmt: skip
        largest = number(sweep.get("largest_fit"))
        if largest is not None:
            found.append(
                Figure(
                    key=f"batch {model} {precision} largest", label=f"{model} {precision} largest batch",
                    unit="samples", median=largest, spread=None,
                    path=f"{base}/sweeps/{i}/largest_fit",
                )
            )  # fmt: skip
    return found


def _loader_figures(part: dict[str, Any], base: str) -> list[Figure | None]:
    found = []
    step = part.get("step")
    if isinstance(step, dict):
        found.append(_figure(step, f"{base}/step", key="loader step", label="step consumes"))
    for i, point in dict_items(part, "points"):
        workers = point.get("workers")
        found.append(
            _figure(
                point, f"{base}/points/{i}",
                key=f"loader {workers} workers", label=f"loader, {workers} workers",
            )
        )  # fmt: skip
    return found


def _allreduce_figures(part: dict[str, Any], base: str) -> list[Figure | None]:
    """The bus bandwidth per message size (keyed by bytes, which stay the same across runs)."""
    found = []
    for i, point in dict_items(part, "points"):
        size = number(point.get("bytes"))
        busbw = point.get("busbw")
        if size is None or not isinstance(busbw, dict):
            continue
        found.append(
            _figure(
                busbw, f"{base}/points/{i}/busbw",
                key=f"allreduce busbw {int(size)}", label=f"busbw {size_text(size)}",
            )
        )  # fmt: skip
    return found


# Each part of an image's document and how its figures are read, in the order tables show them.
_PART_FIGURES: tuple[tuple[str, Callable[[dict[str, Any], str], list[Figure | None]]], ...] = (
    ("throughput", _throughput_figures),
    ("compile", _compile_figures),
    ("batch", _batch_figures),
    ("loader", _loader_figures),
    ("allreduce", _allreduce_figures),
)


def best_point(sweep: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
    """The point of a batch sweep with the highest median throughput, with its index."""
    best: tuple[int, dict[str, Any]] | None = None
    for j, point in dict_items(sweep, "points"):
        median = number(point.get("median"))
        if median is None:
            continue
        if best is None or median > (number(best[1].get("median")) or 0.0):
            best = (j, point)
    return best


def size_text(size: float) -> str:
    """Bytes as nccl-tests prints message sizes: 8 B, 32 KiB, 256 MiB."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:g} {unit}"
        value /= 1024
    return f"{value:g} GiB"


def fmt(value: float) -> str:
    """A figure as advice and tables print it: 3 significant digits, thousands kept whole."""
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def display_name(key: str) -> str:
    """A figure's key as tables show it: message sizes in B/KiB/MiB (the key keeps bytes)."""
    head, _, size = key.rpartition(" ")
    if head == "allreduce busbw" and size.isdigit():
        return f"{head} {size_text(int(size))}"
    return key
