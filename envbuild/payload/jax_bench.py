#!/usr/bin/env python3
"""envbuild bench payload for JAX images.

Copied into a container beside smoke_harness.py, bench_harness.py and
jax_smoke.py, and run as ``python3 jax_bench.py``.  It measures, on this
machine, what bench_harness.py defines for every framework alike, and prints
one JSON document (the smoke harness's report, with the bench parts):

  * throughput -- the two standard models (conv, transformer) trained with
                  plain SGD under jax.jit, per precision: fp32; bf16 (parameters
                  fp32, the forward pass in bfloat16, the loss in fp32); fp16
                  with a static loss scale (GPUs only);
  * compile    -- op-by-op (jax.disable_jit) against jax.jit, the XLA
                  compilation timed apart (``jit(...).lower(...).compile()``);
  * batch      -- the transformer per precision, batch 8, 16, ... until memory,
                  time or BATCH_MAX stops it, with the peak memory of each point;
  * loader     -- batches/s of a multiprocessing Pool of numpy workers alone
                  (0 workers: in this process), against the conv step's rate;
  * allreduce  -- psum over the default backend's devices (two forced XLA host
                  devices on the CPU, every GPU otherwise), 8 B to 256 MiB.

The models are written with jax.numpy / jax.nn / jax.lax alone: the image
holds jax and numpy, no flax or optax.  XLA dispatches asynchronously, so every
clock read waits for the device (``jax.block_until_ready``).  Nothing but the
standard library is imported before main() has set XLA_FLAGS; the loader's
worker processes re-import this file, so it must stay light at import time.
"""

import collections
import gc
import itertools
import math
import multiprocessing
import os
import time

import bench_harness as bench
import jax_smoke
import smoke_harness as harness
from smoke_harness import describe_exc, log

PAYLOAD = "jax_bench"

# fp16 training on GPUs multiplies the loss by this before the backward pass.
FP16_LOSS_SCALE = 1024.0
# A measurement is not started with less than this left of its section's clock: warm-up (XLA
# compilation) and MIN_REPS repetitions of TARGET_REP_S do not fit in less.
MIN_ITEM_S = 1.5
# Before a section has seen a warm-up (compilation, start-up), it expects one to take this long.
FIRST_WARMUP_S = 1.0
# A batch-size point whose predecessor took t seconds is expected to take about this x t.
SWEEP_GROWTH = 2.0
# Before the first point of a sweep there is no predecessor: this is its expected cost.
FIRST_POINT_S = 2.0

# The loader's per-sample work (the same in every framework).
LOADER_SEED = 20240
LOADER_IMAGE = (3, 48, 48)
LOADER_CROP = 32
LOADER_MEAN = (125.3, 123.0, 113.9)
LOADER_STD = (63.0, 62.1, 66.7)
# Batches each worker keeps in flight, as torch's DataLoader (prefetch_factor 2).
LOADER_PREFETCH = 2
LOADER_GET_TIMEOUT_S = 60.0


# --------------------------------------------------------------------------
# pure rules (no jax): the sweep's stop rules, the clock's slices, the all-reduce points


def gigabytes(nbytes):
    return f"{nbytes / 1e9:.1f} GB"


def memory_stop(next_batch, last_peak, available, rss, fraction=bench.CPU_MEMORY_FRACTION):
    """Why a CPU sweep must not try ``next_batch``, or None: its step would need about twice the
    last point's peak, more than ``fraction`` of the memory this process could reach (what is
    available plus what it already holds)."""
    if last_peak is None or available is None:
        return None
    reachable = available + (rss or 0)
    allowed = fraction * reachable
    need = 2 * last_peak
    if need <= allowed:
        return None
    return (
        f"memory: batch {next_batch} would need about {gigabytes(need)} of "
        f"{gigabytes(allowed)} available ({fraction:.0%} of {gigabytes(reachable)})"
    )


