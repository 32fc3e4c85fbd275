#!/usr/bin/env python3
"""envbuild bench payload for PyTorch images: how fast this image trains on this host.

Copied into the container with the other payload modules and run as ``python3 torch_bench.py``:
``benchmark(run, budget)`` runs under bench_harness.main, which prints the one JSON document on
stdout and gives each section a hard deadline; bench_harness fixes what every framework
measures alike (the two models, ``measure``, the budget, the sweep's stop rules, the loader's
per-sample work).  Each section keeps to its share of ENVBUILD_BENCH_BUDGET_S and records in
``skipped`` what it had no time for.

Sections:
  * versions / devices -- as the smoke payload reports them, and the host (CPU, memory, GPUs);
  * throughput -- samples/s of the conv and transformer models at DEFAULT_BATCH, eager, per
                  precision: fp32, bf16 autocast, fp16 autocast with a GradScaler (GPU only);
  * compile    -- eager against torch.compile (inductor), the compile time apart;
  * batch      -- the transformer's samples/s and peak memory per batch size, doubling until
                  memory, time or BATCH_MAX stops it, per precision;
  * loader     -- DataLoader batches/s alone per worker count, against the conv step's rate;
  * allreduce  -- gloo between 2 CPU processes, or NCCL one process per GPU: seconds, algbw
                  and busbw per message size from 8 B to 256 MiB, each size's sum checked.

Only the standard library, the sibling payload modules (torch_smoke for the versions and
devices, torch_ranks for the all-reduce's processes) and torch are used.
"""

import contextlib
import functools
import gc
import os
import shutil
import threading
import time

import bench_harness as bench
import smoke_harness as harness
import smoke_verdicts as verdicts
import torch_ranks
import torch_smoke

PAYLOAD = "torch_bench"

SEED = 0  # the models' weights
DATA_SEED = 1234  # the fixed batch, and the loader's samples

EAGER_MODE = "eager"
COMPILED_MODE = "torch.compile (inductor)"
# What a first torch.compile of one of the models takes where compiling is slowest: inductor's
# C++ build on a small CPU host (15-30 s on 2 cores).  A model is not compiled with less than
# this left of the section; after the first, the last compile time is the guess.
COMPILE_GUESS_S = 20.0
# How far past the section's share a first compiled step may run before it is stopped (and the
# model skipped): well inside the section's grace, so that the section itself ends in time.
COMPILE_OVERTIME_S = 10.0
# How long a stopped compile gets to unwind.
COMPILE_STOP_S = 5.0
# Passes over the throughput figures, while the section's share allows (at least one).
THROUGHPUT_PASSES = 2
# Smallest slice of a section worth starting a figure in (measure needs MIN_REPS repetitions).
MIN_FIGURE_S = bench.MIN_REPS * bench.TARGET_REP_S
# A figure gets an equal part of what is left of its section, but at least this much of it
# (when that much is left): on a short budget the first figures are measured, not none.
MIN_PIECE_S = 3.0

# Loader: bench_harness's per-sample work, in a Dataset read by DataLoader worker processes.
LOADER_KIND = "torch.utils.data.DataLoader (worker processes)"
LOADER_TIMEOUT_S = 60.0  # one batch: a worker that died or hangs fails the section
LOADER_LENGTH = 2**31 - 1  # samples: more than any timing reads, drawn lazily

# All-reduce: repetitions of about this long per size (the small sizes are many calls each).
ALLREDUCE_REP_S = 0.1
# The ranks stop starting sizes this long before the section's share ends (teardown, report).
ALLREDUCE_RESERVE_S = 3.0
# The parent waits this long past the share for the ranks' figures before it kills them.
ALLREDUCE_GRACE_S = 20.0
# Starting the ranks (spawn, import torch, the rendezvous) takes seconds: not tried with less.
ALLREDUCE_MIN_S = 4.0


