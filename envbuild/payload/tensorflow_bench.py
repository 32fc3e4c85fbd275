#!/usr/bin/env python3
"""envbuild bench payload for TensorFlow images.

Copied into a container with the other payload modules and run as ``python3
tensorflow_bench.py``: ``benchmark(run, budget)`` runs under bench_harness.main,
which prints one JSON document (bench_harness.bench_parts()) on stdout and exits 0
when no error was recorded.  What is measured, and how, is fixed by
bench_harness.py; this file is the TensorFlow part alone:

  * setup       -- before TensorFlow initializes its devices (tensorflow_smoke's
                   setup): GPU memory growth, or two logical CPU devices on a
                   GPU-less host for the all-reduce.  Training runs on the first
                   device only;
  * throughput  -- a hand-written training step (GradientTape + Keras SGD) in a
                   tf.function, per model and precision: fp32; bf16 = Keras's
                   mixed_bfloat16 policy (bf16 compute, fp32 variables); fp16 =
                   mixed_float16 with a LossScaleOptimizer (GPUs only);
  * compile     -- the same step as tf.function against tf.function(jit_compile=True);
  * batch       -- the transformer's throughput and peak memory against batch size;
  * loader      -- a tf.data pipeline of decoded-image augmentations per parallel map
                   thread count, against the conv step's consumption rate;
  * allreduce   -- MirroredStrategy over every GPU (NcclAllReduce) or two logical
                   CPU devices (ReductionToOneDevice), 8 B to 256 MiB.

Every section works within its share of ENVBUILD_BENCH_BUDGET_S and records in
``skipped`` what it had no time for.  The logic that decides when a batch sweep
stops is bench_harness's, alike for every framework; which all-reduce sizes a short
budget measures needs no TensorFlow and is unit-tested
(tests/unit/test_tensorflow_bench.py).
"""

import functools
import gc
import time

import bench_harness as bench
import smoke_verdicts as verdicts
import tensorflow_smoke
from smoke_harness import describe_exc

PAYLOAD = "tensorflow_bench"
SEED = 1234

DEFAULT_MODE = "tf.function"
COMPILED_MODE = "tf.function(jit_compile=True) (XLA)"
LOADER_KIND = "tf.data (parallel map threads)"
POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
# Do not start a model (build + trace + measure) with less than this many seconds on the clock.
MIN_ENTRY_S = 2.5
# A first guess of a batch point's cost besides its steps (building the batch, tracing).
SETUP_GUESS_S = 1.0
# An all-reduce size needs about this long (trace, check, warm-up, MIN_REPS repetitions).
ALLREDUCE_SIZE_S = 1.2


def spread_pick(count, fit):
    """Indices of ``fit`` of ``count`` items spread evenly from the first to the last (all of
    them when they fit, only the last when one does): the all-reduce sizes a short budget
    measures, so that the curve still spans small to large messages."""
    if fit >= count:
        return list(range(count))
    if fit <= 0:
        return []
    if fit == 1:
        return [count - 1]
    return sorted({round(i * (count - 1) / (fit - 1)) for i in range(fit)})