def time_stop(next_batch, last_point_s, left_s):
    """Why a sweep must not try ``next_batch``, or None: the point takes about SWEEP_GROWTH x the
    last one (FIRST_POINT_S for the first), more than the ``left_s`` seconds of its slice."""
    need = FIRST_POINT_S if last_point_s is None else SWEEP_GROWTH * last_point_s
    if need <= left_s:
        return None
    return (
        f"time: batch {next_batch} would need about {need:.1f} s, "
        f"{left_s:.1f} s left of the sweep's share"
    )


def sweep_batches(start=bench.BATCH_START, largest=bench.BATCH_MAX):
    """The batch sizes of a sweep: ``start`` doubling up to ``largest``."""
    batches = []
    batch = start
    while batch <= largest:
        batches.append(batch)
        batch *= 2
    return batches


def reps_for(left_s, items_left, warmup_s):
    """Repetitions for the next of ``items_left`` measurements sharing ``left_s`` seconds: REPS
    when its equal part holds them (with the warm-up and the sizing call), MIN_REPS when it does
    not, None when not even MIN_ITEM_S is left (the item is skipped)."""
    if left_s < MIN_ITEM_S or items_left < 1:
        return None
    full = warmup_s + (bench.REPS + 2) * bench.TARGET_REP_S
    return bench.REPS if left_s / items_left >= full else bench.MIN_REPS


class Items:
    """A section's measurements sharing its clock: ``reps()`` before each (None: skip it),
    ``seen(figure)`` after, so that the next ones expect its warm-up."""

    def __init__(self, clock, count):
        self.clock = clock
        self.left = count
        self.warmup_s = FIRST_WARMUP_S

    def reps(self):
        reps = reps_for(self.clock.left(), self.left, self.warmup_s)
        self.left -= 1
        return reps

    def seen(self, figure):
        if figure is not None and figure.get("warmup_seconds") is not None:
            self.warmup_s = figure["warmup_seconds"]


def allreduce_point(nbytes, world, figure):
    """A point of the all-reduce curve from ``figure``, all-reduces per second (one sample per
    repetition): seconds per all-reduce, algbw and busbw as nccl-tests define them, and busbw's
    own figure in GB/s."""
    rates = figure["samples"]
    busbws = [bench.busbw(nbytes * rate / 1e9, world) for rate in rates]
    seconds = 1.0 / figure["median"]
    algbw = nbytes / seconds / 1e9
    busbw_figure = bench.stats(busbws, "GB/s")
    busbw_figure["steps_per_rep"] = figure.get("steps_per_rep")
    busbw_figure["warmup_seconds"] = figure.get("warmup_seconds")
    point = {
        "bytes": nbytes,
        "iterations": int(figure.get("steps_per_rep") or 1) * len(rates),
        "seconds": seconds,
        "algbw_gbps": algbw,
        "busbw_gbps": bench.busbw(algbw, world),
        "busbw": busbw_figure,
    }
    if world == 1:
        point["note"] = "one rank: no communication"
    return point


def per_batch(figure, batch):
    """A samples/s figure as batches/s of ``batch`` samples."""
    out = bench.stats([s / batch for s in figure["samples"]], "batches/s")
    out["steps_per_rep"] = figure.get("steps_per_rep")
    out["warmup_seconds"] = figure.get("warmup_seconds")
    return out


# --------------------------------------------------------------------------
# the loader's work: numpy only, run in worker processes that never import jax


def loader_sample(np, index):
    """One sample: a seeded 3x48x48 uint8 "decoded" image, a random 32x32 crop, a random
    horizontal flip, float32 normalised by a per-channel mean and std."""
    rng = np.random.default_rng((LOADER_SEED, index))
    image = rng.integers(0, 256, size=LOADER_IMAGE, dtype=np.uint8)
    top, left = rng.integers(0, LOADER_IMAGE[1] - LOADER_CROP + 1, size=2)
    crop = image[:, top : top + LOADER_CROP, left : left + LOADER_CROP]
    if rng.random() < 0.5:
        crop = crop[:, :, ::-1]
    mean = np.asarray(LOADER_MEAN, np.float32).reshape(3, 1, 1)
    std = np.asarray(LOADER_STD, np.float32).reshape(3, 1, 1)
    return (crop.astype(np.float32) - mean) / std