def allreduce_plan(once_s, left_s, sizes_left):
    """(calls per repetition, repetitions) for one message size whose single all-reduce took
    ``once_s``: repetitions of about ALLREDUCE_REP_S, up to REPS, within this size's fair part
    of ``left_s`` (shared with the ``sizes_left`` - 1 larger sizes); when that fair part holds
    fewer than MIN_REPS, MIN_REPS from all that is left (the larger sizes then have no time);
    0 repetitions when not even that fits."""
    once = max(float(once_s), 1e-6)
    calls = max(1, int(ALLREDUCE_REP_S / once))
    rep_s = calls * once
    reps = min(bench.REPS, int(left_s / max(1, sizes_left) / rep_s))
    if reps < bench.MIN_REPS:
        reps = bench.MIN_REPS if bench.MIN_REPS * rep_s <= left_s else 0
    return calls, reps


def allreduce_size_seconds(once_s):
    """About how long one message size takes, from a guess of its single all-reduce: the
    correctness check, a warm-up, the sizing call, then MIN_REPS repetitions."""
    return 3.0 * once_s + bench.MIN_REPS * max(ALLREDUCE_REP_S, once_s)


def size_text(nbytes):
    """8 B, 32 KiB, 256 MiB: a message size as nccl-tests' tables would name it."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def piece_seconds(left_s, figures_left):
    """The time one of ``figures_left`` figures may take of the ``left_s`` seconds left: an
    equal part, or MIN_PIECE_S when that is more (and is left)."""
    return max(left_s / max(1, figures_left), min(left_s, MIN_PIECE_S))


def merge_figures(figures):
    """One figure from the samples of several measure() passes over the same step (their
    repetitions alike); steps_per_rep and warmup_seconds are the first pass's."""
    first = figures[0]
    merged = bench.stats([x for f in figures for x in f["samples"]], first["unit"])
    merged["steps_per_rep"] = first["steps_per_rep"]
    merged["warmup_seconds"] = first["warmup_seconds"]
    merged["passes"] = len(figures)
    return merged


