#!/usr/bin/env python3
"""envbuild bench payload for JAX images.

Copied into a container with the other payload modules and run as ``python3
jax_bench.py``: ``benchmark(run, budget)`` runs under bench_harness.main.  It
measures, on this machine, what bench_harness.py defines for every framework
alike, and prints one JSON document (the smoke harness's report, with the bench
parts):

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
import functools
import gc
import itertools
import math
import multiprocessing
import os
import time

import bench_harness as bench
import jax_smoke
import payload_versions
import smoke_verdicts as verdicts
from smoke_harness import describe_exc, log

PAYLOAD = "jax_bench"

# fp16 training on GPUs multiplies the loss by this before the backward pass.
FP16_LOSS_SCALE = 1024.0
# A measurement is not started with less than this left of its section's clock: warm-up (XLA
# compilation) and MIN_REPS repetitions of TARGET_REP_S do not fit in less.
MIN_ITEM_S = 1.5
# Before a section has seen a warm-up (compilation, start-up), it expects one to take this long;
# a sweep's first point expects that much besides its steps.
FIRST_WARMUP_S = 1.0

# The loader: bench_harness's per-sample work in numpy, seeded from this and the sample's index.
LOADER_SEED = 20240
LOADER_GET_TIMEOUT_S = 60.0


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
        point["note"] = bench.ONE_RANK_NOTE
    return point


def loader_sample(np, index):
    """One sample, bench_harness's per-sample work: a seeded "decoded" uint8 image, a random
    crop, a random horizontal flip, float32 normalised per channel."""
    rng = np.random.default_rng((LOADER_SEED, index))
    side, crop_side = bench.LOADER_IMAGE_SIDE, bench.LOADER_CROP_SIDE
    image = rng.integers(0, 256, size=(3, side, side), dtype=np.uint8)
    top, left = bench.crop_offsets(lambda n: int(rng.integers(0, n)))
    crop = image[:, top : top + crop_side, left : left + crop_side]
    if rng.random() < 0.5:
        crop = crop[:, :, ::-1]
    mean = np.asarray(bench.LOADER_MEAN, np.float32).reshape(3, 1, 1)
    std = np.asarray(bench.LOADER_STD, np.float32).reshape(3, 1, 1)
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
    """Batches from a multiprocessing Pool, bench_harness's LOADER_PREFETCH per worker in flight,
    in order."""

    def __init__(self, context, workers):
        self.pool = context.Pool(workers)
        self.pending = collections.deque()
        self.indices = itertools.count()
        for _ in range(workers * bench.LOADER_PREFETCH):
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


def on_gpu(jax):
    return jax.default_backend() == "gpu"


def precisions(jax):
    """(precision, why not) per precision: fp16 with loss scaling is for GPUs."""
    if on_gpu(jax):
        return [(p, None) for p in bench.PRECISIONS]
    why = "fp16 with loss scaling is for GPUs; this run has only the CPU"
    return [(p, why if p == "fp16" else None) for p in bench.PRECISIONS]


class BenchState:
    """What the sections share: jax, whether it runs on GPUs, the budget, figures to reuse."""

    def __init__(self, jax, budget):
        self.jax = jax
        self.budget = budget
        self.gpu = on_gpu(jax)
        self.conv_fp32 = None  # the throughput section's figure of the conv model in fp32


def measure_training(jax, fn, model, batch, clock, reps):
    """Train ``model`` with ``fn`` on its fixed batch: (samples/s figure or None, last loss)."""
    x, y = model_batch(jax, model, batch)
    training = Training(jax, fn, init_params(jax, model), x, y)
    figure = bench.measure(
        training.step, items_per_step=batch, unit="samples/s", clock=clock,
        sync=training.sync, reps=reps,
    )  # fmt: skip
    return figure, training.loss()


def run_throughput(state, doc, clock):
    """Samples/s per model and precision at DEFAULT_BATCH, under jax.jit."""
    jax, budget = state.jax, state.budget
    part = doc["throughput"]
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
        bench.check_loss(doc["errors"], f"throughput: {name} {precision}", loss)
        if figure is None:
            entry["skipped"] = "the clock ran out before 3 repetitions"
            budget.skip("throughput", f"{name} {precision}", entry["skipped"])
            continue
        log(f"throughput: {name} {precision}: {figure['median']:.0f} samples/s")
        entry.update(batch=batch, mode=part["mode"], **figure)
        if name == "conv" and precision == "fp32":
            state.conv_fp32 = figure


def run_compile(state, doc, clock):
    """Per model: op-by-op against jax.jit, XLA's compilation timed apart."""
    jax, budget = state.jax, state.budget
    part = doc["compile"]
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
            bench.check_loss(doc["errors"], f"compile: {name} jax.jit", loss)
        if entry["compiled"] is None:
            budget.skip("compile", f"{name} compiled")

        reps = items.reps()
        if reps is not None:
            with jax.disable_jit():
                entry["eager"], loss = measure_training(jax, fn, model, batch, clock, reps)
            items.seen(entry["eager"])
            bench.check_loss(doc["errors"], f"compile: {name} op-by-op", loss)
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


