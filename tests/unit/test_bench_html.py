"""The HTML page of `envbuild bench --html`: plots, escaping, no remote resource, determinism,
and hostile documents that render anyway.

Documents are generated here (`bench_document`, reused by the browser test); the real payload
outputs recorded in tests/unit/recorded/bench/ are rendered too."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import warnings
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from envbuild.bench import figures as bench_figures
from envbuild.bench.advice import advise
from envbuild.bench.compare import compare_documents
from envbuild.bench.figures import MAX_IMAGES
from envbuild.bench.html.page import CSP, render_html
from envbuild.bench.html.reading import MAX_ROWS
from envbuild.payload import bench_harness as bench

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "unit" / "recorded" / "bench"
PLOT_IDS = ("plot-throughput", "plot-batch", "plot-compile", "plot-loader", "plot-allreduce")
SECTION_OF_PLOT = {
    "plot-throughput": "throughput",
    "plot-batch": "batch",
    "plot-compile": "compile",
    "plot-loader": "loader",
    "plot-allreduce": "allreduce",
}
HOSTILE_NAME = "<script>alert(1)</script>"

FRAMEWORKS = (
    ("torch", "2.13.0", "eager", ("eager", "torch.compile (inductor)")),
    ("tensorflow", "2.20.0", "tf.function", ("tf.function", "tf.function(jit_compile=True) (XLA)")),
    ("jax", "0.10.2", "jax.jit", ("op-by-op (jax.disable_jit)", "jax.jit (XLA)")),
)


# --------------------------------------------------------------------------
# generated documents


def figure(rng: random.Random, median: float, unit: str) -> dict[str, Any]:
    samples = [median * (1 + rng.uniform(-0.04, 0.04)) for _ in range(bench.REPS)]
    result = bench.stats(samples, unit)
    result["steps_per_rep"] = rng.randint(1, 50)
    result["warmup_seconds"] = rng.uniform(0.01, 2.0)
    return result


def payload(
    rng: random.Random, framework: str, mode: str, modes: tuple[str, str]
) -> dict[str, Any]:
    """A bench payload's document, shaped as bench_harness.bench_parts() and the payload brief say."""
    doc = bench.bench_parts()
    doc.update(ok=True, errors=[], bench_version=bench.BENCH_VERSION, budget_s=150.0)
    doc["versions"].update(framework=f"{framework} 1.0", cuda=None)
    doc["devices"] = [{"kind": "cpu", "name": "cpu", "memory_bytes": None, "capability": None}]
    doc["machine"] = {"cpu_model": "Test CPU", "cores": 2, "memory_bytes": 8 << 30}
    speed = rng.uniform(0.5, 2.0)
    results = []
    for model, base in (("conv", 3000.0), ("transformer", 800.0)):
        for precision, factor in (("fp32", 1.0), ("bf16", 1.7)):
            results.append(
                {
                    "model": model,
                    "precision": precision,
                    "batch": bench.DEFAULT_BATCH,
                    "mode": mode,
                    **figure(rng, base * factor * speed, "samples/s"),
                }
            )
        results.append(
            {
                "model": model,
                "precision": "fp16",
                "unsupported": "fp16 with loss scaling is for GPUs",
            }
        )
    doc["throughput"].update(mode=mode, results=results, seconds=30.0)
    doc["compile"].update(
        eager_mode=modes[0],
        compiled_mode=modes[1],
        seconds=25.0,
        results=[
            {
                "model": model,
                "precision": "fp32",
                "batch": bench.DEFAULT_BATCH,
                "eager": figure(rng, base * speed, "samples/s"),
                "compiled": figure(rng, base * speed * 1.4, "samples/s"),
                "compile_seconds": rng.uniform(2, 30),
                "speedup": 1.4,
            }
            for model, base in (("conv", 3000.0), ("transformer", 800.0))
        ],
    )
    sweeps = []
    for precision, factor in (("fp32", 1.0), ("bf16", 1.6)):
        points = []
        batch = bench.BATCH_START
        while batch <= 1024:
            rate = 900 * factor * speed * (1 - 0.6 * 8 / batch)
            points.append(
                {"batch": batch, **figure(rng, rate, "samples/s"), "peak_bytes": batch * 3 << 20}
            )
            batch *= 2
        sweeps.append(
            {
                "model": "transformer",
                "precision": precision,
                "points": points,
                "largest_fit": 1024,
                "largest_fit_peak_bytes": 1024 * 3 << 20,
                "stopped": "memory: batch 2048 would need about 12.9 GB of 8.0 GB available",
            }
        )
    doc["batch"].update(memory="peak RSS (VmHWM)", sweeps=sweeps, seconds=35.0)
    doc["loader"].update(
        kind="multiprocessing.Pool (worker processes)",
        batch=bench.DEFAULT_BATCH,
        step={
            "model": "conv",
            "precision": "fp32",
            "batch": bench.DEFAULT_BATCH,
            **figure(rng, 45.0 * speed, "batches/s"),
        },
        points=[
            {"workers": w, **figure(rng, 20.0 * (1 + w), "batches/s")} for w in bench.LOADER_WORKERS
        ],
        seconds=20.0,
    )
    points = []
    for size in bench.ALLREDUCE_SIZES:
        seconds = 2e-5 + size / 4e9
        algbw = size / seconds / 1e9
        busbw_figure = figure(rng, bench.busbw(algbw, 2), "GB/s")
        points.append(
            {
                "bytes": size,
                "iterations": 10,
                "seconds": seconds,
                "algbw_gbps": algbw,
                "busbw_gbps": busbw_figure["median"],
                "busbw": busbw_figure,
            }
        )
    doc["allreduce"].update(backend="gloo", world_size=2, correct=True, points=points, seconds=20.0)
    doc["skipped"] = []
    return doc


