"""The bench report in a real browser: Debian's chromium, headless and cut off from any network,
opens the page, lays out every plot and paints a screenshot that is not blank.

No Docker here: this tier is where the real external programs run. Chromium missing is a
failure that names the fix, never a skip."""

from __future__ import annotations

import re

import pytest

from envbuild.bench.html.page import render_html
from tests.support.browser_support import Page, open_report
from tests.unit.test_bench_html import HOSTILE_NAME, PLOT_IDS, bench_document


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Page:
    doc = bench_document(3)
    doc["images"][0]["errors"] = [HOSTILE_NAME]
    folder = tmp_path_factory.mktemp("report")
    path = folder / "bench.html"
    path.write_text(render_html(doc), encoding="utf-8")
    return open_report(path, folder / "browser")


def test_the_browser_lays_out_every_plot(page: Page) -> None:
    for plot_id in PLOT_IDS:
        block = page.dom[page.dom.index(f'<figure id="{plot_id}"') :]
        assert "<svg" in block[: block.index("</figure>")], plot_id
    # the page's own script ran (the CSP allows it) and found each plot with a size on screen
    assert page.visible_plots is not None, "the page's script did not run"
    assert page.visible_plots == page.plots == len(PLOT_IDS)
    # the image name with a script in it stayed text: the page's script is the only one
    assert len(re.findall(r"<script\b", page.dom)) == 1
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page.dom


def test_the_screenshot_is_not_blank(page: Page) -> None:
    assert page.painted > 0.05, (
        f"only {page.painted:.1%} of the screenshot differs from the background"
    )
    assert page.colours > 500, f"only {page.colours} distinct colours: no plot was painted"
    assert page.plot_blue > 5000, f"only {page.plot_blue} pixels of the plots' first colour"
    assert page.non_blank