def run_batch(state, doc, clock):
    """Per precision, the transformer's samples/s and peak memory per batch size."""
    jax = state.jax
    part = doc["batch"]
    # XLA's allocator keeps no resettable peak: on a GPU the peak is since the start, which the
    # growing batches dominate.
    part["memory"] = (
        "jax device memory_stats peak_bytes_in_use" if state.gpu else "peak RSS (VmHWM)"
    )
    sweeps = [p for p, why in precisions(jax) if why is None]
    for index, precision in enumerate(sweeps):
        sweep = bench.new_sweep(bench.TRANSFORMER["name"], precision)
        part["sweeps"].append(sweep)
        fn = jax.jit(train_step(jax, bench.TRANSFORMER, precision))
        bench.run_sweep(
            sweep,
            # Each sweep an equal part of what is left.
            bench.Clock(clock.left() / (len(sweeps) - index)),
            state.budget,
            functools.partial(measure_point, state, fn, precision, errors=doc["errors"]),
            # Each batch size is a new shape: the point compiles the step before timing it.
            first_setup_s=FIRST_WARMUP_S,
            on_cpu=not state.gpu,
        )
        jax.clear_caches()


def measure_point(state, fn, precision, batch, clock, *, errors):
    """One point of a sweep, ``{"batch", **figure, "peak_bytes"}``, or why the sweep stops at
    ``batch`` (out of GPU memory, out of time)."""
    jax = state.jax
    if not state.gpu:
        bench.reset_peak_rss()
    try:
        figure, loss = measure_training(jax, fn, bench.TRANSFORMER, batch, clock, bench.REPS)
    except Exception as exc:
        if not (state.gpu and is_oom(exc)):
            raise
        log(f"batch: {precision} batch {batch}: {describe_exc(exc)}")
        return f"out of memory at batch {batch}"
    finally:
        gc.collect()
    if figure is None:
        return bench.late_point(batch)
    bench.check_loss(errors, f"batch: {precision} batch {batch}", loss)
    peak = device_peak_bytes(jax.devices()[0]) if state.gpu else bench.peak_rss_bytes()
    return {"batch": batch, **figure, "peak_bytes": peak}


def run_loader(state, doc, clock):
    """Batches/s of a Pool of numpy workers alone per worker count, against the conv step's."""
    jax, budget = state.jax, state.budget
    part = doc["loader"]
    method, context = pool_context()
    part["kind"] = f"multiprocessing.Pool ({method} worker processes, numpy)"
    batch = part["batch"] = bench.DEFAULT_BATCH
    conv = state.conv_fp32
    counts = list(bench.LOADER_WORKERS)
    items = Items(clock, len(counts) + (conv is None))
    if conv is None:  # the throughput section had no time for it: measure it here
        reps = items.reps()
        if reps is not None:
            fn = jax.jit(train_step(jax, bench.CONV, "fp32"))
            conv, _ = measure_training(jax, fn, bench.CONV, batch, clock, reps)
    if conv is not None:
        part["step"] = {"model": "conv", "precision": "fp32", "batch": batch, **bench.per_batch(conv, batch)}  # fmt: skip
    else:
        budget.skip("loader", "the conv step's rate")
    for workers in counts:
        reps = items.reps()
        if reps is None:
            budget.skip("loader", f"{workers} workers")
            continue
        point = {"workers": workers}
        figure = loader_figure(context, workers, point, clock, reps)
        if figure is None:
            budget.skip("loader", f"{workers} workers", "the clock ran out before 3 repetitions")
            continue
        log(f"loader: {workers} workers: {figure['median']:.0f} batches/s")
        point.update(figure)
        part["points"].append(point)