def host_document(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The host's `--json` document around image records."""
    return {
        "schema": "envbuild-bench",
        "version": 1,
        "created": "2026-12-01T10:00:00Z",
        "host": {
            "cpu_model": "Test CPU @ 2.0GHz",
            "cores": 2,
            "memory_bytes": 8 << 30,
            "gpus": [],
            "engine": "docker 26.1",
        },
        "budget_s": 150.0,
        "images": records,
        "advice": [
            {
                "image": records[0]["image"] if records else None,
                "topic": "precision",
                "text": "bf16 is 1.7x fp32 here: use autocast",
                "figures": [
                    {"path": "/images/0/bench/throughput/results/1/median", "value": 5100.0}
                ],
            }
        ],
        "comparison": None,
    }


def record(image: str, bench_doc: dict[str, Any], framework: str, version: str) -> dict[str, Any]:
    return {
        "image": image,
        "image_id": "sha256:" + hashlib.sha256(image.encode()).hexdigest(),
        "framework": framework,
        "framework_version": version,
        "cuda": "cpu",
        "python": "3.11",
        "gpus": False,
        "seconds": 171.2,
        "ok": bool(bench_doc.get("ok", True)),
        "errors": [],
        "skipped": list(bench_doc.get("skipped", [])),
        "bench": bench_doc,
    }


def bench_document(images: int = 3, seed: int = 0) -> dict[str, Any]:
    """A valid host document with 1-3 (or more) images, every section full of figures."""
    rng = random.Random(seed)
    records = []
    for n in range(images):
        framework, version, mode, modes = FRAMEWORKS[n % len(FRAMEWORKS)]
        image = f"envbuild/{framework}:{version}-cpu-py3.11-bookworm" + (f"-{n}" if n >= 3 else "")
        records.append(record(image, payload(rng, framework, mode, modes), framework, version))
    return host_document(records)


def page_of(doc: Any, *, quiet: bool = True) -> str:
    """The page; for a valid document (``quiet``) matplotlib must not have warned about a
    layout it could not make."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        page = render_html(doc)
    if quiet:
        assert [str(w.message) for w in caught] == []
    assert page.startswith("<!DOCTYPE html>")
    page.encode("utf-8")  # no lone surrogate from a JSON escape: the page can be written
    return page


# --------------------------------------------------------------------------
# reading the page back


class Page(HTMLParser):
    """What a test looks at in the page: attributes by tag, ids, the text."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.attrs: list[tuple[str, str, str]] = []
        self.ids: list[str] = []
        self.text: list[str] = []
        self.scripts = 0
        self.feed(text)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.scripts += tag == "script"
        for name, value in attrs:
            self.attrs.append((tag, name, value or ""))
            if name == "id":
                self.ids.append(value or "")

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def links(self) -> list[str]:
        return [v for _, name, v in self.attrs if name in ("src", "href", "xlink:href", "action")]

    def figures(self) -> list[str]:
        return [v for tag, name, v in self.attrs if tag == "figure" and name == "id"]


def assert_self_contained(page: str) -> None:
    parsed = Page(page)
    for link in parsed.links():
        assert link.startswith("#"), f"a link that leaves the page: {link[:80]!r}"
    csp = [v for t, n, v in parsed.attrs if t == "meta" and n == "content" and "default-src" in v]
    assert csp == [CSP]
    assert "default-src 'none'" in CSP
    assert parsed.scripts == 1  # the page's own, nothing from the document
    assert len(parsed.ids) == len(set(parsed.ids)), "duplicate ids"


# --------------------------------------------------------------------------
# full documents


@pytest.mark.parametrize("images", [1, 2, 3])
def test_every_plot_is_drawn_for_full_data(images: int) -> None:
    page = page_of(bench_document(images, seed=images))
    parsed = Page(page)
    assert parsed.figures() == list(PLOT_IDS)
    for plot_id in PLOT_IDS:
        block = page[page.index(f'<figure id="{plot_id}"') :]
        block = block[: block.index("</figure>")]
        assert "<svg" in block
        assert "<path" in block
        assert f'id="{plot_id}-caption"' in block
        assert "Not drawn" not in block
    assert "-missing" not in "".join(parsed.ids)
    # the largest fit is marked on every sweep, the step's rate on every loader panel
    for n in range(images):
        assert f'id="plot-batch-largest-fit-{n}-0"' in page
        assert f'id="plot-batch-largest-fit-{n}-1"' in page
        assert f'id="plot-loader-step-{n}"' in page
    assert_self_contained(page)


def test_the_page_holds_host_facts_tables_and_advice() -> None:
    doc = bench_document(3)
    doc["images"][1]["errors"] = ["loader: worker crashed"]
    doc["images"][1]["skipped"] = ["allreduce: 256 MiB: no time left in the budget"]
    text = " ".join(Page(page_of(doc)).text)
    for fact in ("Test CPU @ 2.0GHz", "8 GiB", "docker 26.1"):
        assert fact in text
    assert "bf16 is 1.7x fp32 here: use autocast" in text
    assert "/images/0/bench/throughput/results/1/median = 5,100" in text
    assert "loader: worker crashed" in text
    assert "allreduce: 256 MiB: no time left in the budget" in text
    assert "fp16 with loss scaling is for GPUs" in text
    median = doc["images"][0]["bench"]["throughput"]["results"][0]["median"]
    assert f"{median:,.0f} samples/s" in text
    assert "memory: batch 2048 would need about 12.9 GB" in text


def test_comparison_rows_and_regressions_are_shown() -> None:
    previous = bench_document(2, seed=1)
    doc = bench_document(3, seed=1)  # the same two images, and one the earlier run lacks
    slower = doc["images"][0]["bench"]["throughput"]["results"][0]
    slower.update(bench.stats([s / 2 for s in slower["samples"]], "samples/s"))
    doc["images"][1]["image_id"] = "sha256:" + "cd" * 32
    doc["comparison"] = compare_documents(doc, previous, against="bench-last-week.json")
    page = page_of(doc)
    assert "Compared with bench-last-week.json" in page
    assert page.count('<tr class="regression">') == 1
    assert "1 regression beyond the measured spread" in page
    row = page[page.index('<tr class="regression">') :]
    row = row[: row.index("</tr>")]
    assert "throughput conv fp32" in row
    assert "-50.0%" in row
    assert "REGRESSION" in row
    assert page.count("rebuilt (another image id)") == len(bench_figures.image_figures(doc, 1))
    assert "Not in the earlier run: envbuild/jax:0.10.2-cpu-py3.11-bookworm." in page
    doc["comparison"] = None
    assert "Compared with" not in page_of(doc)


def test_one_rank_draws_its_algbw() -> None:
    doc = bench_document(1)
    allreduce = doc["images"][0]["bench"]["allreduce"]
    allreduce.update(world_size=1, backend="nccl")
    for point in allreduce["points"]:
        point.update(busbw_gbps=0.0, busbw=bench.stats([0.0] * 3, "GB/s"), note="one rank")
    page = page_of(doc)
    assert "plot-allreduce" in Page(page).figures()
    assert "so busbw is 0 and its line shows algbw instead" in page


def test_output_is_deterministic_across_processes() -> None:
    doc = bench_document(3, seed=7)
    here = page_of(doc)
    assert page_of(copy.deepcopy(doc)) == here
    code = (
        "import json, sys\nfrom envbuild.bench.html.page import render_html\n"
        "sys.stdout.write(render_html(json.loads(sys.stdin.read())))\n"
    )
    for hash_seed in ("1", "2"):
        other = subprocess.run(
            [sys.executable, "-c", code],
            input=json.dumps(doc),
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
            cwd=REPO,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )
        assert other.stdout == here


def test_rendering_leaves_matplotlib_settings_alone_and_is_not_imported_early() -> None:
    import matplotlib

    before = dict(matplotlib.rcParams)
    page_of(bench_document(1))
    assert dict(matplotlib.rcParams) == before
    code = "import sys, envbuild.bench.html.page\nprint('matplotlib' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "False"


# --------------------------------------------------------------------------
# partial documents: what is missing is said, never drawn as empty axes


def emptied(section: str) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        for item in doc["images"]:
            part = item["bench"][section]
            for key in ("results", "sweeps", "points"):
                if key in part:
                    part[key] = []
            if section == "batch":  # sweeps that ran no point are just as empty
                part["sweeps"] = [
                    {
                        "model": "transformer",
                        "precision": "fp32",
                        "points": [],
                        "largest_fit": None,
                        "stopped": "time: no point fitted",
                    }
                ]
            item["skipped"].append(f"{section}: everything: no time left in the budget")

    return edit


@pytest.mark.parametrize("plot_id", PLOT_IDS)
def test_a_plot_without_data_is_a_sentence(plot_id: str) -> None:
    doc = bench_document(2)
    emptied(SECTION_OF_PLOT[plot_id])(doc)
    page = page_of(doc)
    parsed = Page(page)
    assert plot_id not in parsed.figures()
    assert f"{plot_id}-missing" in parsed.ids
    missing = page[page.index(f'id="{plot_id}-missing"') :]
    missing = missing[: missing.index("</section>")]
    assert "<svg" not in missing
    assert re.search(r"No [a-z -]+ to plot", missing)
    assert f"{SECTION_OF_PLOT[plot_id]}: everything: no time left in the budget" in missing
    assert parsed.figures() == [p for p in PLOT_IDS if p != plot_id]


def test_a_plot_names_the_images_it_could_not_draw() -> None:
    doc = bench_document(2)
    doc["images"][1]["bench"]["loader"]["points"] = []
    doc["images"][1]["skipped"].append("loader: workers: no time left in the budget")
    page = page_of(doc)
    caption = page[page.index('id="plot-loader-caption"') :]
    caption = caption[: caption.index("</figcaption>")]
    assert "Not drawn: 2. tensorflow" in caption
    assert "loader: workers: no time left in the budget" in caption


def test_a_failed_image_renders_with_its_errors() -> None:
    doc = bench_document(2)
    doc["images"][0].update(ok=False, bench={}, errors=["bench: container exited 137 (killed)"])
    page = page_of(doc)
    assert "FAILED" in page
    assert "bench: container exited 137 (killed)" in page
    assert "No figures: the bench recorded nothing for this image." in page
    assert "Not drawn: 1. torch" in page
    assert Page(page).figures() == list(PLOT_IDS)  # the other image still draws everything


def test_no_images_at_all() -> None:
    page = page_of(host_document([]))
    assert "The document holds no images." in page
    assert Page(page).figures() == []
    assert page.count("the document holds no images") == len(PLOT_IDS)


# --------------------------------------------------------------------------
# hostile documents


def test_an_image_name_stays_text() -> None:
    doc = bench_document(2)
    doc["images"][0]["image"] = HOSTILE_NAME
    doc["images"][0]["errors"] = [HOSTILE_NAME, '"><img src=x onerror=alert(1)>']
    doc["images"][0]["bench"]["throughput"]["results"][0]["model"] = HOSTILE_NAME
    doc["advice"][0].update(image=HOSTILE_NAME, text=HOSTILE_NAME, topic=HOSTILE_NAME)
    doc["host"]["cpu_model"] = HOSTILE_NAME
    page = page_of(doc)
    assert HOSTILE_NAME not in page
    assert "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert HOSTILE_NAME in " ".join(Page(page).text)
    assert_self_contained(page)


def test_urls_in_the_document_never_become_links() -> None:
    doc = bench_document(1)
    url = "https://evil.example/x.js"
    doc["images"][0]["image"] = url
    doc["images"][0]["errors"] = [f"<script src='{url}'></script>", f"<a href='{url}'>x</a>"]
    doc["host"]["engine"] = f'<link rel="stylesheet" href="{url}">'
    page = page_of(doc)
    assert_self_contained(page)
    clean = page_of(bench_document(3))
    assert re.findall(r"\w+://", clean) == []  # not even the SVGs' namespace declarations


HOSTILE_VALUES: tuple[Any, ...] = (
    None,
    True,
    -1,
    0,
    -1e300,
    1e300,
    10**5000,
    float("nan"),
    float("inf"),
    "",
    "fast",
    "$\\frac{1}{0}$",
    "_nolegend_",
    "\x00\x07\u202e\ud800\U0001f600",
    "x" * 1_000_000,
    [],
    {},
    [None] * 3,
    {"median": "1"},
    [[[]]],
    {"unit": 5, "median": [1]},
    list(range(100_000)),
    [{"batch": -8, "median": 1}] * 10_000,
)


def paths(node: Any, here: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in the document, as a key path."""
    found = [here]
    if isinstance(node, dict):
        for key, value in node.items():
            found += paths(value, (*here, key))
    elif isinstance(node, list):
        for index, value in enumerate(node[:4]):
            found += paths(value, (*here, index))
    return found


def hostile_document(seed: int) -> dict[str, Any]:
    """A full document with a dozen places replaced by odd values of the wrong type or size."""
    rng = random.Random(seed)
    doc = bench_document(rng.randint(1, 3), seed=seed)
    for _ in range(12):
        place = rng.choice(paths(doc)[1:])
        parent = doc
        try:
            for key in place[:-1]:
                parent = parent[key]
            parent[place[-1]] = copy.deepcopy(rng.choice(HOSTILE_VALUES))
        except (KeyError, IndexError, TypeError):
            continue  # an earlier replacement removed the place
    return doc


def with_parts_replaced(value: Any) -> dict[str, Any]:
    """Two images; every part of the first, its record's fields and the document's own keys
    replaced by ``value``: the second image still draws every plot."""
    doc = bench_document(2)
    first = doc["images"][0]
    for part in list(first["bench"]):
        first["bench"][part] = copy.deepcopy(value)
    for key in ("image", "image_id", "seconds", "ok", "errors", "skipped"):
        first[key] = copy.deepcopy(value)
    for key in ("host", "advice", "comparison", "created", "budget_s"):
        doc[key] = copy.deepcopy(value)
    return doc


@pytest.mark.parametrize("seed", range(16))
def test_hostile_documents_render(seed: int) -> None:
    page = page_of(hostile_document(seed), quiet=False)
    assert len(page) < 8_000_000
    assert_self_contained(page)


@pytest.mark.parametrize(
    "value", HOSTILE_VALUES, ids=[f"{type(v).__name__}{n}" for n, v in enumerate(HOSTILE_VALUES)]
)
def test_parts_of_the_wrong_type_render(value: Any) -> None:
    page = page_of(with_parts_replaced(value), quiet=False)
    assert_self_contained(page)
    assert 'id="image-2"' in page
    assert_self_contained(page_of(host_document([]) | {"images": value}, quiet=False))
    assert_self_contained(page_of(value, quiet=False))  # not even a dict


def test_many_images_are_cut_at_the_bound() -> None:
    one = bench_document(1)["images"][0]
    light = {key: one["bench"][key] for key in ("throughput", "loader")}
    images = [dict(one, image=f"envbuild/torch:{n}", bench=copy.deepcopy(light)) for n in range(72)]
    page = page_of(host_document(images))
    parsed = Page(page)
    assert sum(1 for i in parsed.ids if re.fullmatch(r"image-\d+", i)) == MAX_IMAGES
    assert f"the first {MAX_IMAGES} of 72 shown" in page
    assert "envbuild/torch:31" in page
    assert "envbuild/torch:32" not in page
    assert parsed.figures() == ["plot-throughput", "plot-loader"]
    assert f'id="plot-loader-step-{MAX_IMAGES - 1}"' in page


def test_huge_lists_and_strings_are_bounded() -> None:
    doc = bench_document(1)
    one = doc["images"][0]
    one["errors"] = [f"error {n}: " + "e" * 100_000 for n in range(5000)]
    sweep = one["bench"]["batch"]["sweeps"][0]
    sweep["points"] = [dict(sweep["points"][0], batch=8 * (n + 1)) for n in range(100_000)]
    one["bench"]["allreduce"]["points"] *= 10_000
    doc["advice"] *= 100_000
    page = page_of(doc)
    assert "e" * 2001 not in page
    assert "error 499: eeee" in page
    assert "error 500: " not in page
    assert page.count("<li><strong>precision</strong>") == MAX_ROWS
    assert len(page) < 20_000_000
    assert Page(page).figures() == list(PLOT_IDS)


def test_odd_numbers_are_not_drawn_where_they_cannot_be() -> None:
    doc = bench_document(1)
    bench_doc = doc["images"][0]["bench"]
    for point in bench_doc["batch"]["sweeps"][0]["points"]:
        point["batch"] = 0  # no place on a log axis
    for point in bench_doc["allreduce"]["points"]:
        point["bytes"] = -8
    bench_doc["batch"]["sweeps"] = bench_doc["batch"]["sweeps"][:1]
    parsed = Page(page_of(doc))
    assert "plot-batch-missing" in parsed.ids
    assert "plot-allreduce-missing" in parsed.ids


# --------------------------------------------------------------------------
# the real payload outputs


def recorded() -> list[Path]:
    return sorted(RECORDED.glob("*.json")) if RECORDED.is_dir() else []


def recorded_record(path: Path) -> dict[str, Any]:
    payload_doc = json.loads(path.read_text(encoding="utf-8"))
    framework = path.stem.split("-")[0]
    version = str(payload_doc.get("versions", {}).get("framework") or "?")
    return record(f"envbuild/{framework}:{version}-cpu-recorded", payload_doc, framework, version)


def recorded_document(paths_: list[Path]) -> dict[str, Any]:
    """The recorded payloads side by side, with this machine's facts and the real advice rules."""
    doc = host_document([recorded_record(p) for p in paths_])
    machine = doc["images"][0]["bench"].get("machine", {})
    doc["host"].update({k: machine.get(k) for k in ("cpu_model", "cores", "memory_bytes")})
    doc["advice"] = [a.as_dict() for a in advise(doc)]
    return doc


@pytest.mark.parametrize(
    "path",
    recorded()
    or [
        pytest.param(None, marks=pytest.mark.skip(reason=f"no payload recorded in {RECORDED} yet"))
    ],
    ids=lambda p: p.name if isinstance(p, Path) else "none",
)
def test_a_recorded_payload_renders_every_plot(path: Path) -> None:
    page = page_of(host_document([recorded_record(path)]))
    assert Page(page).figures() == list(PLOT_IDS), (
        "a recorded default-budget run measures everything"
    )
    assert "could not be drawn" not in page
    assert_self_contained(page)


def test_the_recorded_payloads_side_by_side() -> None:
    paths_ = recorded()
    if not paths_:
        pytest.skip(f"no payload recorded in {RECORDED} yet")
    doc = recorded_document(paths_)
    page = page_of(doc)
    assert Page(page).figures() == list(PLOT_IDS)
    for n in range(len(paths_)):
        assert f'id="image-{n + 1}"' in page
    text = " ".join(Page(page).text)
    assert doc["advice"], "the recorded figures give advice"
    for line in doc["advice"]:
        assert line["text"] in text
        for figure in line["figures"]:
            assert figure["path"] in text