def loader_batch(index, batch=bench.DEFAULT_BATCH):
    """Batch ``index``: its samples stacked (batch, 3, 32, 32) float32, and int32 labels."""
    import numpy as np

    first = index * batch
    images = np.stack([loader_sample(np, first + i) for i in range(batch)])
    labels = (np.arange(first, first + batch) % 10).astype(np.int32)
    return images, labels


def pool_context():
    """A start method safe in a process where XLA already runs threads (fork is not: a child may
    inherit a lock held by one of them): forkserver, else spawn."""
    methods = multiprocessing.get_all_start_methods()
    method = "forkserver" if "forkserver" in methods else "spawn"
    return method, multiprocessing.get_context(method)


class PoolLoader:
    """Batches from a multiprocessing Pool, LOADER_PREFETCH per worker in flight, in order."""

    def __init__(self, context, workers):
        self.pool = context.Pool(workers)
        self.pending = collections.deque()
        self.indices = itertools.count()
        for _ in range(workers * LOADER_PREFETCH):
            self._submit()

    def _submit(self):
        self.pending.append(self.pool.apply_async(loader_batch, (next(self.indices),)))

    def next(self):
        result = self.pending.popleft()
        self._submit()
        return result.get(LOADER_GET_TIMEOUT_S)

    def close(self):
        # Pool.terminate() can hang while tasks are still queued (its task thread blocks on the
        # queue's lock): let the batches in flight finish first.
        for result in self.pending:
            result.wait(LOADER_GET_TIMEOUT_S)
        self.pending.clear()
        self.pool.terminate()
        self.pool.join()


# --------------------------------------------------------------------------
# the two standard models, in jax.numpy


def model_arrays(np, model, seed=0):
    """The model's parameters as numpy float32 arrays from a fixed seed, initialised as
    torch.nn.Linear/Conv2d are: U(-1/sqrt(fan_in), 1/sqrt(fan_in)); LayerNorm 1 and 0.  (numpy,
    not jax.random: each jax.random call of a new shape is one more XLA compilation.)"""
    rng = np.random.default_rng(seed)

    def uniform(shape, fan_in):
        bound = 1.0 / math.sqrt(fan_in)
        return rng.uniform(-bound, bound, size=shape).astype(np.float32)

    def dense(fan_in, fan_out):
        return {"w": uniform((fan_in, fan_out), fan_in), "b": uniform((fan_out,), fan_in)}

    if model["name"] == "conv":
        convs = []
        cin = model["input"][0]
        for cout in model["channels"]:
            convs.append({"w": uniform((cout, cin, 3, 3), cin * 9), "b": uniform((cout,), cin * 9)})
            cin = cout
        return {"convs": convs, "head": dense(cin, model["classes"])}
    width = model["width"]

    def norm():
        return {"g": np.ones((width,), np.float32), "b": np.zeros((width,), np.float32)}

    params = {"ln1": norm()}
    for name in ("q", "k", "v", "o"):
        params[name] = dense(width, width)
    params["ln2"] = norm()
    params["ff1"] = dense(width, model["ffn"])
    params["ff2"] = dense(model["ffn"], width)
    params["head"] = dense(width, model["classes"])
    return params


def batch_arrays(np, model, batch, seed=1):
    """One fixed random batch as numpy arrays: float32 inputs, int32 class labels."""
    rng = np.random.default_rng(seed)
    if model["name"] == "conv":
        shape = (batch, *model["input"])
    else:
        shape = (batch, model["sequence"], model["width"])
    x = rng.standard_normal(shape, dtype=np.float32)
    y = rng.integers(0, model["classes"], size=(batch,)).astype(np.int32)
    return x, y


def init_params(jax, model, seed=0):
    """The model's parameters (float32) on the default device."""
    import numpy as np

    return jax.device_put(model_arrays(np, model, seed))


def model_batch(jax, model, batch, seed=1):
    """The model's fixed batch on the default device."""
    import numpy as np

    return jax.device_put(batch_arrays(np, model, batch, seed))


