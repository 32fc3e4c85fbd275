"""`envbuild bench` of the three CPU images side by side on the real engine: every section
measured inside each image, the JSON with every sample, advice citing figures present in it,
the HTML report opened in a real browser, and the history (`--compare last`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envbuild.bench.advice import cited_text
from envbuild.bench.figures import pointer
from tests.support.browser_support import open_report
from tests.support.docker_support import CpuMatrix, envbuild

pytestmark = [pytest.mark.e2e, pytest.mark.alone, pytest.mark.extended]

# Short, so that CI stays short: every section still measures something (what did not fit is
# listed as skipped); the default budget's figures are in the README.
BUDGET = "60"


def test_three_frameworks_side_by_side_with_json_html_advice_and_history(
    cpu_matrix: CpuMatrix, tmp_path: Path
) -> None:
    images = cpu_matrix.images()
    refs = [images["torch"], images["tensorflow"], images["jax"]]
    out_json, out_html = tmp_path / "bench.json", tmp_path / "bench.html"
    result = envbuild(
        "bench", *refs, "--budget", BUDGET, "--gpus", "none", "--json", str(out_json),
        "--html", str(out_html),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    assert "Traceback" not in result.stderr
    for n, ref in enumerate(refs, 1):
        assert f"bench [{n}/3] {ref}: measuring" in result.stderr

    doc = json.loads(out_json.read_text())
    assert (doc["schema"], doc["version"]) == ("envbuild-bench", 1)
    assert doc["host"]["cores"]
    assert doc["host"]["memory_bytes"]
    assert [run["image"] for run in doc["images"]] == refs
    for run in doc["images"]:
        bench = run["bench"]
        assert run["errors"] == [], run["image"]
        assert run["ok"] is True
        assert run["image_id"].startswith("sha256:")
        measured = [r for r in bench["throughput"]["results"] if r.get("median")]
        pairs = {(r["model"], r["precision"]) for r in measured}
        # Each model in fp32 is measured, or said to be skipped (a loaded host may give the
        # first figure the whole share): never silently left out.
        assert ("conv", "fp32") in pairs, run["image"]
        for model in ("transformer",):
            assert (model, "fp32") in pairs or (
                f"throughput: {model} fp32: no time left in the budget" in run["skipped"]
            ), (run["image"], run["skipped"])
        for figure in measured:
            assert len(figure["samples"]) >= 3
            assert figure["min"] <= figure["median"] <= figure["max"]
        # A short budget may not fit torch.compile on 2 cores (~20 s): then it says so.
        compiled = any(r.get("compiled") for r in bench["compile"]["results"])
        assert compiled or any(s.startswith("compile: ") for s in run["skipped"]), run["image"]
        assert any(s["points"] for s in bench["batch"]["sweeps"]), run["image"]
        assert bench["loader"]["step"]["median"] > 0
        assert [p["workers"] for p in bench["loader"]["points"]][:2] == [0, 1]
        assert bench["allreduce"]["correct"] is True
        assert bench["allreduce"]["world_size"] == 2
        assert bench["allreduce"]["points"][0]["bytes"] == 8
        assert bench["machine"]["cores"]

    # Advice cites figures that are in the JSON, printed as the text shows them.
    assert {a["topic"] for a in doc["advice"]} >= {"precision", "loader", "allreduce", "framework"}
    for advice in doc["advice"]:
        for cited in advice["figures"]:
            assert pointer(doc, cited["path"]) == cited["value"]
            assert cited["shown"] == cited_text(cited["path"], cited["value"])
            assert cited["shown"] in advice["text"]
    # The terminal: a table per image, then side by side, then the advice.
    assert "side by side (medians)" in result.stdout
    assert all(f"bench of {ref}" in result.stdout for ref in refs)
    assert doc["advice"][0]["text"] in result.stdout

    page = open_report(out_html, tmp_path / "browser")
    assert page.plots == page.visible_plots >= 5, page
    assert page.non_blank, page

    # History: the run was recorded; the next one of the same image on this host compares with it.
    # On the shortest budget the first figure is still measured: making the first model (torch's
    # first use, CUDA's start on a GPU) is not taken from its piece of the section.
    again_json = tmp_path / "again.json"
    again = envbuild(
        "bench", images["jax"], images["torch"], "--budget", "20", "--gpus", "none",
        "--compare", "last", "--json", str(again_json),
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-4000:]
    assert "compared with last" in again.stdout
    assert "throughput conv fp32" in again.stdout.split("compared with last", 1)[1]
    for run in json.loads(again_json.read_text())["images"]:
        first = run["bench"]["throughput"]["results"][0]
        assert (first["model"], first["precision"]) == ("conv", "fp32"), run["image"]
        assert first.get("median"), (run["image"], run["skipped"])
