"""The bench document as the page reads it: hostile input, so every read is bounded.

A value of the wrong type reads as empty ({}, [], ''), a string is cut at its limit, a list at
its own, and a number is a figure only when `figures.number` says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envbuild.bench.figures import MAX_IMAGES, fmt, number

# MAX_IMAGES (32) comes with the figures' reader.
MAX_POINTS = 64
MAX_TEXT = 2000
# Advice lines, comparison rows, errors and skipped items per image.
MAX_ROWS = 500
# Models, precisions or sweeps drawn per image and plot.
MAX_SERIES = 8


def as_dict(value: object) -> dict[str, Any]:
    """``value`` when it is a dict, else an empty one."""
    return value if isinstance(value, dict) else {}


def cut_list(value: object, limit: int = MAX_POINTS) -> list[Any]:
    """The first ``limit`` items of ``value`` when it is a list, else none."""
    return value[:limit] if isinstance(value, list) else []


def text_of(value: object, limit: int = MAX_TEXT) -> str:
    """A string of the document, bounded; '' for what holds no text."""
    if value is None:
        return ""
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool):
        text = "yes" if value else "no"
    elif isinstance(value, int | float):
        figure = number(value)
        text = "(a number out of range)" if figure is None else fmt(figure)
    else:
        text = f"({type(value).__name__})"
    if len(text) > limit:
        text = text[: limit - 1] + "…"
    if not text.isascii():
        # JSON's \ud800 escapes give lone surrogates, which no UTF-8 file can hold.
        text = text.encode("utf-8", "replace").decode("utf-8")
    return text


def median_of(figure: object) -> float | None:
    """The figure's median, when it is a number."""
    return number(as_dict(figure).get("median"))


def half_range(figure: object) -> float:
    """Half the figure's range, from its relative spread; 0 when it has none."""
    median, spread = median_of(figure), number(as_dict(figure).get("spread"))
    return abs(median * spread) if median is not None and spread is not None else 0.0


@dataclass(frozen=True, kw_only=True)
class Image:
    """One image of the document as the page shows it: its place, names, record and payload."""

    index: int
    ref: str
    label: str
    record: dict[str, Any]
    bench: dict[str, Any]

    def part(self, name: str) -> dict[str, Any]:
        """A part of the image's payload document ({} when it is missing or not a dict)."""
        return as_dict(self.bench.get(name))

    @property
    def colour(self) -> str:
        """The image's colour in every plot."""
        return f"C{self.index % 10}"

    @property
    def dashes(self) -> str:
        """The image's line style: images ten apart share a colour, not a line style."""
        return ("-", "--", ":", "-.")[(self.index // 10) % 4]

    def messages(self, key: str) -> list[str]:
        """The image's "errors" or "skipped": the host's, then those of the payload's own
        document that the host did not repeat."""
        found: dict[str, None] = {}
        items = cut_list(self.record.get(key), MAX_ROWS) + cut_list(self.bench.get(key), MAX_ROWS)
        for item in items:
            text = text_of(item)
            if text:
                found.setdefault(text)
        return list(found)[:MAX_ROWS]

    def why_missing(self, section: str) -> str:
        """Why a section of this image has nothing to draw, from what the run recorded."""
        for item in self.messages("skipped") + self.messages("errors"):
            if item.startswith((f"{section}:", f"{section} ")):
                return text_of(item, 200)
        if self.record.get("ok") is False:
            errors = self.messages("errors")
            return "the run failed" + (f": {text_of(errors[0], 200)}" if errors else "")
        return f"{section}: nothing recorded"


def read_images(doc: dict[str, Any]) -> list[Image]:
    """The document's images, at most MAX_IMAGES, each numbered and named for the page."""
    images = []
    for index, record in enumerate(cut_list(doc.get("images"), MAX_IMAGES)):
        record = as_dict(record)
        ref = text_of(record.get("image")) or "(unnamed image)"
        short = ref.rsplit("/", 1)[-1]
        images.append(
            Image(
                index=index,
                ref=ref,
                label=f"{index + 1}. {short}",
                record=record,
                bench=as_dict(record.get("bench")),
            )
        )
    return images
