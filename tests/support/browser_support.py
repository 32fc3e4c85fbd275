"""Opening envbuild's HTML reports in a real browser: Debian's chromium, headless, with every
network route closed (a proxy nobody listens on, a resolver that finds no host). Missing chromium
fails the test with the fix; it never skips."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

WINDOW = (1280, 2400)
# matplotlib's first colour (tab:blue): the first image's bars, lines and points.
PLOT_BLUE = np.array([31, 119, 180])


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail(
            "chromium is not installed: the bench report's browser test needs it; "
            "install it with `apt-get install chromium` (.ci/run does)"
        )
    return found


def open_offline(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run chromium headless on ``page`` with ``args`` (--dump-dom, --screenshot=...), offline."""
    result = subprocess.run(
        [
            chromium(),
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--proxy-server=127.0.0.1:9",
            "--host-resolver-rules=MAP * ~NOTFOUND",
            f"--user-data-dir={profile}",
            "--no-first-run",
            "--disable-extensions",
            "--disable-background-networking",
            "--hide-scrollbars",
            *args,
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result


@dataclass(frozen=True, kw_only=True)
class Page:
    """What the browser made of a report."""

    dom: str
    plots: int  # <figure id="plot-..."> elements holding an <svg>
    visible_plots: int | None  # what the page's own script measured on screen
    painted: float  # fraction of the screenshot's pixels that differ from the background
    colours: int  # distinct colours in the screenshot
    plot_blue: int  # pixels of the plots' first colour

    @property
    def non_blank(self) -> bool:
        return self.painted > 0.05 and self.colours > 500 and self.plot_blue > 5000


def open_report(page: Path, scratch: Path) -> Page:
    """Open ``page`` twice (its DOM after scripts ran, and a screenshot) and measure both."""
    scratch.mkdir(parents=True, exist_ok=True)
    dom = open_offline(page, scratch / "profile-dom", "--dump-dom").stdout
    plots = 0
    for found in re.finditer(r'<figure id="plot-[^"]*"', dom):
        block = dom[found.start() :]
        plots += "<svg" in block[: block.index("</figure>")]
    visible = re.search(r'<body[^>]*\bdata-visible-plots="(\d+)"', dom)
    shot = scratch / "report.png"
    open_offline(
        page,
        scratch / "profile-shot",
        f"--screenshot={shot}",
        f"--window-size={WINDOW[0]},{WINDOW[1]}",
    )
    pixels = imread(shot)
    assert pixels.shape[:2] == (WINDOW[1], WINDOW[0])
    rgb = (pixels[..., :3] * 255).round().astype(np.uint8).reshape(-1, 3)
    colours, counts = np.unique(rgb, axis=0, return_counts=True)
    background = colours[counts.argmax()]
    return Page(
        dom=dom,
        plots=plots,
        visible_plots=None if visible is None else int(visible.group(1)),
        painted=float((rgb != background).any(axis=1).mean()),
        colours=len(colours),
        plot_blue=int((np.abs(rgb.astype(int) - PLOT_BLUE).max(axis=1) <= 8).sum()),
    )