def conv_forward(jax, params, x):
    """NCHW: three 3x3 convolutions (strides 1, 2, 2; padding 1) with ReLU, global average
    pooling, a dense layer."""
    h = x
    for i, layer in enumerate(params["convs"]):
        stride = 1 if i == 0 else 2
        h = jax.lax.conv_general_dilated(
            h,
            layer["w"],
            window_strides=(stride, stride),
            padding=((1, 1), (1, 1)),
            dimension_numbers=("NCHW", "OIHW", "NCHW"),
        )
        h = jax.nn.relu(h + layer["b"].reshape(1, -1, 1, 1))
    pooled = h.mean(axis=(2, 3))
    return pooled @ params["head"]["w"] + params["head"]["b"]


def transformer_forward(jax, params, x, heads):
    """One pre-LayerNorm block: x + MHA(LN(x)), then x + W2 GELU(W1 LN(x)); the mean over the
    sequence; a dense layer.  LayerNorm statistics and the attention softmax run in float32
    whatever the compute type (as autocast keeps them)."""
    import jax.numpy as jnp

    dtype = x.dtype

    def layer_norm(h, p):
        h32 = h.astype(jnp.float32)
        mean = h32.mean(axis=-1, keepdims=True)
        var = ((h32 - mean) ** 2).mean(axis=-1, keepdims=True)
        out = (h32 - mean) * jax.lax.rsqrt(var + 1e-5)
        return (out * p["g"].astype(jnp.float32) + p["b"].astype(jnp.float32)).astype(dtype)

    def dense(h, p):
        return h @ p["w"] + p["b"]

    batch, seq, width = x.shape
    head_dim = width // heads
    h = layer_norm(x, params["ln1"])

    def split(t):
        return t.reshape(batch, seq, heads, head_dim)

    q, k, v = (split(dense(h, params[name])) for name in ("q", "k", "v"))
    scores = jnp.einsum("bshd,bthd->bhst", q, k) / math.sqrt(head_dim)
    weights = jax.nn.softmax(scores.astype(jnp.float32), axis=-1).astype(dtype)
    attended = jnp.einsum("bhst,bthd->bshd", weights, v).reshape(batch, seq, width)
    x = x + dense(attended, params["o"])
    h = layer_norm(x, params["ln2"])
    x = x + dense(jax.nn.gelu(dense(h, params["ff1"]), approximate=False), params["ff2"])
    return dense(x.mean(axis=1), params["head"])


PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def train_step(jax, model, precision):
    """The un-jitted SGD step ``(params, x, y) -> (params, loss)``: parameters stay float32, the
    forward pass runs in the precision's type, the loss is float32; fp16 scales the loss by
    FP16_LOSS_SCALE and the gradients back."""
    import jax.numpy as jnp

    dtype = jnp.dtype(PRECISION_DTYPES[precision])
    scale = FP16_LOSS_SCALE if precision == "fp16" else 1.0

    def loss_fn(params, x, y):
        cast = jax.tree_util.tree_map(lambda p: p.astype(dtype), params)
        if model["name"] == "conv":
            logits = conv_forward(jax, cast, x.astype(dtype))
        else:
            logits = transformer_forward(jax, cast, x.astype(dtype), model["heads"])
        logits = logits.astype(jnp.float32)
        picked = jnp.take_along_axis(logits, y[:, None], axis=1)[:, 0]
        loss = jnp.mean(jax.nn.logsumexp(logits, axis=1) - picked)
        return loss * scale, loss

    def step(params, x, y):
        grads, loss = jax.grad(loss_fn, has_aux=True)(params, x, y)
        params = jax.tree_util.tree_map(
            lambda p, g: p - bench.LEARNING_RATE * (g / scale), params, grads
        )
        return params, loss

    return step


