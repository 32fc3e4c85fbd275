"""Advice derived from a bench document, each line citing the figures it rests on.

Each rule is a pure function over the document, like compat's rules: it returns Advice whose
`figures` are (JSON pointer, value) pairs present in the document, and whose text prints those
values as `cited_text` does, so that a reader can find every number in the JSON.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envbuild.bench.figures import bench_part as _part
from envbuild.bench.figures import best_point, fmt, number, size_text
from envbuild.bench.figures import dict_items as _list
from envbuild.bench.figures import image_runs as _images

# A ratio this close to 1, or within the figures' own spreads, is "alike", not a speed-up.
MIN_EFFECT = 0.10
# A loader keeps up when it delivers at least the step's rate times this (room for jitter).
LOADER_HEADROOM = 1.1
# The batch sweep "levels off" at the first batch giving this fraction of the best throughput.
KNEE = 0.9


@dataclass(frozen=True, kw_only=True)
class Advice:
    """One line of advice about one image (or None: about the images side by side)."""

    image: str | None
    topic: str
    text: str
    figures: tuple[tuple[str, float], ...]

    def as_dict(self) -> dict[str, Any]:
        """The advice as the bench document holds it."""
        return {
            "image": self.image,
            "topic": self.topic,
            "text": self.text,
            "figures": [
                {"path": path, "value": value, "shown": cited_text(path, value)}
                for path, value in self.figures
            ],
        }


def cited_text(path: str, value: float) -> str:
    """How an advice line prints a cited figure: bytes in GB, everything else as fmt does."""
    return _gb(value) if path.endswith("_bytes") else fmt(value)


def _spread(item: dict[str, Any]) -> float:
    value = number(item.get("spread"))
    return value if value is not None and value >= 0 else 0.0


def _ratio_text(ratio: float) -> str:
    return f"{ratio:.2f}".rstrip("0").rstrip(".") + "×"


def _differs(ratio: float, *items: dict[str, Any]) -> bool:
    """A ratio is an effect when it is beyond MIN_EFFECT and beyond the figures' spreads."""
    allowed = max(MIN_EFFECT, sum(_spread(item) for item in items))
    return abs(ratio - 1.0) > allowed


def _name(run: dict[str, Any]) -> str:
    return str(run.get("image") or "image")


def _gb(value: float) -> str:
    return f"{fmt(value / 1e9)} GB"


# The rules about one image: each takes the document and the image's index.


def precision_advice(doc: dict[str, Any], index: int) -> list[Advice]:
    """bf16 (and fp16) against fp32, per model: use autocast where it is faster, at the
    throughput section's batch or, where the batch sweeps measured both, at the largest batch.

    A mixed-precision step that is slower at a small batch says little about the arithmetic: on
    a large GPU such a step is bound by kernel launches and casts (measured on an H200: bf16
    0.79x fp32 on the transformer at batch 64). The sweeps' largest common batch says whether
    the arithmetic is faster; without it, the advice is about the measured batch alone."""
    run = _images(doc)[index]
    base = f"/images/{index}/bench/throughput/results"
    by_key = {
        (str(item.get("model")), str(item.get("precision"))): (i, item)
        for i, item in _list(_part(run, "throughput"), "results")
        if number(item.get("median")) is not None
    }
    advice = []
    for (model, precision), (j, mixed) in by_key.items():
        if precision == "fp32" or (model, "fp32") not in by_key:
            continue
        i, fp32 = by_key[(model, "fp32")]
        a, b = number(mixed.get("median")), number(fp32.get("median"))
        if a is None or b is None or b <= 0:
            continue
        ratio = a / b
        figures = f"({fmt(a)} against {fmt(b)} samples/s)"
        cites: tuple[tuple[str, float], ...] = (
            (f"{base}/{j}/median", a),
            (f"{base}/{i}/median", b),
        )
        how = "bf16 autocast" if precision == "bf16" else "fp16 autocast with loss scaling"
        batch = number(mixed.get("batch"))
        at = f" at batch {fmt(batch)}" if batch is not None else ""
        large = _largest_common_batch(run, index, model, precision, batch)
        if _differs(ratio, mixed, fp32) and ratio > 1:
            text = f"{precision} is {_ratio_text(ratio)} fp32 on the {model} here {figures}: train with {how}"
        elif large is not None and large.faster:
            text = (
                f"{precision} is {_ratio_text(large.ratio)} fp32 on the {model} at batch "
                f"{fmt(large.batch)} here {large.figures}, {_ratio_text(ratio)}{at} {figures}: "
                f"a small step is bound by launches and casts, not arithmetic; train with {how} "
                "at large batches"
            )
            cites = (*large.cites, *cites)
        elif _differs(ratio, mixed, fp32):
            also = ""
            if large is not None:
                also = f", {_ratio_text(large.ratio)} at batch {fmt(large.batch)} {large.figures}"
                cites = (*cites, *large.cites)
            text = (
                f"{precision} is {_ratio_text(ratio)} fp32 on the {model}{at} here {figures}{also}: "
                f"this device gains nothing from {precision} at the batches measured; keep fp32 for speed"
            )
        else:
            text = (
                f"{precision} and fp32 run alike on the {model} here {figures}: mixed precision "
                "saves activation memory, not time"
            )
        advice.append(Advice(image=_name(run), topic="precision", text=text, figures=cites))
    return advice