def loader_figure(context, workers, point, clock, reps):
    """Batches/s from ``workers`` Pool workers (0: made in this process), no training; their
    start-up (processes, imports) is the point's ``startup_seconds``, out of the timing."""
    loader = None
    try:
        t0 = time.perf_counter()
        if workers == 0:
            indices = itertools.count()

            def fetch():
                return loader_batch(next(indices))
        else:
            loader = PoolLoader(context, workers)
            fetch = loader.next
            for _ in range(workers * bench.LOADER_PREFETCH):
                fetch()
        point["startup_seconds"] = time.perf_counter() - t0
        group = bench.loader_group(workers)

        def read():
            for _ in range(group):
                fetch()

        return bench.measure(read, items_per_step=group, unit="batches/s", clock=clock, reps=reps)
    finally:
        if loader is not None:
            loader.close()


def make_allreduce(jax, devs, elements):
    """(fn, make, method): jax_smoke's shard_map psum, else its pmap one."""
    try:
        fn, make = jax_smoke.shard_map_allreduce(jax, devs, elements)
        jax.block_until_ready(fn(make(lambda k: 0.0)))
        return fn, make, "shard_map/psum"
    except Exception as exc:
        log(f"shard_map all-reduce failed, trying pmap: {describe_exc(exc)}")
        fn, make = jax_smoke.pmap_allreduce(jax, devs, elements)
        return fn, make, "pmap/psum"


def run_allreduce(state, doc, clock):
    """Seconds, algbw and busbw per message size of a psum over the devices, each sum checked."""
    import jax.numpy as jnp

    jax, budget, gpu = state.jax, state.budget, state.gpu
    part = doc["allreduce"]
    devs = jax.devices()
    world = len(devs)
    part["backend"] = "NCCL (psum over the GPUs)" if gpu else "XLA host devices (psum)"
    part["world_size"] = world
    if not gpu and world < verdicts.CPU_WORLD_SIZE:
        doc["errors"].append(
            f"allreduce: only {world} host device(s) although XLA_FLAGS asks for "
            f"{verdicts.CPU_WORLD_SIZE} ({os.environ.get('XLA_FLAGS', '')!r})"
        )
    expected = world * (world + 1) / 2.0
    items = Items(clock, len(bench.ALLREDUCE_SIZES))
    sums_correct = []
    for nbytes in bench.ALLREDUCE_SIZES:
        reps = items.reps()
        if reps is None:
            budget.skip("allreduce", f"{nbytes} bytes")
            continue
        elements = max(2, nbytes // 4)
        fn, make, method = make_allreduce(jax, devs, elements)
        part.setdefault("method", method)
        out = jax.block_until_ready(fn(make(lambda k: float(k + 1))))
        correct, got = jax_smoke.check_sum(jnp, out, expected)
        del out
        sums_correct.append(correct)
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
    part["correct"] = bool(sums_correct) and all(sums_correct)
    if gpu and doc["versions"].get("nccl") is None:
        doc["versions"]["nccl"] = payload_versions.loaded_nccl_version()


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
    """The devices as the smoke payload reports them, the machine, then XLA's start-up."""
    doc["devices"].extend(jax_smoke.collect_devices(jax))
    doc["machine"] = bench.machine_facts(doc["devices"])
    t0 = time.perf_counter()
    start_xla(jax)
    log(f"XLA start-up: {time.perf_counter() - t0:.2f} s")


def benchmark(run, budget):
    """The bench on this image: versions and devices, then the five measured sections."""
    jax_smoke.force_host_devices()
    jax = run.load("jax")
    if jax is None:
        return
    state = BenchState(jax, budget)
    run.section(
        "versions",
        60,
        lambda doc: jax_smoke.collect_versions(jax, doc["versions"], doc["errors"]),
    )
    run.section("devices", 60, lambda doc: collect_devices(jax, doc))
    bench.run_sections(
        run, budget, state, (run_throughput, run_compile, run_batch, run_loader, run_allreduce)
    )


if __name__ == "__main__":
    bench.main(PAYLOAD, benchmark)