class Training:
    """A training loop over one fixed batch, for ``bench.measure``: ``step()`` runs one step,
    ``sync()`` waits for XLA's queued work, ``loss()`` is the last loss."""

    def __init__(self, jax, fn, params, x, y):
        self.jax, self.fn, self.x, self.y = jax, fn, x, y
        self.state = [params, None]

    def step(self):
        self.state[0], self.state[1] = self.fn(self.state[0], self.x, self.y)

    def sync(self):
        self.jax.block_until_ready(self.state)

    def loss(self):
        return None if self.state[1] is None else float(self.state[1])


def check_loss(errors, section, what, loss):
    """A non-finite loss is an error (the precision does not train here)."""
    if loss is None or not math.isfinite(loss):
        errors.append(f"{section}: {what}: the loss is {loss!r}, not finite")


# --------------------------------------------------------------------------
# the sections


def on_gpu(jax):
    return jax.default_backend() == "gpu"


def precisions(jax):
    """(precision, why not) per precision: fp16 with loss scaling is for GPUs."""
    if on_gpu(jax):
        return [(p, None) for p in bench.PRECISIONS]
    why = "fp16 with loss scaling is for GPUs; this run has only the CPU"
    return [(p, why if p == "fp16" else None) for p in bench.PRECISIONS]


def measure_training(jax, fn, model, batch, clock, reps):
    """Train ``model`` with ``fn`` on its fixed batch: (samples/s figure or None, last loss)."""
    x, y = model_batch(jax, model, batch)
    training = Training(jax, fn, init_params(jax, model), x, y)
    figure = bench.measure(
        training.step, items_per_step=batch, unit="samples/s", clock=clock,
        sync=training.sync, reps=reps,
    )  # fmt: skip
    return figure, training.loss()


def run_throughput(jax, doc, budget, state):
    part = doc["throughput"]
    clock = bench.Clock(budget.share("throughput"))
    part["mode"] = "jax.jit"
    batch = part["batch"] = bench.DEFAULT_BATCH
    jobs = [(m, p, why) for m in bench.MODELS for p, why in precisions(jax)]
    items = Items(clock, sum(1 for job in jobs if job[2] is None))
    for model, precision, why in jobs:
        name = model["name"]
        entry = {"model": name, "precision": precision}
        part["results"].append(entry)
        if why is not None:
            entry["unsupported"] = why
            continue
        reps = items.reps()
        if reps is None:
            entry["skipped"] = "no time left in the section's share of the budget"
            budget.skip("throughput", f"{name} {precision}")
            continue
        fn = jax.jit(train_step(jax, model, precision))
        figure, loss = measure_training(jax, fn, model, batch, clock, reps)
        items.seen(figure)
        check_loss(doc["errors"], "throughput", f"{name} {precision}", loss)
        if figure is None:
            entry["skipped"] = "the clock ran out before 3 repetitions"
            budget.skip("throughput", f"{name} {precision}", entry["skipped"])
            continue
        log(f"throughput: {name} {precision}: {figure['median']:.0f} samples/s")
        entry.update(batch=batch, mode=part["mode"], **figure)
        if name == "conv" and precision == "fp32":
            state["conv_fp32"] = figure


def run_compile(jax, doc, budget):
    part = doc["compile"]
    clock = bench.Clock(budget.share("compile"))
    part["eager_mode"] = "op-by-op (jax.disable_jit)"
    part["compiled_mode"] = "jax.jit (XLA)"
    batch = bench.DEFAULT_BATCH
    items = Items(clock, 2 * len(bench.MODELS))
    for model in bench.MODELS:
        name = model["name"]
        entry = {"model": name, "precision": "fp32", "batch": batch, "eager": None,
                 "compiled": None, "compile_seconds": None, "speedup": None}  # fmt: skip
        part["results"].append(entry)
        fn = train_step(jax, model, "fp32")

        reps = items.reps()
        if reps is not None:
            x, y = model_batch(jax, model, batch)
            t0 = time.perf_counter()
            compiled = jax.jit(fn).lower(init_params(jax, model), x, y).compile()
            entry["compile_seconds"] = time.perf_counter() - t0
            entry["compiled"], loss = measure_training(jax, compiled, model, batch, clock, reps)
            check_loss(doc["errors"], "compile", f"{name} jax.jit", loss)
        if entry["compiled"] is None:
            budget.skip("compile", f"{name} compiled")

        reps = items.reps()
        if reps is not None:
            with jax.disable_jit():
                entry["eager"], loss = measure_training(jax, fn, model, batch, clock, reps)
            items.seen(entry["eager"])
            check_loss(doc["errors"], "compile", f"{name} op-by-op", loss)
        if entry["eager"] is None:
            budget.skip("compile", f"{name} eager")
        if entry["eager"] and entry["compiled"]:
            entry["speedup"] = entry["compiled"]["median"] / entry["eager"]["median"]
            log(f"compile: {name}: jax.jit is {entry['speedup']:.1f}x op-by-op")