@dataclass(frozen=True, kw_only=True)
class _LargeBatch:
    """A mixed precision against fp32 at the largest batch both sweeps measured."""

    batch: float
    ratio: float
    faster: bool  # beyond MIN_EFFECT and the points' spreads
    figures: str
    cites: tuple[tuple[str, float], ...]


def _largest_common_batch(
    run: dict[str, Any], index: int, model: str, precision: str, above: float | None
) -> _LargeBatch | None:
    """Mixed `precision` against fp32 on `model` at the largest batch (above `above`) that both
    batch sweeps of image `index` (`run`) measured; None when they did not."""
    points: dict[str, dict[float, tuple[str, dict[str, Any], float]]] = {}
    for s, sweep in _list(_part(run, "batch"), "sweeps"):
        if str(sweep.get("model")) != model or str(sweep.get("precision")) not in (
            "fp32",
            precision,
        ):
            continue
        found = points.setdefault(str(sweep.get("precision")), {})
        for k, point in _list(sweep, "points"):
            size, median = number(point.get("batch")), number(point.get("median"))
            if size is not None and median is not None and median > 0:
                found[size] = (
                    f"/images/{index}/bench/batch/sweeps/{s}/points/{k}/median",
                    point,
                    median,
                )
    common = set(points.get("fp32", {})) & set(points.get(precision, {}))
    if not common or (above is not None and max(common) <= above):
        return None
    size = max(common)
    fp32_path, fp32_point, b = points["fp32"][size]
    mixed_path, mixed_point, a = points[precision][size]
    ratio = a / b
    return _LargeBatch(
        batch=size,
        ratio=ratio,
        faster=_differs(ratio, mixed_point, fp32_point) and ratio > 1,
        figures=f"({fmt(a)} against {fmt(b)} samples/s)",
        cites=((mixed_path, a), (fp32_path, b)),
    )


def loader_advice(doc: dict[str, Any], index: int) -> list[Advice]:
    """The fewest loader workers that keep up with the training step."""
    run = _images(doc)[index]
    loader = _part(run, "loader")
    step = loader.get("step")
    rate = number(step.get("median")) if isinstance(step, dict) else None
    base = f"/images/{index}/bench/loader"
    points = sorted(
        (
            (int(w), i, m)
            for i, p in _list(loader, "points")
            if isinstance(w := p.get("workers"), int) and not isinstance(w, bool)
            and (m := number(p.get("median"))) is not None
        ),
        key=lambda t: t[0],
    )  # fmt: skip
    if rate is None or rate <= 0 or not points:
        return []
    step_cite = (f"{base}/step/median", rate)
    workers = [t for t in points if t[0] >= 1]
    enough = [t for t in workers if t[2] >= rate * LOADER_HEADROOM]
    name = _name(run)
    if not workers:
        return []
    if not enough:
        w, i, m = max(workers, key=lambda t: t[2])
        text = (
            f"even {w} loader workers starve the step (loader {fmt(m)} batches/s, step {fmt(rate)}): "
            "loading bounds training here; make per-sample work cheaper or give the loader more cores"
        )
        return [
            Advice(
                image=name,
                topic="loader",
                text=text,
                figures=((f"{base}/points/{i}/median", m), step_cite),
            )
        ]
    w, i, m = enough[0]
    starving = [t for t in workers if t[0] < w]
    if starving:
        sw, si, sm = starving[-1]
        noun = "worker starves" if sw == 1 else "workers starve"
        text = f"{sw} loader {noun} the step (loader {fmt(sm)} batches/s, step {fmt(rate)}): use {w} ({fmt(m)} batches/s)"
        cites: tuple[tuple[str, float], ...] = (
            (f"{base}/points/{si}/median", sm),
            step_cite,
            (f"{base}/points/{i}/median", m),
        )
    else:
        noun = "worker keeps" if w == 1 else "workers keep"
        text = f"{w} loader {noun} up with the step (loader {fmt(m)} batches/s, step {fmt(rate)}): use {w} or more"
        cites = ((f"{base}/points/{i}/median", m), step_cite)
    return [Advice(image=name, topic="loader", text=text, figures=cites)]