def build_model(keras, name, dtype):
    """bench_harness's CONV or TRANSFORMER as a Keras model under the dtype policy ``dtype``."""
    layers = keras.layers
    if name == "conv":
        spec = bench.CONV
        channels, height, width = spec["input"]
        # NHWC: TensorFlow's CPU convolutions want channels last; the sizes are the spec's
        # NCHW 3x32x32 with the channels moved to the end.
        inputs = keras.Input(shape=(height, width, channels))
        x = inputs
        for i, filters in enumerate(spec["channels"]):
            x = layers.Conv2D(
                filters, 3, strides=1 if i == 0 else 2, padding="same", activation="relu",
                dtype=dtype,
            )(x)  # fmt: skip
        x = layers.GlobalAveragePooling2D(dtype=dtype)(x)
        logits = layers.Dense(spec["classes"], dtype=dtype)(x)
        return keras.Model(inputs, logits, name="conv")
    spec = bench.TRANSFORMER
    width, heads = spec["width"], spec["heads"]
    inputs = keras.Input(shape=(spec["sequence"], width))
    h = layers.LayerNormalization(dtype=dtype)(inputs)
    h = layers.MultiHeadAttention(num_heads=heads, key_dim=width // heads, dtype=dtype)(h, h)
    x = layers.Add(dtype=dtype)([inputs, h])
    h = layers.LayerNormalization(dtype=dtype)(x)
    h = layers.Dense(spec["ffn"], activation="gelu", dtype=dtype)(h)  # exact (erf) GELU
    h = layers.Dense(width, dtype=dtype)(h)
    x = layers.Add(dtype=dtype)([x, h])
    x = layers.GlobalAveragePooling1D(dtype=dtype)(x)  # mean over the sequence
    logits = layers.Dense(spec["classes"], dtype=dtype)(x)
    return keras.Model(inputs, logits, name="transformer")


def fixed_batch(tf, name, batch):
    """The one fixed random batch (inputs, integer labels) of ``batch`` samples."""
    if name == "conv":
        channels, height, width = bench.CONV["input"]
        shape = (batch, height, width, channels)  # NHWC, as build_model
        classes = bench.CONV["classes"]
    else:
        shape = (batch, bench.TRANSFORMER["sequence"], bench.TRANSFORMER["width"])
        classes = bench.TRANSFORMER["classes"]
    x = tf.random.stateless_normal(shape, seed=(SEED, 1))
    y = tf.random.stateless_uniform((batch,), seed=(SEED, 2), maxval=classes, dtype=tf.int32)
    return x, y


class TrainStep:
    """One model, its optimizer and its training step; ``__call__`` runs a step on the model's
    fixed batch (``use(batch)`` makes another), ``sync`` waits for it."""

    def __init__(self, tf, name, precision, *, jit_compile=False):
        keras = tf.keras
        self.tf = tf
        self.name = name
        keras.utils.set_random_seed(SEED)
        self.model = build_model(keras, name, POLICIES[precision])
        optimizer = keras.optimizers.SGD(learning_rate=bench.LEARNING_RATE)
        scaled = precision == "fp16"
        if scaled:
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
        optimizer.build(self.model.trainable_variables)
        self.optimizer = optimizer
        model = self.model
        variables = model.trainable_variables

        def step(x, y):
            with tf.GradientTape() as tape:
                logits = tf.cast(model(x, training=True), tf.float32)
                loss = tf.reduce_mean(
                    tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
                )
                target = optimizer.scale_loss(loss) if scaled else loss
            grads = tape.gradient(target, variables)
            optimizer.apply(grads, variables)  # a LossScaleOptimizer unscales them first
            return loss

        self.fn = tf.function(step, jit_compile=jit_compile)
        self.batch = None
        self.x = self.y = self.loss = None

    def use(self, batch):
        self.x = self.y = None
        self.x, self.y = fixed_batch(self.tf, self.name, batch)
        self.batch = batch
        return self

    def __call__(self):
        self.loss = self.fn(self.x, self.y)

    def sync(self):
        if self.loss is not None:
            self.loss.numpy()

    def last_loss(self):
        return None if self.loss is None else float(self.loss.numpy())


class BenchState:
    """What the sections share: TensorFlow, the budget, the device, the built steps."""

    def __init__(self, tf, budget):
        self.tf = tf
        self.budget = budget
        self.gpus = []
        self.capability = None
        self.device = "/device:CPU:0"
        self.steps = {}  # model -> its fp32 TrainStep at DEFAULT_BATCH, default mode
        self.throughput = {}  # (model, precision) -> figure

    def where(self):
        """How the training sections use the devices, for their parts."""
        if self.gpus:
            return f"{self.device} (the first of {len(self.gpus)} GPUs)"
        return (
            f"{self.device} (the first of the {verdicts.CPU_WORLD_SIZE} logical CPU devices "
            "made for the all-reduce; they share the whole CPU)"
        )

    def unsupported(self, precision):
        """Why this device cannot run ``precision``, or None."""
        if precision == "fp16" and not self.gpus:
            return "fp16 with loss scaling is for GPUs; the CPU has no fast fp16 arithmetic"
        if precision == "bf16" and self.gpus and self.capability and self.capability < 8.0:
            return f"bf16 needs compute capability 8.0 or later; this GPU has {self.capability:g}"
        return None

    def reset_peak(self):
        """Start the peak memory of the next steps from now."""
        if self.gpus:
            self.tf.config.experimental.reset_memory_stats("GPU:0")
        else:
            bench.reset_peak_rss()

    def peak(self):
        """The peak memory since ``reset_peak``: the GPU's, or this process's resident set."""
        if self.gpus:
            return int(self.tf.config.experimental.get_memory_info("GPU:0")["peak"])
        return bench.peak_rss_bytes()


def guarded(doc, section, what, fn):
    """``fn()``, or None with the error recorded: one model or sweep failing does not stop the
    section's others."""
    try:
        return fn()
    except Exception as exc:
        doc["errors"].append(f"{section}: {what}: {describe_exc(exc)}")
        return None


def run_setup(state, doc):
    """Before TensorFlow initializes its devices: tensorflow_smoke's setup, then the device."""
    tensorflow_smoke.setup_devices(state.tf, {})
    state.gpus = state.tf.config.list_physical_devices("GPU")
    if state.gpus:
        state.device = "/device:GPU:0"


def run_devices(state, doc):
    """The devices as the smoke payload reports them, the first GPU's capability, the machine."""
    devices = tensorflow_smoke.collect_devices(state.tf)
    for entry in devices:
        if entry.get("kind") == "gpu":
            entry.setdefault("memory_bytes", None)  # TensorFlow does not tell a GPU's size
            entry.setdefault("capability", None)
    doc["devices"].extend(devices)
    gpus = [d for d in devices if d.get("kind") == "gpu"]
    if gpus and gpus[0].get("capability"):
        try:
            state.capability = float(gpus[0]["capability"])
        except ValueError:
            state.capability = None
    doc["machine"] = bench.machine_facts(devices)


def run_throughput(state, doc, clock):
    """Samples/s per model and precision at DEFAULT_BATCH, in a tf.function."""
    part = doc["throughput"]
    part.update(mode=DEFAULT_MODE, batch=bench.DEFAULT_BATCH, device=state.where())
    with state.tf.device(state.device):
        for model in ("conv", "transformer"):
            for precision in bench.PRECISIONS:
                part["results"].append(throughput_entry(state, doc, model, precision, clock))


def throughput_entry(state, doc, model, precision, clock):
    """The throughput section's result for ``model`` at ``precision``."""
    entry = {"model": model, "precision": precision}
    why = state.unsupported(precision)
    if why:
        entry["unsupported"] = why
        return entry
    what = f"{model} {precision}"
    if clock.left() < MIN_ENTRY_S:
        entry["skipped"] = "no time left in the section's share of the budget"
        state.budget.skip("throughput", what)
        return entry
    try:
        step = TrainStep(state.tf, model, precision).use(bench.DEFAULT_BATCH)
        figure = bench.measure(
            step,
            items_per_step=bench.DEFAULT_BATCH,
            unit="samples/s",
            clock=clock,
            sync=step.sync,
        )
    except Exception as exc:
        doc["errors"].append(f"throughput: {what}: {describe_exc(exc)}")
        entry["error"] = describe_exc(exc)
        return entry
    bench.check_loss(doc["errors"], f"throughput: {what}", step.last_loss())
    if figure is None:
        entry["skipped"] = "the clock ran out before 3 repetitions"
        state.budget.skip("throughput", what)
        return entry
    if precision == "fp32":
        state.steps[model] = step
    state.throughput[(model, precision)] = figure
    entry.update(batch=bench.DEFAULT_BATCH, mode=DEFAULT_MODE, **figure)
    return entry


def run_compile(state, doc, clock):
    """Per model: tf.function against tf.function(jit_compile=True), compile time apart."""
    part = doc["compile"]
    part.update(eager_mode=DEFAULT_MODE, compiled_mode=COMPILED_MODE, device=state.where())
    with state.tf.device(state.device):
        models = ("conv", "transformer")
        for i, model in enumerate(models):
            # Each model gets an equal part of what is left.
            share = bench.Clock(clock.left() / (len(models) - i))
            entry = guarded(
                doc, "compile", model, lambda m=model, c=share: compile_entry(state, doc, m, c)
            )
            if entry is not None:
                part["results"].append(entry)


def compile_entry(state, doc, model, clock):
    """The compile section's result for ``model``: the default mode, then XLA."""
    batch = bench.DEFAULT_BATCH
    entry = {
        "model": model, "precision": "fp32", "batch": batch,
        "eager": None, "compiled": None, "compile_seconds": None, "speedup": None,
    }  # fmt: skip
    # The default mode first, on the throughput section's step (already traced) if it ran.
    if clock.left() < MIN_ENTRY_S:
        state.budget.skip("compile", f"{model} {DEFAULT_MODE}")
    else:
        step = state.steps.get(model) or TrainStep(state.tf, model, "fp32").use(batch)
        entry["eager"] = bench.measure(
            step, items_per_step=batch, unit="samples/s", clock=bench.Clock(clock.left() / 2),
            sync=step.sync,
        )  # fmt: skip
        if entry["eager"] is None:
            state.budget.skip("compile", f"{model} {DEFAULT_MODE}", "the clock ran out")
    if clock.left() < MIN_ENTRY_S:
        state.budget.skip("compile", f"{model} {COMPILED_MODE}")
        return entry
    step = TrainStep(state.tf, model, "fp32", jit_compile=True).use(batch)
    t0 = time.perf_counter()
    step()
    step.sync()
    entry["compile_seconds"] = time.perf_counter() - t0
    entry["compiled"] = bench.measure(
        step, items_per_step=batch, unit="samples/s", clock=clock, sync=step.sync
    )
    bench.check_loss(doc["errors"], f"compile: {model} {COMPILED_MODE}", step.last_loss())
    if entry["compiled"] is None:
        state.budget.skip("compile", f"{model} {COMPILED_MODE}", "the clock ran out")
    elif entry["eager"] is not None and entry["eager"]["median"]:
        entry["speedup"] = entry["compiled"]["median"] / entry["eager"]["median"]
    return entry


def run_batch(state, doc, clock):
    """Per precision, the transformer's samples/s and peak memory per batch size."""
    part = doc["batch"]
    part.update(
        memory="tf.config.experimental.get_memory_info peak" if state.gpus
        else "peak RSS (VmHWM)",
        device=state.where(),
    )  # fmt: skip
    with state.tf.device(state.device):
        precisions = [p for p in bench.PRECISIONS if not state.unsupported(p)]
        for i, precision in enumerate(precisions):
            share = bench.Clock(clock.left() / (len(precisions) - i))
            sweep = guarded(
                doc, "batch", f"transformer {precision}",
                lambda p=precision, c=share: sweep_precision(state, p, c, doc["errors"]),
            )  # fmt: skip
            if sweep is not None:
                part["sweeps"].append(sweep)


def sweep_precision(state, precision, clock, errors):
    """The transformer's sweep at ``precision``, on one TrainStep made at its first point."""
    sweep = bench.new_sweep("transformer", precision)
    made = {}  # "step": the sweep's TrainStep, once made
    try:
        bench.run_sweep(
            sweep,
            clock,
            state.budget,
            functools.partial(measure_point, state, made, precision, errors=errors),
            first_setup_s=SETUP_GUESS_S,
            on_cpu=not state.gpus,
        )
    finally:
        step = made.pop("step", None)
        if step is not None:
            step.x = step.y = None
        del step  # before the collection: nothing of the sweep's model may survive it
        gc.collect()
    return sweep


def measure_point(state, made, precision, batch, clock, *, errors):
    """One point of a sweep, ``{"batch", **figure, "peak_bytes"}``, or why the sweep stops at
    ``batch`` (out of memory, a loss that is not finite, out of time)."""
    step = None
    try:
        if "step" not in made:
            made["step"] = TrainStep(state.tf, "transformer", precision)
        step = made["step"]
        state.reset_peak()
        before = None if state.gpus else bench.rss_bytes()
        step.use(batch)
        figure = bench.measure(
            step, items_per_step=batch, unit="samples/s", clock=clock, sync=step.sync
        )
        peak = state.peak()
    except state.tf.errors.ResourceExhaustedError:
        made.clear()
        step = None
        gc.collect()
        return f"out of memory at batch {batch}"
    if not bench.check_loss(errors, f"batch: transformer {precision} {batch}", step.last_loss()):
        return f"the loss is not finite at batch {batch}"
    if figure is None:
        return bench.late_point(batch)
    point = {"batch": batch, **figure, "peak_bytes": peak}
    if before is not None:
        # The peak counts what TensorFlow's allocator kept from earlier steps.
        point["resident_before_bytes"] = before
    return point


def loader_dataset(tf, workers):
    """The loader, bench_harness's per-sample work: a seeded "decoded" uint8 image, a random
    crop, a random flip, to float32, normalised; batched.  ``workers`` parallel map threads
    (0: sequential)."""
    side, crop_side = bench.LOADER_IMAGE_SIDE, bench.LOADER_CROP_SIDE
    channels = bench.CONV["input"][0]
    mean = tf.constant(bench.LOADER_MEAN, tf.float32)
    std = tf.constant(bench.LOADER_STD, tf.float32)

    def sample(index):
        # HWC, as TensorFlow's image ops want: the channels last.
        image = tf.cast(
            tf.random.stateless_uniform(
                (side, side, channels), seed=tf.stack([index, SEED]), maxval=256,
                dtype=tf.int32,
            ),
            tf.uint8,
        )  # fmt: skip
        image = tf.image.stateless_random_crop(
            image, (crop_side, crop_side, channels), seed=tf.stack([index, 1])
        )
        image = tf.image.stateless_random_flip_left_right(image, seed=tf.stack([index, 2]))
        x = (tf.cast(image, tf.float32) - mean) / std
        return x, tf.cast(index % bench.CONV["classes"], tf.int32)

    data = tf.data.Dataset.range(2**40)
    if workers:
        data = data.map(sample, num_parallel_calls=workers, deterministic=True)
    else:
        data = data.map(sample)
    # No prefetch: alone, the loader gains nothing from one, and a prefetched batch would
    # make measure() size its repetitions from a call that did not wait for any work.
    data = data.batch(bench.DEFAULT_BATCH)
    options = tf.data.Options()
    options.threading.private_threadpool_size = max(1, workers)
    options.autotune.enabled = False
    return data.with_options(options)


def run_loader(state, doc, clock):
    """tf.data batches/s alone per parallel map thread count, against the conv step's rate."""
    part = doc["loader"]
    batch = bench.DEFAULT_BATCH
    part.update(kind=LOADER_KIND, batch=batch)
    figure = state.throughput.get(("conv", "fp32"))
    if figure is None and clock.left() >= MIN_ENTRY_S:
        with state.tf.device(state.device):
            step = state.steps.get("conv") or TrainStep(state.tf, "conv", "fp32").use(batch)
            figure = bench.measure(
                step, items_per_step=batch, unit="samples/s",
                clock=bench.Clock(clock.left() / (len(bench.LOADER_WORKERS) + 1)),
                sync=step.sync,
            )  # fmt: skip
    if figure is None:
        state.budget.skip("loader", "the conv step's consumption rate")
    else:
        part["step"] = {
            "model": "conv", "precision": "fp32", "batch": batch,
            **bench.per_batch(figure, batch),
        }  # fmt: skip
    for i, workers in enumerate(bench.LOADER_WORKERS):
        share = bench.Clock(clock.left() / (len(bench.LOADER_WORKERS) - i))
        if share.left() < 1.0:
            state.budget.skip("loader", f"{workers} workers")
            continue
        batches = iter(loader_dataset(state.tf, workers))
        group = bench.loader_group(workers, prefetch=0)  # the pipeline prefetches nothing

        def read(batches=batches, group=group):
            for _ in range(group):
                next(batches)

        point = bench.measure(read, items_per_step=group, unit="batches/s", clock=share)
        del batches, read
        if point is None:
            state.budget.skip("loader", f"{workers} workers", "the clock ran out")
            continue
        part["points"].append({"workers": workers, **point})


def allreduce_strategy(tf, part):
    """A MirroredStrategy over every GPU (NCCL), else over CPU_WORLD_SIZE logical CPU devices;
    its backend recorded in ``part``."""
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        devices = [d.name for d in gpus]
        ops = tf.distribute.NcclAllReduce()
        part["backend"] = "MirroredStrategy (NcclAllReduce over the GPUs)"
    else:
        world = verdicts.CPU_WORLD_SIZE
        devices = [d.name for d in tf.config.list_logical_devices("CPU")][:world]
        if len(devices) < world:
            raise RuntimeError(
                f"need {world} logical CPU devices for the all-reduce, "
                f"TensorFlow has {len(devices)} (setup failed?)"
            )
        ops = tf.distribute.ReductionToOneDevice()
        part["backend"] = (
            f"MirroredStrategy (ReductionToOneDevice over {len(devices)} logical CPU devices)"
        )
    return tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=ops)