def is_oom(exc):
    text = str(exc)
    return "RESOURCE_EXHAUSTED" in text or "out of memory" in text.lower()


def device_peak_bytes(device):
    try:
        stats = device.memory_stats() or {}
    except Exception as exc:
        log(f"memory_stats: {describe_exc(exc)}")
        return None
    peak = stats.get("peak_bytes_in_use")
    return None if peak is None else int(peak)


def run_batch(jax, doc, budget):
    part = doc["batch"]
    clock = bench.Clock(budget.share("batch"))
    gpu = on_gpu(jax)
    device = jax.devices()[0]
    # XLA's allocator keeps no resettable peak: on a GPU the peak is since the start, which the
    # growing batches dominate.
    part["memory"] = "jax device memory_stats peak_bytes_in_use" if gpu else "peak RSS (VmHWM)"
    model = bench.TRANSFORMER
    sweeps = [p for p, why in precisions(jax) if why is None]
    for i, precision in enumerate(sweeps):
        sweep = {"model": model["name"], "precision": precision, "points": [],
                 "largest_fit": None, "largest_fit_peak_bytes": None, "stopped": None}  # fmt: skip
        part["sweeps"].append(sweep)
        sweep_clock = bench.Clock(clock.left() / (len(sweeps) - i))
        fn = jax.jit(train_step(jax, model, precision))
        last_s = None
        batches = sweep_batches()
        for batch in batches:
            why = time_stop(batch, last_s, sweep_clock.left())
            if why is not None:
                sweep["stopped"] = why
                budget.skip("batch", f"{model['name']} {precision} from batch {batch}", why)
                break
            t0 = time.perf_counter()
            if not gpu:
                bench.reset_peak_rss()
            try:
                figure, loss = measure_training(jax, fn, model, batch, sweep_clock, bench.REPS)
            except Exception as exc:
                if not (gpu and is_oom(exc)):
                    raise
                sweep["stopped"] = f"out of memory at batch {batch}"
                log(f"batch: {precision} batch {batch}: {describe_exc(exc)}")
                break
            finally:
                gc.collect()
            last_s = time.perf_counter() - t0
            if figure is None:
                sweep["stopped"] = f"time: batch {batch} did not finish 3 repetitions in the sweep's share"  # fmt: skip
                budget.skip("batch", f"{model['name']} {precision} from batch {batch}", sweep["stopped"])  # fmt: skip
                break
            check_loss(doc["errors"], "batch", f"{precision} batch {batch}", loss)
            peak = device_peak_bytes(device) if gpu else bench.peak_rss_bytes()
            sweep["points"].append({"batch": batch, **figure, "peak_bytes": peak})
            sweep["largest_fit"], sweep["largest_fit_peak_bytes"] = batch, peak
            if not gpu and batch != batches[-1]:
                why = memory_stop(
                    batch * 2, peak, bench.available_memory_bytes(), bench.rss_bytes()
                )
                if why is not None:
                    sweep["stopped"] = why
                    break
        else:
            sweep["stopped"] = f"reached the largest batch tried ({bench.BATCH_MAX})"
        jax.clear_caches()


