"""Each figure of a bench run beside the same figure of an earlier run: the change, and
whether it is a regression beyond the spreads both runs measured."""

from __future__ import annotations

from typing import Any

from envbuild.bench.figures import MAX_IMAGES, image_figures

# A figure without a measured spread (compile seconds, the largest batch) is a regression when
# it is worse by more than this; a measured one when it is worse by more than both spreads.
FLAT_TOLERANCE = 0.10
MIN_TOLERANCE = 0.02


def _list_of(value: Any) -> list[Any]:
    return value[:MAX_IMAGES] if isinstance(value, list) else []


def _match(run: dict[str, Any], previous: list[dict[str, Any]]) -> int | None:
    """The index of the previous run of the same image: same reference, else same image id."""
    for key in ("image", "image_id"):
        for i, old in enumerate(previous[:MAX_IMAGES]):
            if isinstance(old, dict) and old.get(key) and old.get(key) == run.get(key):
                return i
    return None


def compare_documents(
    doc: dict[str, Any], previous: dict[str, Any], *, against: str
) -> dict[str, Any]:
    """Each figure of ``doc`` beside the same figure in ``previous`` (same image, same key): the
    change, and whether it is a regression beyond the measured spreads."""
    rows: list[dict[str, Any]] = []
    unmatched: list[str] = []
    images = _list_of(doc.get("images"))
    old_images = _list_of(previous.get("images"))
    for index, run in enumerate(images[:MAX_IMAGES]):
        if not isinstance(run, dict):
            continue
        old_index = _match(run, old_images)
        if old_index is None:
            unmatched.append(str(run.get("image")))
            continue
        old = {f.key: f for f in image_figures(previous, old_index)}
        for figure in image_figures(doc, index):
            before = old.get(figure.key)
            if before is None or before.median == 0:
                continue
            change = figure.median / before.median - 1.0
            worse = -change if figure.higher_is_better else change
            if figure.spread is None or before.spread is None:
                tolerance = FLAT_TOLERANCE
            else:
                tolerance = max(MIN_TOLERANCE, figure.spread + before.spread)
            rows.append(
                {
                    "image": run.get("image"),
                    "figure": figure.key,
                    "unit": figure.unit,
                    "before": before.median,
                    "after": figure.median,
                    "change": change,
                    "spread": tolerance,
                    "regression": worse > tolerance,
                    "rebuilt": old_images[old_index].get("image_id") != run.get("image_id"),
                }
            )
    return {"against": against, "rows": rows, "unmatched": unmatched}