def batch_advice(doc: dict[str, Any], index: int) -> list[Advice]:
    """The largest batch that fits (or was measured), and where throughput levels off."""
    run = _images(doc)[index]
    advice = []
    for s, sweep in _list(_part(run, "batch"), "sweeps"):
        base = f"/images/{index}/bench/batch/sweeps/{s}"
        what = f"{sweep.get('model')} {sweep.get('precision')}"
        largest = number(sweep.get("largest_fit"))
        peak = number(sweep.get("largest_fit_peak_bytes"))
        stopped = str(sweep.get("stopped") or "")
        if largest is not None and peak is not None:
            cites = ((f"{base}/largest_fit", largest), (f"{base}/largest_fit_peak_bytes", peak))
            if stopped.startswith(("out of memory", "memory")):
                text = f"largest {what} batch that fits: {fmt(largest)} ({_gb(peak)} peak memory)"
            else:
                text = (
                    f"largest {what} batch measured: {fmt(largest)} ({_gb(peak)} peak memory); "
                    f"the sweep stopped before memory ran out ({stopped[:200]})"
                )
            advice.append(Advice(image=_name(run), topic="batch", text=text, figures=cites))
        best = best_point(sweep)
        if best is None:
            continue
        j, top = best
        top_rate = number(top.get("median")) or 0.0
        for k, point in _list(sweep, "points"):
            rate = number(point.get("median"))
            if rate is not None and top_rate > 0 and rate >= KNEE * top_rate:
                if k == j:
                    break
                text = (
                    f"{what} throughput levels off from batch {point.get('batch')} "
                    f"({fmt(rate)} samples/s, {rate / top_rate:.0%} of the best: {fmt(top_rate)} "
                    f"at batch {top.get('batch')})"
                )
                cites = (
                    (f"{base}/points/{k}/median", rate),
                    (f"{base}/points/{j}/median", top_rate),
                )
                advice.append(Advice(image=_name(run), topic="batch", text=text, figures=cites))
                break
    return advice


def compile_advice(doc: dict[str, Any], index: int) -> list[Advice]:
    """Compiled against eager, per model, with the steps it takes to earn the compile time back."""
    run = _images(doc)[index]
    part = _part(run, "compile")
    eager_mode = str(part.get("eager_mode") or "eager")
    compiled_mode = str(part.get("compiled_mode") or "compiled")
    advice = []
    for i, item in _list(part, "results"):
        base = f"/images/{index}/bench/compile/results/{i}"
        eager, compiled = item.get("eager"), item.get("compiled")
        if not isinstance(eager, dict) or not isinstance(compiled, dict):
            continue
        e, c = number(eager.get("median")), number(compiled.get("median"))
        seconds = number(item.get("compile_seconds"))
        if e is None or c is None or e <= 0 or c <= 0:
            continue
        ratio = c / e
        model = item.get("model")
        cites: tuple[tuple[str, float], ...] = (
            (f"{base}/compiled/median", c),
            (f"{base}/eager/median", e),
        )
        rates = f"({fmt(c)} against {fmt(e)} samples/s)"
        if _differs(ratio, eager, compiled) and ratio > 1:
            text = f"{compiled_mode} is {_ratio_text(ratio)} {eager_mode} on the {model} {rates}"
            batch = number(item.get("batch"))
            if seconds is not None and batch:
                saved = 1.0 / e - 1.0 / c  # seconds saved per sample
                steps = math.ceil(seconds / saved / batch)
                text += (
                    f" after {fmt(seconds)} s compiling: worth it for runs longer than "
                    f"{fmt(steps)} steps of batch {fmt(batch)}"
                )
                cites = (*cites, (f"{base}/compile_seconds", seconds))
        elif _differs(ratio, eager, compiled):
            text = f"{compiled_mode} is {_ratio_text(ratio)} {eager_mode} on the {model} {rates}: keep {eager_mode} here"
        else:
            text = f"{compiled_mode} and {eager_mode} run alike on the {model} {rates}: compiling buys nothing here"
        advice.append(Advice(image=_name(run), topic="compile", text=text, figures=cites))
    return advice