def run_loader(jax, doc, budget, state):
    part = doc["loader"]
    clock = bench.Clock(budget.share("loader"))
    method, context = pool_context()
    part["kind"] = f"multiprocessing.Pool ({method} worker processes, numpy)"
    batch = part["batch"] = bench.DEFAULT_BATCH
    conv = state.get("conv_fp32")
    counts = list(bench.LOADER_WORKERS)
    items = Items(clock, len(counts) + (conv is None))
    if conv is None:  # the throughput section had no time for it: measure it here
        reps = items.reps()
        if reps is not None:
            fn = jax.jit(train_step(jax, bench.CONV, "fp32"))
            conv, _ = measure_training(jax, fn, bench.CONV, batch, clock, reps)
    if conv is not None:
        part["step"] = {"model": "conv", "precision": "fp32", "batch": batch, **per_batch(conv, batch)}  # fmt: skip
    else:
        budget.skip("loader", "the conv step's rate")
    for workers in counts:
        reps = items.reps()
        if reps is None:
            budget.skip("loader", f"{workers} workers")
            continue
        point = {"workers": workers}
        loader = None
        try:
            t0 = time.perf_counter()
            if workers == 0:
                indices = itertools.count()

                def fetch(indices=indices):
                    return loader_batch(next(indices))
            else:
                loader = PoolLoader(context, workers)
                fetch = loader.next
                # start-up (processes, imports) stays out of the timing
                for _ in range(workers * LOADER_PREFETCH):
                    fetch()
            point["startup_seconds"] = time.perf_counter() - t0

            # A step is LOADER_BATCHES batches: one batch alone may have been made ahead (the
            # workers prefetch), which would make measure() size its repetitions far too long.
            def step(fetch=fetch):
                for _ in range(bench.LOADER_BATCHES):
                    fetch()

            figure = bench.measure(
                step, items_per_step=bench.LOADER_BATCHES, unit="batches/s", clock=clock, reps=reps
            )
        finally:
            if loader is not None:
                loader.close()
        if figure is None:
            budget.skip("loader", f"{workers} workers", "the clock ran out before 3 repetitions")
            continue
        log(f"loader: {workers} workers: {figure['median']:.0f} batches/s")
        point.update(figure)
        part["points"].append(point)


def make_allreduce(jax, devs, elements):
    """(fn, make, method): jax_smoke's shard_map psum, else its pmap one."""
    try:
        fn, make = jax_smoke._shard_map_allreduce(jax, devs, elements)
        jax.block_until_ready(fn(make(lambda k: 0.0)))
        return fn, make, "shard_map/psum"
    except Exception as exc:
        log(f"shard_map all-reduce failed, trying pmap: {describe_exc(exc)}")
        fn, make = jax_smoke._pmap_allreduce(jax, devs, elements)
        return fn, make, "pmap/psum"