def build_model(torch, name, device):
    """bench_harness's model ``name`` ("conv" or "transformer"), weights from SEED."""
    nn = torch.nn
    torch.manual_seed(SEED)
    if name == "conv":
        c1, c2, c3 = bench.CONV["channels"]
        model = nn.Sequential(
            nn.Conv2d(bench.CONV["input"][0], c1, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(c1, c2, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Conv2d(c2, c3, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(c3, bench.CONV["classes"]),
        )
        return model.to(device)
    spec = bench.TRANSFORMER
    width = spec["width"]

    class Block(nn.Module):
        """One pre-LayerNorm transformer block, mean-pooled, then a classifier."""

        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.attn = nn.MultiheadAttention(width, spec["heads"], batch_first=True)
            self.ln2 = nn.LayerNorm(width)
            self.w1 = nn.Linear(width, spec["ffn"])
            self.w2 = nn.Linear(spec["ffn"], width)
            self.head = nn.Linear(width, spec["classes"])

        def forward(self, x):
            h = self.ln1(x)
            x = x + self.attn(h, h, h, need_weights=False)[0]
            x = x + self.w2(nn.functional.gelu(self.w1(self.ln2(x))))
            return self.head(x.mean(dim=1))

    return Block().to(device)


def make_batch(torch, name, batch, device):
    """The fixed random batch (inputs, labels) of model ``name``, made on the CPU from DATA_SEED."""
    gen = torch.Generator().manual_seed(DATA_SEED)
    if name == "conv":
        shape = (batch, *bench.CONV["input"])
        classes = bench.CONV["classes"]
    else:
        spec = bench.TRANSFORMER
        shape = (batch, spec["sequence"], spec["width"])
        classes = spec["classes"]
    x = torch.randn(shape, generator=gen)
    y = torch.randint(0, classes, (batch,), generator=gen)
    return x.to(device), y.to(device)


class Trainer:
    """One model's SGD training step on its fixed batch, at one precision, eager or compiled."""

    def __init__(self, torch, name, precision, batch, device, *, compiled=False):
        self.torch = torch
        self.name = name
        self.precision = precision
        self.device = device
        self.model = build_model(torch, name, device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=bench.LEARNING_RATE)
        self.amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.scaler = torch_smoke.make_grad_scaler(torch) if precision == "fp16" else None
        self.loss_fn = torch.compile(self._loss) if compiled else self._loss
        self.loss = None
        self.x = self.y = None
        self.use_batch(batch)

    def use_batch(self, batch):
        """Train on the fixed batch of this size from now on."""
        self.x = self.y = None
        self.x, self.y = make_batch(self.torch, self.name, batch, self.device)

    def release(self):
        """Drop the batch, the gradients and the last loss (after running out of memory)."""
        self.x = self.y = self.loss = None
        self.opt.zero_grad(set_to_none=True)

    def _loss(self, x, y):
        return self.torch.nn.functional.cross_entropy(self.model(x), y)

    def step(self):
        self.opt.zero_grad(set_to_none=True)
        if self.amp_dtype is None:
            loss = self.loss_fn(self.x, self.y)
        else:
            with self.torch.autocast(self.device.type, dtype=self.amp_dtype):
                loss = self.loss_fn(self.x, self.y)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()
        self.loss = loss

    def last_loss(self):
        return float(self.loss.detach().float().cpu().item())


class BenchState:
    """What the sections share: torch, the device, the budget, and figures to reuse."""

    def __init__(self, torch, budget):
        self.torch = torch
        self.budget = budget
        self.use_cuda = bool(torch.cuda.is_available() and torch.cuda.device_count() > 0)
        self.device = torch.device("cuda", 0) if self.use_cuda else torch.device("cpu")
        self.figures = {}  # (model, precision) -> the throughput section's figure

    def sync(self):
        if self.use_cuda:
            self.torch.cuda.synchronize()

    def timer_sync(self):
        """measure()'s ``sync``: None on the CPU, where work is done when a call returns."""
        return self.sync if self.use_cuda else None

    def unsupported(self, precision):
        """Why the device cannot train at ``precision``, or None when it can."""
        if precision == "fp16" and not self.use_cuda:
            return "fp16 with loss scaling is for GPUs; the CPU trains in fp32 or bf16"
        if precision == "bf16" and self.use_cuda and not self.torch.cuda.is_bf16_supported():
            major, minor = self.torch.cuda.get_device_capability(0)
            return f"this GPU (compute capability {major}.{minor}) has no bf16"
        return None

    def train_figure(self, trainer, batch, clock):
        """measure() of the trainer's step in samples/s; None when the clock ran out."""
        return bench.measure(
            trainer.step,
            items_per_step=batch,
            unit="samples/s",
            clock=clock,
            sync=self.timer_sync(),
        )


def log_figure(what, figure):
    """One line on stderr per figure: what the run is doing while it runs."""
    if figure is None:
        harness.log(f"{what}: no figure (no time left)")
    else:
        harness.log(
            f"{what}: {figure['median']:.4g} {figure['unit']} "
            f"(spread {figure['spread'] or 0:.1%}, {len(figure['samples'])} x "
            f"{figure['steps_per_rep']}, warm-up {figure['warmup_seconds']:.2f} s)"
        )


def call_within(fn, then, seconds):
    """``fn()`` then ``then()`` in a thread of their own for at most ``seconds``: the seconds they
    took, or None when they ran past and were stopped (SectionDeadline raised in the thread;
    left behind if it cannot be)."""
    box = {}

    def target():
        try:
            fn()
            then()
            box["done"] = True
        except BaseException as exc:  # reported to the caller, even the stop
            box["exc"] = exc

    t0 = time.perf_counter()
    thread = threading.Thread(target=target, name="torch-compile", daemon=True)
    thread.start()
    thread.join(max(0.0, seconds))
    if thread.is_alive():
        if harness.interrupt(thread):
            thread.join(COMPILE_STOP_S)
        if thread.is_alive():
            harness.log("the stopped compile is still running: the figures after it share the CPU")
        return None
    if "exc" in box:
        raise box["exc"]
    return time.perf_counter() - t0


def run_devices(state, doc):
    """The devices as the smoke payload reports them, and the machine with torch's threads."""
    doc["devices"].extend(torch_smoke.collect_devices(state.torch))
    doc["machine"] = bench.machine_facts(doc["devices"])
    doc["machine"]["torch_threads"] = state.torch.get_num_threads()


def run_throughput(state, doc, clock):
    """Samples/s per model and precision at DEFAULT_BATCH, eager; two passes where time allows."""
    part, errors = doc["throughput"], doc["errors"]
    torch = state.torch
    batch = bench.DEFAULT_BATCH
    part.update(
        mode=EAGER_MODE,
        batch=batch,
        device=state.device.type,
        fp32_matmul_precision=torch.get_float32_matmul_precision(),
    )
    # fp32 first: the compile and loader sections reuse those figures.
    plan = [(m["name"], p) for p in bench.PRECISIONS for m in bench.MODELS]
    todo = sum(1 for _, p in plan if state.unsupported(p) is None)
    found, measured = {}, {}
    t0 = time.monotonic()
    for model, precision in plan:
        why = state.unsupported(precision)
        if why is not None:
            found[(model, precision)] = {"model": model, "precision": precision, "unsupported": why}
            continue
        figure = None
        if clock.left() >= MIN_FIGURE_S:
            # Made before the figure's piece is measured out: the first model made pays for
            # torch's first use (seconds on a GPU, where CUDA starts), which no figure's
            # piece should, or the first figure has no time left on every host.
            trainer = Trainer(torch, model, precision, batch, state.device)
            # An equal part of what is left: what a figure leaves unused goes to the next ones.
            piece = bench.Clock(piece_seconds(clock.left(), todo))
            if piece.left() >= MIN_FIGURE_S:
                figure = state.train_figure(trainer, batch, piece)
        todo -= 1
        log_figure(f"throughput {model} {precision}", figure)
        if figure is None:
            why = "no time left in the budget"
            state.budget.skip("throughput", f"{model} {precision}", why)
            found[(model, precision)] = {"model": model, "precision": precision, "skipped": why}
            continue
        measured[(model, precision)] = (trainer, [figure])
    # More passes over the same figures while the share allows: each figure's samples then
    # span the section rather than a second of it, so that its spread shows how the host
    # drifts, and every precision met the same drift.
    pass_s = time.monotonic() - t0
    for _ in range(THROUGHPUT_PASSES - 1):
        if not measured or clock.left() < 1.5 * pass_s:
            break
        for index, (trainer, figures) in enumerate(measured.values()):
            piece = bench.Clock(piece_seconds(clock.left(), len(measured) - index))
            figure = state.train_figure(trainer, batch, piece)
            if figure is not None:
                figures.append(figure)
    for (model, precision), (trainer, figures) in measured.items():
        loss = trainer.last_loss()
        bench.check_loss(errors, f"throughput: {model} {precision}", loss)
        figure = merge_figures(figures)
        log_figure(f"throughput {model} {precision}, {len(figures)} passes", figure)
        state.figures[(model, precision)] = figure
        entry = {"model": model, "precision": precision, "batch": batch, "mode": EAGER_MODE}
        entry.update(figure)
        entry["loss"] = loss
        found[(model, precision)] = entry
    part["results"].extend(found[(m["name"], p)] for m in bench.MODELS for p in bench.PRECISIONS)


def prepare_inductor(state, part):
    """A fresh inductor cache (every kernel really is built here, none comes from an earlier
    run) and one compiling process (no worker pool on a small host; nothing threaded left
    behind for the loader's fork)."""
    import torch._inductor.config as inductor_config

    part["cache_dir"] = torch_smoke.fresh_inductor_cache()
    inductor_config.compile_threads = 1
    part["compile_threads"] = 1
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    part["compiler"] = cxx
    if not state.use_cuda and cxx is None:
        raise RuntimeError("torch.compile needs a C++ compiler (g++) in the image: no g++ on PATH")


def compile_entry(model, eager):
    """The compile section's result for ``model`` before its compiled step ran."""
    return {
        "model": model,
        "precision": "fp32",
        "batch": bench.DEFAULT_BATCH,
        "eager": eager,
        "compiled": None,
        "compile_seconds": None,
        "speedup": None,
    }


def run_compile(state, doc, clock):
    """Per model: eager (the throughput section's figure) against torch.compile, the first
    compiled step's time apart."""
    part, errors = doc["compile"], doc["errors"]
    torch = state.torch
    part.update(eager_mode=EAGER_MODE, compiled_mode=COMPILED_MODE, device=state.device.type)
    prepare_inductor(state, part)
    batch = bench.DEFAULT_BATCH
    guess = COMPILE_GUESS_S
    models = [m["name"] for m in bench.MODELS]
    for index, model in enumerate(models):
        entry = compile_entry(model, state.figures.get((model, "fp32")))
        part["results"].append(entry)
        if entry["eager"] is None and clock.left() >= MIN_FIGURE_S:
            # The throughput section had no time for it: measured here, in a fair piece.
            piece = bench.Clock(piece_seconds(clock.left(), 2 * (len(models) - index)))
            eager = Trainer(torch, model, "fp32", batch, state.device)
            entry["eager"] = state.train_figure(eager, batch, piece)
            log_figure(f"compile {model} eager", entry["eager"])
        need = bench.point_seconds(0.0, guess)
        if clock.left() < need:
            why = (
                f"compiling takes about {guess:.0f} s here and timing it "
                f"{bench.point_seconds(0.0):.0f} s more; {clock.left():.0f} s left"
            )
            entry["skipped"] = why
            state.budget.skip("compile", f"{model} torch.compile", why)
            continue
        trainer = Trainer(torch, model, "fp32", batch, state.device, compiled=True)
        limit = clock.left() + COMPILE_OVERTIME_S
        try:
            seconds = call_within(trainer.step, state.sync, limit)
        except Exception as exc:
            cause = torch_smoke.compiler_problem(exc, state.use_cuda)
            if cause is None:
                raise
            raise RuntimeError(f"{cause}: {harness.describe_exc(exc)}") from exc
        if seconds is None:
            why = f"compiling {model} took more than the {limit:.0f} s left; stopped"
            entry["skipped"] = why
            state.budget.skip("compile", f"{model} torch.compile", why)
            for rest in models[index + 1 :]:
                why = f"no time left after compiling {model}"
                later = compile_entry(rest, state.figures.get((rest, "fp32")))
                later["skipped"] = why
                part["results"].append(later)
                state.budget.skip("compile", f"{rest} torch.compile", why)
            return
        entry["compile_seconds"] = guess = seconds
        harness.log(f"compile {model}: first compiled step in {seconds:.1f} s")
        figure = state.train_figure(trainer, batch, clock)
        log_figure(f"compile {model} compiled", figure)
        if figure is None:
            why = f"compiled in {guess:.0f} s; no time left to time the compiled step"
            entry["skipped"] = why
            state.budget.skip("compile", f"{model} compiled step", why)
            continue
        bench.check_loss(errors, f"compile: {model}", trainer.last_loss())
        entry["compiled"] = figure
        if entry["eager"] is not None and entry["eager"]["median"]:
            entry["speedup"] = figure["median"] / entry["eager"]["median"]


def run_batch(state, doc, clock):
    """Per precision, the transformer's samples/s and peak memory per batch size."""
    part = doc["batch"]
    part["memory"] = "torch.cuda.max_memory_allocated" if state.use_cuda else "peak RSS (VmHWM)"
    model = bench.TRANSFORMER["name"]
    precisions = [p for p in bench.PRECISIONS if state.unsupported(p) is None]
    for index, precision in enumerate(precisions):
        sweep = bench.new_sweep(model, precision)
        part["sweeps"].append(sweep)
        trainer = Trainer(state.torch, model, precision, bench.BATCH_START, state.device)
        bench.run_sweep(
            sweep,
            # Each sweep an equal part of what is left.
            bench.Clock(clock.left() / (len(precisions) - index)),
            state.budget,
            functools.partial(measure_point, state, trainer, errors=doc["errors"]),
            first_setup_s=0.0,
            on_cpu=not state.use_cuda,
        )


def measure_point(state, trainer, batch, clock, *, errors):
    """One point of a sweep, ``{"batch", **figure, "peak_bytes"}``, or why the sweep stops at
    ``batch`` (out of GPU memory, out of time)."""
    torch = state.torch
    oom = False
    figure = None
    try:
        trainer.use_batch(batch)
        gc.collect()
        if state.use_cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            bench.reset_peak_rss()
        figure = state.train_figure(trainer, batch, clock)
    except torch.cuda.OutOfMemoryError:
        if not state.use_cuda:
            raise
        oom = True
    if oom:
        # Out of the except block, so that the traceback no longer holds the step's tensors.
        trainer.release()
        gc.collect()
        torch.cuda.empty_cache()
        return f"out of memory at batch {batch}"
    what = f"{trainer.name} {trainer.precision} batch {batch}"
    log_figure(f"batch {what}", figure)
    if figure is None:
        return bench.late_point(batch)
    bench.check_loss(errors, f"batch: {what}", trainer.last_loss())
    peak = torch.cuda.max_memory_allocated() if state.use_cuda else bench.peak_rss_bytes()
    point = {"batch": batch}
    point.update(figure)
    point["peak_bytes"] = peak
    return point


class _ImageSamples:
    """Map-style samples, bench_harness's per-sample work: a "decoded" uint8 image from the
    sample's index (seeded), randomly cropped and flipped, normalised per channel; made a torch
    Dataset in run_loader."""

    def __init__(self, torch, length):
        self.torch = torch
        self.length = length
        self.classes = bench.CONV["classes"]
        self.mean = torch.tensor(bench.LOADER_MEAN).view(3, 1, 1)
        self.std = torch.tensor(bench.LOADER_STD).view(3, 1, 1)

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        torch = self.torch
        gen = torch.Generator().manual_seed(DATA_SEED + index)
        side, crop_side = bench.LOADER_IMAGE_SIDE, bench.LOADER_CROP_SIDE
        image = torch.randint(0, 256, (3, side, side), dtype=torch.uint8, generator=gen)

        def draw(n):
            return int(torch.randint(0, n, (1,), generator=gen))

        top, left = bench.crop_offsets(draw)
        crop = image[:, top : top + crop_side, left : left + crop_side]
        if draw(2):
            crop = crop.flip(2)
        x = (crop.to(torch.float32) - self.mean) / self.std
        return x, index % self.classes


def loader_figure(torch, dataset, workers, clock):
    """batches/s from a DataLoader with ``workers`` worker processes, no training; the
    warm-up call covers the workers' start."""
    options = {}
    if workers:
        # fork, what torch users on Linux get by default up to Python 3.13.
        options = {
            "multiprocessing_context": "fork",
            "prefetch_factor": bench.LOADER_PREFETCH,
            "timeout": LOADER_TIMEOUT_S,
        }
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=bench.DEFAULT_BATCH, shuffle=False, num_workers=workers, **options
    )
    batches = iter(loader)
    group = bench.loader_group(workers)

    def read():
        for _ in range(group):
            next(batches)

    try:
        return bench.measure(read, items_per_step=group, unit="batches/s", clock=clock)
    finally:
        shutdown = getattr(batches, "_shutdown_workers", None)
        if shutdown is not None:
            with contextlib.suppress(Exception):
                shutdown()


def run_loader(state, doc, clock):
    """DataLoader batches/s alone per worker count, against the conv step's rate."""
    part = doc["loader"]
    torch = state.torch
    batch = bench.DEFAULT_BATCH
    crop_side = bench.LOADER_CROP_SIDE
    part.update(kind=LOADER_KIND, batch=batch, sample=[3, crop_side, crop_side])
    counts = bench.LOADER_WORKERS
    step = state.figures.get(("conv", "fp32"))
    if step is None and clock.left() >= MIN_FIGURE_S:
        # The throughput section had no time for it: measured here, in a fair piece.
        trainer = Trainer(torch, "conv", "fp32", batch, state.device)
        step = state.train_figure(
            trainer, batch, bench.Clock(piece_seconds(clock.left(), len(counts) + 1))
        )
    if step is None:
        state.budget.skip("loader", "the conv step's rate", "no time left in the budget")
    else:
        part["step"] = {"model": "conv", "precision": "fp32", "batch": batch}
        part["step"].update(bench.per_batch(step, batch))
    dataset_class = type("ImageSamples", (_ImageSamples, torch.utils.data.Dataset), {})
    dataset = dataset_class(torch, LOADER_LENGTH)
    for index, workers in enumerate(counts):
        piece = bench.Clock(piece_seconds(clock.left(), len(counts) - index))
        figure = None
        if piece.left() >= MIN_FIGURE_S:
            figure = loader_figure(torch, dataset, workers, piece)
        log_figure(f"loader {workers} workers", figure)
        if figure is None:
            state.budget.skip("loader", f"{workers} workers", "no time left in the budget")
            continue
        point = {"workers": workers}
        point.update(figure)
        part["points"].append(point)


def _rank_main(rank, world, port, backend, sizes, deadline, conn):
    """One rank (spawned process): for each size in turn, check the sum once, then time
    repetitions; every decision is agreed among the ranks (an all-reduce of the slowest call
    and the least time left), so all of them run the same collectives.  ``deadline`` is on
    the monotonic clock, which every process of the machine shares.  Sends one dict."""
    res = {"rank": rank, "ok": False, "points": [], "stopped": None, "error": None}
    torch_ranks.report_rank(
        conn, res, rank, lambda: _measure_rank(res, rank, world, port, backend, sizes, deadline)
    )


def _measure_rank(res, rank, world, port, backend, sizes, deadline):
    """The work of one bench all-reduce rank (see _rank_main); its points in ``res``."""
    torch, dist, device = torch_ranks.join_process_group(rank, world, port, backend, 60)

    def sync():
        torch_ranks.synchronize(torch, device)

    control = torch.zeros(2, dtype=torch.float64, device=device)

    def agree(once):
        """(the slowest rank's ``once``, the least time left among the ranks)."""
        control[0] = once
        control[1] = -(deadline - time.monotonic())
        dist.all_reduce(control, op=dist.ReduceOp.MAX)
        slowest, least = control.tolist()
        return slowest, -least

    expected = world * (world + 1) / 2.0
    once, last_bytes = None, None
    for index, nbytes in enumerate(sizes):
        elements = max(2, nbytes // 4)
        _, left = agree(0.0)
        guess = 0.0 if once is None else once * elements * 4 / last_bytes
        need = allreduce_size_seconds(guess)
        if need > left:
            res["stopped"] = {
                "index": index,
                "why": f"an all-reduce of {size_text(elements * 4)} would need about "
                f"{need:.1f} s, {max(left, 0.0):.1f} s left",
            }
            break
        t = torch.full((elements,), float(rank + 1), dtype=torch.float32, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        sync()
        correct, got = torch_ranks.check_sum(torch, t, expected)
        t.zero_()  # the timed sums: zeros cannot overflow
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        sync()
        t0 = time.perf_counter()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        sync()
        once, left = agree(time.perf_counter() - t0)
        last_bytes = elements * 4
        calls, reps = allreduce_plan(once, left, len(sizes) - index)
        if reps == 0:
            res["stopped"] = {
                "index": index,
                "why": f"an all-reduce of {size_text(last_bytes)} takes {once:.2g} s; "
                f"{max(left, 0.0):.1f} s left",
            }
            break
        res["points"].append(
            {
                "bytes": last_bytes,
                "calls": calls,
                "samples": _sum_seconds(dist, t, calls, reps, sync),
                "correct": bool(correct),
                "got": got,
            }
        )
        del t


def _sum_seconds(dist, t, calls, reps, sync):
    """Seconds per all-reduce of ``t``: one sample per repetition of ``calls`` all-reduces."""
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        sync()
        samples.append((time.perf_counter() - t0) / calls)
    return samples


def combine_points(results, world):
    """The per-size points of the document from every rank's samples: a repetition lasts as
    long as its slowest rank."""
    ranks = [results[r]["points"] for r in range(world)]
    points = []
    for index in range(min(len(p) for p in ranks)):
        mine = [p[index] for p in ranks]
        nbytes, calls = mine[0]["bytes"], mine[0]["calls"]
        reps = min(len(m["samples"]) for m in mine)
        seconds = [max(m["samples"][k] for m in mine) for k in range(reps)]
        median = bench.stats(seconds, "s")["median"]
        algbw = nbytes / median / 1e9
        busbw = bench.stats([bench.busbw(nbytes / s / 1e9, world) for s in seconds], "GB/s")
        busbw["steps_per_rep"] = calls
        point = {
            "bytes": nbytes,
            "iterations": calls * reps,
            "seconds": median,
            "algbw_gbps": algbw,
            "busbw_gbps": bench.busbw(algbw, world),
            "busbw": busbw,
            "correct": all(m["correct"] for m in mine),
        }
        if not point["correct"]:
            point["got"] = next(m["got"] for m in mine if not m["correct"])
        if world == 1:
            point["note"] = bench.ONE_RANK_NOTE
        points.append(point)
    return points


def run_allreduce(state, doc, clock):
    """Seconds, algbw and busbw per message size between the ranks, each size's sum checked."""
    part, errors = doc["allreduce"], doc["errors"]
    torch = state.torch
    import torch.distributed as dist

    if state.use_cuda:
        backend, world = "nccl", torch.cuda.device_count()
    else:
        backend, world = "gloo", verdicts.CPU_WORLD_SIZE
    part.update(backend=backend, world_size=world, dtype="float32")
    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this build")
    if backend == "gloo" and not dist.is_gloo_available():
        raise RuntimeError("gloo backend unavailable")
    sizes = list(bench.ALLREDUCE_SIZES)
    if clock.left() < ALLREDUCE_MIN_S:
        why = f"starting the ranks takes seconds; {clock.left():.0f} s left"
        state.budget.skip("allreduce", "every size", why)
        return
    deadline = clock.end - ALLREDUCE_RESERVE_S
    results, missing, _ = torch_ranks.run_ranks(
        _rank_main, world, (backend, sizes, deadline), clock.end + ALLREDUCE_GRACE_S
    )
    for rank in sorted(results):
        if results[rank].get("error"):
            errors.append("allreduce: " + results[rank]["error"])
    for rank in missing:
        errors.append(f"allreduce: rank {rank}: no result in time, killed")
    if missing or not all(r.get("ok") for r in results.values()):
        return
    points = combine_points(results, world)
    part["points"] = points
    expected = world * (world + 1) / 2.0
    for point in points:
        if not point["correct"]:
            errors.append(
                f"allreduce: {size_text(point['bytes'])}: wrong sum: expected {expected:g} "
                f"everywhere, got {point['got']!r}"
            )
    part["correct"] = all(p["correct"] for p in points) if points else None
    if len(points) < len(sizes):
        stopped = results[0].get("stopped") or {}
        rest = sizes[len(points) :]
        what = f"size {size_text(rest[0])}" + (
            f" to {size_text(rest[-1])}" if len(rest) > 1 else ""
        )
        state.budget.skip("allreduce", what, stopped.get("why") or "no time left in the budget")


def benchmark(run, budget):
    """The bench on this image: versions and devices, then the five measured sections."""
    torch = run.load("torch")
    if torch is None:
        return
    state = BenchState(torch, budget)
    run.section(
        "versions",
        60,
        lambda doc: torch_smoke.collect_versions(torch, doc["versions"], doc["errors"]),
    )
    run.section("devices", 60, lambda doc: run_devices(state, doc))
    bench.run_sections(
        run, budget, state, (run_throughput, run_compile, run_batch, run_loader, run_allreduce)
    )


if __name__ == "__main__":
    bench.main(PAYLOAD, benchmark)