def run_allreduce(state, doc, clock):
    """Seconds, algbw and busbw per message size over the strategy's replicas, each sum checked;
    a short budget measures sizes spread from the smallest to the largest."""
    tf = state.tf
    part = doc["allreduce"]
    strategy = allreduce_strategy(tf, part)
    world = int(strategy.num_replicas_in_sync)
    part["world_size"] = world
    expected = world * (world + 1) / 2.0

    def per_replica(elements, fill):
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.fill([elements], tf.constant(fill(ctx), tf.float32))
        )

    # One trace serves every size (the shape is left unknown after the first retrace).
    @tf.function(reduce_retracing=True)
    def allreduce(values):
        def replica_fn(v):
            return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, v)

        return strategy.run(replica_fn, args=(values,))

    def local(values):
        return list(strategy.experimental_local_results(values))

    correct = None
    sizes = bench.ALLREDUCE_SIZES
    chosen = spread_pick(len(sizes), int(clock.left() / ALLREDUCE_SIZE_S))
    for i, nbytes in enumerate(sizes):
        if i not in chosen:
            state.budget.skip("allreduce", f"{nbytes} B")
            continue
        share = clock.left() / len([j for j in chosen if j >= i])
        if share < ALLREDUCE_SIZE_S / 2:
            state.budget.skip("allreduce", f"{nbytes} B")
            continue
        elements = max(2, nbytes // 4)
        ones = per_replica(elements, lambda ctx: float(ctx.replica_id_in_sync_group + 1))
        results = local(allreduce(ones))
        ok = len(results) == world and all(
            bool(tf.reduce_all(tf.equal(t, expected)).numpy()) for t in results
        )
        del ones, results
        correct = ok and correct is not False
        if not ok:
            doc["errors"].append(
                f"allreduce: wrong result at {elements * 4} B: expected {expected:g} everywhere"
            )
        # Bandwidth: each call consumes the previous result (zeros cannot overflow), so the
        # last one being ready means that all of them are.
        buf = {"values": per_replica(elements, lambda ctx: 0.0)}

        def once(buf=buf):
            buf["values"] = allreduce(buf["values"])

        def sync(buf=buf):
            for t in local(buf["values"]):
                t[:1].numpy()

        reps = bench.REPS if share >= (bench.REPS + 3) * bench.TARGET_REP_S else bench.MIN_REPS
        figure = bench.measure(
            once, items_per_step=1, unit="calls/s", clock=bench.Clock(share), sync=sync,
            reps=reps,
        )  # fmt: skip
        del buf
        if figure is None:
            state.budget.skip("allreduce", f"{nbytes} B", "the clock ran out")
            continue
        part["points"].append(allreduce_point(elements * 4, world, figure))
    part["correct"] = correct


def allreduce_point(nbytes, world, figure):
    """A point of the all-reduce curve from ``figure``, all-reduces per second."""
    seconds = 1.0 / figure["median"]
    algbw = nbytes / seconds / 1e9
    point = {
        "bytes": nbytes,
        "iterations": figure["steps_per_rep"] * len(figure["samples"]),
        "seconds": seconds,
        "algbw_gbps": algbw,
        "busbw_gbps": bench.busbw(algbw, world),
        "busbw": bench.stats(
            [bench.busbw(nbytes * s / 1e9, world) for s in figure["samples"]], "GB/s"
        ),
    }
    if world == 1:
        point["note"] = bench.ONE_RANK_NOTE
    return point


def benchmark(run, budget):
    """The bench on this image: setup, versions and devices, then the five measured sections."""
    tf = run.load("tensorflow")
    if tf is None:
        return
    state = BenchState(tf, budget)
    # A failed setup is recorded; training still runs (the all-reduce then says why not).
    run.section("setup", 60, lambda doc: run_setup(state, doc))
    run.section("versions", 60, lambda doc: tensorflow_smoke.collect_versions(tf, doc["versions"]))
    run.section("devices", 60, lambda doc: run_devices(state, doc))
    bench.run_sections(
        run, budget, state, (run_throughput, run_compile, run_batch, run_loader, run_allreduce)
    )


if __name__ == "__main__":
    bench.main(PAYLOAD, benchmark)