def run_allreduce(jax, doc, budget):
    import jax.numpy as jnp

    part = doc["allreduce"]
    clock = bench.Clock(budget.share("allreduce"))
    devs = jax.devices()
    world = len(devs)
    gpu = on_gpu(jax)
    part["backend"] = "NCCL (psum over the GPUs)" if gpu else "XLA host devices (psum)"
    part["world_size"] = world
    if not gpu and world < harness.CPU_WORLD_SIZE:
        doc["errors"].append(
            f"allreduce: only {world} host device(s) although XLA_FLAGS asks for "
            f"{harness.CPU_WORLD_SIZE} ({os.environ.get('XLA_FLAGS', '')!r})"
        )
    expected = world * (world + 1) / 2.0
    items = Items(clock, len(bench.ALLREDUCE_SIZES))
    verdicts = []
    for nbytes in bench.ALLREDUCE_SIZES:
        reps = items.reps()
        if reps is None:
            budget.skip("allreduce", f"{nbytes} bytes")
            continue
        elements = max(2, nbytes // 4)
        fn, make, method = make_allreduce(jax, devs, elements)
        part.setdefault("method", method)
        out = jax.block_until_ready(fn(make(lambda k: float(k + 1))))
        correct, got = jax_smoke._check_sum(jnp, out, expected)
        del out
        verdicts.append(correct)
        if not correct:
            doc["errors"].append(
                f"allreduce: {nbytes} bytes: wrong result: expected {expected!r} everywhere, got {got!r}"
            )
        buf = [make(lambda k: 0.0)]

        def step(buf=buf, fn=fn):
            buf[0] = fn(buf[0])
            if not gpu:
                # XLA's in-process CPU all-reduce deadlocks when several are queued at once (the
                # ranks' halves wait in its thread pool for partners queued behind them; seen
                # with 100 chained calls on 2 cores): one at a time.
                jax.block_until_ready(buf[0])

        def sync(buf=buf):
            jax.block_until_ready(buf[0])

        figure = bench.measure(
            step, items_per_step=1, unit="allreduces/s", clock=clock, sync=sync, reps=reps
        )
        del buf[:]
        if figure is None:
            budget.skip("allreduce", f"{nbytes} bytes", "the clock ran out before 3 repetitions")
            continue
        point = allreduce_point(nbytes, world, figure)
        log(f"allreduce: {nbytes} bytes: busbw {point['busbw_gbps']:.3g} GB/s")
        part["points"].append(point)
    part["correct"] = bool(verdicts) and all(verdicts)
    if gpu and doc["versions"].get("nccl") is None:
        doc["versions"]["nccl"] = harness.loaded_nccl_version()


def start_xla(jax):
    """One tiny compiled training step (a convolution and a matrix product), so that XLA's
    one-time start-up is not charged to the first figure measured."""
    import jax.numpy as jnp

    def loss(w, k, x):
        h = jax.lax.conv_general_dilated(x, k, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"))  # fmt: skip
        return jnp.mean(h.mean(axis=(2, 3)) @ w)

    args = (jnp.ones((2, 2)), jnp.ones((2, 1, 3, 3)), jnp.ones((1, 1, 4, 4)))
    jax.block_until_ready(jax.jit(jax.grad(loss))(*args))


def collect_devices(jax, doc):
    doc["devices"].extend(jax_smoke.collect_devices(jax))
    doc["machine"] = machine_facts(doc["devices"])
    t0 = time.perf_counter()
    start_xla(jax)
    log(f"XLA start-up: {time.perf_counter() - t0:.2f} s")


def machine_facts(devices):
    facts = bench.cpu_facts()
    gpus = [
        {
            "name": d.get("name"),
            "memory_bytes": d.get("memory_bytes"),
            "capability": d.get("capability"),
        }
        for d in devices
        if d.get("kind") in ("gpu", "cuda")
    ]
    if gpus:
        facts["gpus"] = gpus
    return facts


def timed(name, fn):
    """A section body that runs ``fn(doc)`` and records the part's wall seconds."""

    def body(doc):
        t0 = time.perf_counter()
        try:
            fn(doc)
        finally:
            doc[name]["seconds"] = time.perf_counter() - t0

    return body


def main():
    errors = []
    budget = bench.Budget.from_env(errors)

    def body(run):
        run.errors.extend(errors)
        try:
            jax_smoke.force_host_devices()
            jax = run.load("jax")
            if jax is None:
                return
            state = {}
            run.section("versions", 60, lambda doc: jax_smoke.collect_versions(jax, doc["versions"], doc["errors"]))  # fmt: skip
            run.section("devices", 60, lambda doc: collect_devices(jax, doc))
            sections = {
                "throughput": lambda doc: run_throughput(jax, doc, budget, state),
                "compile": lambda doc: run_compile(jax, doc, budget),
                "batch": lambda doc: run_batch(jax, doc, budget),
                "loader": lambda doc: run_loader(jax, doc, budget, state),
                "allreduce": lambda doc: run_allreduce(jax, doc, budget),
            }
            for name, fn in sections.items():
                run.section(name, budget.share(name) + bench.SECTION_GRACE_S, timed(name, fn))
        finally:
            run.doc["skipped"] = list(budget.skipped)

    harness.main(
        PAYLOAD,
        body,
        parts=bench.bench_parts(),
        checks=(),
        extra={"bench_version": bench.BENCH_VERSION, "budget_s": budget.total_s},
        total_s=budget.total_s + bench.MARGIN_S,
    )


if __name__ == "__main__":
    main()