def allreduce_advice(doc: dict[str, Any], index: int) -> list[Advice]:
    """The bus bandwidth the all-reduce reaches at its largest message, and what it means."""
    run = _images(doc)[index]
    part = _part(run, "allreduce")
    points = [
        (i, p) for i, p in _list(part, "points")
        if number(p.get("bytes")) is not None and isinstance(p.get("busbw"), dict)
        and number(p["busbw"].get("median")) is not None
    ]  # fmt: skip
    if not points:
        return []
    i, point = max(points, key=lambda t: number(t[1].get("bytes")) or 0.0)
    base = f"/images/{index}/bench/allreduce/points/{i}"
    size = size_text(number(point.get("bytes")) or 0)
    world = number(part.get("world_size")) or 0
    backend = str(part.get("backend") or "the all-reduce")
    busbw = number(point["busbw"].get("median")) or 0.0
    if world <= 1:
        algbw = number(point.get("algbw_gbps"))
        if algbw is None:
            return []
        # Not a copy's speed: NCCL's in-place all-reduce over one rank moves nothing (an H200
        # "reached" 9,948 GB/s at 256 MiB, twice what its memory can copy).
        text = (
            f"one rank: {backend} has nothing to exchange ({fmt(algbw)} GB/s algbw at {size} "
            "times the call, not a link); bus bandwidth needs 2 or more GPUs"
        )
        cites: tuple[tuple[str, float], ...] = ((f"{base}/algbw_gbps", algbw),)
    else:
        on_gpu = bool(run.get("gpus")) and "nccl" in backend.lower()
        where = (
            f"over {fmt(world)} GPUs"
            if on_gpu
            else f"between {fmt(world)} CPU ranks (host memory, no network)"
        )
        text = f"{backend} reaches {fmt(busbw)} GB/s busbw at {size} {where}"
        cites = ((f"{base}/busbw/median", busbw),)
    return [Advice(image=_name(run), topic="allreduce", text=text, figures=cites)]


PER_IMAGE: tuple[Callable[[dict[str, Any], int], list[Advice]], ...] = (
    precision_advice,
    compile_advice,
    batch_advice,
    loader_advice,
    allreduce_advice,
)


# The rules about the images side by side.


def framework_advice(doc: dict[str, Any]) -> list[Advice]:
    """Frameworks against each other, per model, at fp32 in their default modes."""
    # (model, framework) -> its best fp32 result: (median, JSON pointer, the result itself)
    best: dict[tuple[str, str], tuple[float, str, dict[str, Any]]] = {}
    for index, run in enumerate(_images(doc)):
        framework = str(run.get("framework") or "")
        for i, item in _list(_part(run, "throughput"), "results"):
            rate = number(item.get("median"))
            if rate is None or item.get("precision") != "fp32":
                continue
            key = (str(item.get("model")), framework)
            if key not in best or rate > best[key][0]:
                best[key] = (rate, f"/images/{index}/bench/throughput/results/{i}/median", item)
    advice = []
    for model in sorted({m for m, _ in best}):
        ranked = sorted(
            ((v, f) for (m, f), v in best.items() if m == model), key=lambda t: -t[0][0]
        )
        if len(ranked) < 2:
            continue
        (top, top_path, top_item), top_fw = ranked[0]
        for (rate, path, item), framework in ranked[1:]:
            if rate <= 0:
                continue
            ratio = top / rate
            figures = f"({fmt(top)} against {fmt(rate)} samples/s)"
            if _differs(ratio, top_item, item):
                text = f"{top_fw} is {_ratio_text(ratio)} {framework} on the {model} at fp32 on this host {figures}"
            else:
                text = f"{top_fw} and {framework} run alike on the {model} at fp32 on this host {figures}"
            advice.append(
                Advice(
                    image=None,
                    topic="framework",
                    text=text,
                    figures=((top_path, top), (path, rate)),
                )
            )
    return advice


def advise(doc: dict[str, Any]) -> list[Advice]:
    """Every advice line the document's figures support, image by image, then side by side."""
    advice: list[Advice] = []
    for index in range(len(_images(doc))):
        for rule in PER_IMAGE:
            advice.extend(rule(doc, index))
    advice.extend(framework_advice(doc))
    return advice
