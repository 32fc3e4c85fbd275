#!/usr/bin/env python3
"""envbuild bench payload for TensorFlow images.

Copied into a container beside smoke_harness.py, bench_harness.py and
tensorflow_smoke.py, and run as ``python3 tensorflow_bench.py``.  It prints one
JSON document (bench_harness.bench_parts()) on stdout and exits 0 when no error
was recorded.  What is measured, and how, is fixed by bench_harness.py; this file
is the TensorFlow part alone:

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
stops needs no TensorFlow and is unit-tested (tests/unit/test_tensorflow_bench.py).
"""

import gc
import math
import time

import bench_harness as bench
import smoke_harness as harness
from smoke_harness import describe_exc, log

PAYLOAD = "tensorflow_bench"
SEED = 1234

DEFAULT_MODE = "tf.function"
COMPILED_MODE = "tf.function(jit_compile=True) (XLA)"
LOADER_KIND = "tf.data (parallel map threads)"
POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}
# Per-channel mean and std of the loader's normalisation (CIFAR-10's).
LOADER_MEAN = (0.4914, 0.4822, 0.4465)
LOADER_STD = (0.2470, 0.2435, 0.2616)
LOADER_IMAGE = 48  # the "decoded" image's side, before the 32x32 crop
# Do not start a model (build + trace + measure) with less than this many seconds on the clock.
MIN_ENTRY_S = 2.5
# A first guess of a batch point's cost besides its steps (building the batch, tracing).
SETUP_GUESS_S = 1.0
# An all-reduce size needs about this long (trace, check, warm-up, MIN_REPS repetitions).
ALLREDUCE_SIZE_S = 1.2


# --------------------------------------------------------------------------
# pure logic (no TensorFlow): when a batch sweep stops


def next_point_seconds(step_s, setup_s):
    """Seconds the next point of a sweep (the batch doubled) should take: its setup (building
    the batch, tracing: about the last one's), a warm-up and a sizing step, and MIN_REPS
    repetitions of at least TARGET_REP_S, with the step time doubled."""
    step = 2.0 * max(0.0, step_s)
    return max(0.0, setup_s) + 2.0 * step + bench.MIN_REPS * max(bench.TARGET_REP_S, step)


def sweep_stop(next_batch, *, peak_bytes, available_bytes, rss_bytes, seconds_left, next_s):
    """Why a batch sweep ends before ``next_batch``, or None to go on.

    Checked in order: BATCH_MAX; on the CPU (``available_bytes`` given), memory: twice the last
    peak would pass CPU_MEMORY_FRACTION of what this process may hold (available + its resident
    memory now); time: the next point would not fit in what is left of the sweep's slice."""
    if next_batch > bench.BATCH_MAX:
        return f"reached the largest batch tried ({bench.BATCH_MAX})"
    if peak_bytes and available_bytes is not None:
        total = available_bytes + (rss_bytes or 0)
        room = bench.CPU_MEMORY_FRACTION * total
        if 2 * peak_bytes > room:
            return (
                f"memory: batch {next_batch} would need about {2 * peak_bytes / 1e9:.1f} GB of "
                f"{room / 1e9:.1f} GB available ({bench.CPU_MEMORY_FRACTION:.0%} of "
                f"{total / 1e9:.1f} GB)"
            )
    if next_s > seconds_left:
        return (
            f"time: batch {next_batch} would need about {next_s:.1f} s, "
            f"{seconds_left:.1f} s left of the sweep's share"
        )
    return None


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


def figure_over(figure, divisor, unit):
    """A figure's samples divided by ``divisor`` (samples/s -> batches/s), its extras kept."""
    scaled = bench.stats([s / divisor for s in figure["samples"]], unit)
    for key in ("steps_per_rep", "warmup_seconds"):
        if key in figure:
            scaled[key] = figure[key]
    return scaled


# --------------------------------------------------------------------------
# the models and their training step


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


# --------------------------------------------------------------------------
# the sections


class Bench:
    """What the sections share: TensorFlow, the budget, the device, the built steps."""

    def __init__(self, tf, budget):
        self.tf = tf
        self.budget = budget
        self.gpus = []
        self.capability = None
        self.device = "/device:CPU:0"
        self.steps = {}  # model -> its fp32 TrainStep at DEFAULT_BATCH, default mode
        self.throughput = {}  # (model, precision) -> figure

    # -- setup, versions, devices, machine

    def setup(self, doc):
        import tensorflow_smoke

        tensorflow_smoke.setup_devices(self.tf, {})
        self.gpus = self.tf.config.list_physical_devices("GPU")
        if self.gpus:
            self.device = "/device:GPU:0"

    def versions(self, doc):
        import tensorflow_smoke

        tensorflow_smoke.collect_versions(self.tf, doc["versions"])

    def devices(self, doc):
        import tensorflow_smoke

        devices = tensorflow_smoke.collect_devices(self.tf)
        for entry in devices:
            if entry.get("kind") == "gpu":
                entry.setdefault("memory_bytes", None)  # TensorFlow does not tell a GPU's size
                entry.setdefault("capability", None)
        doc["devices"].extend(devices)
        gpus = [d for d in devices if d.get("kind") == "gpu"]
        if gpus and gpus[0].get("capability"):
            try:
                self.capability = float(gpus[0]["capability"])
            except ValueError:
                self.capability = None
        machine = bench.cpu_facts()
        if gpus:
            machine["gpus"] = [
                {k: d.get(k) for k in ("name", "memory_bytes", "capability")} for d in gpus
            ]
        doc["machine"] = machine

    def where(self):
        """How the training sections use the devices, for their parts."""
        if self.gpus:
            return f"{self.device} (the first of {len(self.gpus)} GPUs)"
        return (
            f"{self.device} (the first of the {harness.CPU_WORLD_SIZE} logical CPU devices made "
            "for the all-reduce; they share the whole CPU)"
        )

    def unsupported(self, precision):
        """Why this device cannot run ``precision``, or None."""
        if precision == "fp16" and not self.gpus:
            return "fp16 with loss scaling is for GPUs; the CPU has no fast fp16 arithmetic"
        if precision == "bf16" and self.gpus and self.capability and self.capability < 8.0:
            return f"bf16 needs compute capability 8.0 or later; this GPU has {self.capability:g}"
        return None

    def guarded(self, doc, section, what, fn):
        """``fn()``, or None with the error recorded: one model or sweep failing does not stop
        the section's others."""
        try:
            return fn()
        except Exception as exc:
            doc["errors"].append(f"{section}: {what}: {describe_exc(exc)}")
            return None

    def check_loss(self, doc, section, step, what):
        loss = step.last_loss()
        if loss is None or not math.isfinite(loss):
            doc["errors"].append(f"{section}: {what}: the loss is {loss!r}, not finite")
            return False
        return True

    # -- throughput

    def run_throughput(self, doc, seconds):
        part = doc["throughput"]
        t0 = time.perf_counter()
        clock = bench.Clock(seconds)
        part.update(mode=DEFAULT_MODE, batch=bench.DEFAULT_BATCH, device=self.where())
        try:
            with self.tf.device(self.device):
                for model in ("conv", "transformer"):
                    for precision in bench.PRECISIONS:
                        part["results"].append(self._throughput(doc, model, precision, clock))
        finally:
            part["seconds"] = time.perf_counter() - t0

    def _throughput(self, doc, model, precision, clock):
        entry = {"model": model, "precision": precision}
        why = self.unsupported(precision)
        if why:
            entry["unsupported"] = why
            return entry
        what = f"{model} {precision}"
        if clock.left() < MIN_ENTRY_S:
            entry["skipped"] = "no time left in the section's share of the budget"
            self.budget.skip("throughput", what)
            return entry
        try:
            step = TrainStep(self.tf, model, precision).use(bench.DEFAULT_BATCH)
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
        self.check_loss(doc, "throughput", step, what)
        if figure is None:
            entry["skipped"] = "the clock ran out before 3 repetitions"
            self.budget.skip("throughput", what)
            return entry
        if precision == "fp32":
            self.steps[model] = step
        self.throughput[(model, precision)] = figure
        entry.update(batch=bench.DEFAULT_BATCH, mode=DEFAULT_MODE, **figure)
        return entry

    # -- compile

    def run_compile(self, doc, seconds):
        part = doc["compile"]
        t0 = time.perf_counter()
        clock = bench.Clock(seconds)
        part.update(eager_mode=DEFAULT_MODE, compiled_mode=COMPILED_MODE, device=self.where())
        try:
            with self.tf.device(self.device):
                models = ("conv", "transformer")
                for i, model in enumerate(models):
                    # Each model gets an equal part of what is left.
                    share = bench.Clock(clock.left() / (len(models) - i))
                    entry = self.guarded(
                        doc, "compile", model, lambda m=model, c=share: self._compile(doc, m, c)
                    )
                    if entry is not None:
                        part["results"].append(entry)
        finally:
            part["seconds"] = time.perf_counter() - t0

    def _compile(self, doc, model, clock):
        batch = bench.DEFAULT_BATCH
        entry = {
            "model": model, "precision": "fp32", "batch": batch,
            "eager": None, "compiled": None, "compile_seconds": None, "speedup": None,
        }  # fmt: skip
        # The default mode first, on the throughput section's step (already traced) if it ran.
        if clock.left() < MIN_ENTRY_S:
            self.budget.skip("compile", f"{model} {DEFAULT_MODE}")
        else:
            step = self.steps.get(model) or TrainStep(self.tf, model, "fp32").use(batch)
            entry["eager"] = bench.measure(
                step, items_per_step=batch, unit="samples/s", clock=bench.Clock(clock.left() / 2),
                sync=step.sync,
            )  # fmt: skip
            if entry["eager"] is None:
                self.budget.skip("compile", f"{model} {DEFAULT_MODE}", "the clock ran out")
        if clock.left() < MIN_ENTRY_S:
            self.budget.skip("compile", f"{model} {COMPILED_MODE}")
            return entry
        step = TrainStep(self.tf, model, "fp32", jit_compile=True).use(batch)
        t0 = time.perf_counter()
        step()
        step.sync()
        entry["compile_seconds"] = time.perf_counter() - t0
        entry["compiled"] = bench.measure(
            step, items_per_step=batch, unit="samples/s", clock=clock, sync=step.sync
        )
        self.check_loss(doc, "compile", step, f"{model} {COMPILED_MODE}")
        if entry["compiled"] is None:
            self.budget.skip("compile", f"{model} {COMPILED_MODE}", "the clock ran out")
        elif entry["eager"] is not None and entry["eager"]["median"]:
            entry["speedup"] = entry["compiled"]["median"] / entry["eager"]["median"]
        return entry

    # -- batch sweep

    def run_batch(self, doc, seconds):
        part = doc["batch"]
        t0 = time.perf_counter()
        clock = bench.Clock(seconds)
        part.update(
            memory="tf.config.experimental.get_memory_info peak" if self.gpus
            else "peak RSS (VmHWM)",
            device=self.where(),
        )  # fmt: skip
        try:
            with self.tf.device(self.device):
                precisions = [p for p in bench.PRECISIONS if not self.unsupported(p)]
                for i, precision in enumerate(precisions):
                    share = bench.Clock(clock.left() / (len(precisions) - i))
                    sweep = self.guarded(
                        doc, "batch", f"transformer {precision}",
                        lambda p=precision, c=share: self._sweep(doc, p, c),
                    )  # fmt: skip
                    if sweep is not None:
                        part["sweeps"].append(sweep)
        finally:
            part["seconds"] = time.perf_counter() - t0

    def _peak_reset(self):
        if self.gpus:
            self.tf.config.experimental.reset_memory_stats("GPU:0")
        else:
            bench.reset_peak_rss()

    def _peak(self):
        if self.gpus:
            return int(self.tf.config.experimental.get_memory_info("GPU:0")["peak"])
        return bench.peak_rss_bytes()

    def _sweep(self, doc, precision, clock):
        tf = self.tf
        sweep = {
            "model": "transformer", "precision": precision, "points": [],
            "largest_fit": None, "largest_fit_peak_bytes": None, "stopped": None,
        }  # fmt: skip
        step = None
        batch = bench.BATCH_START
        next_s = next_point_seconds(0.0, SETUP_GUESS_S)
        peak = None
        try:
            while True:
                stop = sweep_stop(
                    batch,
                    peak_bytes=peak,
                    available_bytes=None if self.gpus else bench.available_memory_bytes(),
                    rss_bytes=None if self.gpus else bench.rss_bytes(),
                    seconds_left=clock.left(),
                    next_s=next_s,
                )
                if stop:
                    sweep["stopped"] = stop
                    if stop.startswith("time"):
                        self.budget.skip(
                            "batch", f"transformer {precision} from batch {batch}", stop
                        )
                    break
                t0 = time.perf_counter()
                try:
                    if step is None:
                        step = TrainStep(tf, "transformer", precision)
                    self._peak_reset()
                    before = None if self.gpus else bench.rss_bytes()
                    step.use(batch)
                    figure = bench.measure(
                        step, items_per_step=batch, unit="samples/s", clock=clock,
                        sync=step.sync,
                    )  # fmt: skip
                    peak = self._peak()
                except tf.errors.ResourceExhaustedError:
                    step = None
                    gc.collect()
                    sweep["stopped"] = f"out of memory at batch {batch}"
                    break
                if not self.check_loss(doc, "batch", step, f"transformer {precision} {batch}"):
                    sweep["stopped"] = f"the loss is not finite at batch {batch}"
                    break
                if figure is None:
                    sweep["stopped"] = f"time: batch {batch} did not finish 3 repetitions"
                    self.budget.skip("batch", f"transformer {precision} from batch {batch}")
                    break
                point = {"batch": batch, **figure, "peak_bytes": peak}
                if before is not None:
                    # The peak counts what TensorFlow's allocator kept from earlier steps.
                    point["resident_before_bytes"] = before
                sweep["points"].append(point)
                sweep["largest_fit"] = batch
                sweep["largest_fit_peak_bytes"] = peak
                step_s = batch / figure["median"]
                setup_s = max(0.0, (time.perf_counter() - t0) - sum(
                    figure["steps_per_rep"] * batch / s for s in figure["samples"]
                ) - 2 * step_s)  # fmt: skip
                next_s = next_point_seconds(step_s, setup_s)
                batch *= 2
        finally:
            if step is not None:
                step.x = step.y = None
            step = None
            gc.collect()
        return sweep

    # -- loader

    def dataset(self, workers):
        """The loader: per sample, a seeded "decoded" uint8 image, a random crop, a random flip,
        to float32, normalised; batched.  ``workers`` parallel map threads (0: sequential)."""
        tf = self.tf
        side = LOADER_IMAGE
        channels, height, width = bench.CONV["input"]
        mean = tf.constant(LOADER_MEAN, tf.float32)
        std = tf.constant(LOADER_STD, tf.float32)

        def sample(index):
            # HWC, as TensorFlow's image ops want; the spec's 3x48x48 with channels last.
            image = tf.cast(
                tf.random.stateless_uniform(
                    (side, side, channels), seed=tf.stack([index, SEED]), maxval=256,
                    dtype=tf.int32,
                ),
                tf.uint8,
            )  # fmt: skip
            image = tf.image.stateless_random_crop(
                image, (height, width, channels), seed=tf.stack([index, 1])
            )
            image = tf.image.stateless_random_flip_left_right(image, seed=tf.stack([index, 2]))
            x = (tf.cast(image, tf.float32) / 255.0 - mean) / std
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

    def run_loader(self, doc, seconds):
        part = doc["loader"]
        t0 = time.perf_counter()
        clock = bench.Clock(seconds)
        batch = bench.DEFAULT_BATCH
        part.update(kind=LOADER_KIND, batch=batch)
        try:
            figure = self.throughput.get(("conv", "fp32"))
            if figure is None and clock.left() >= MIN_ENTRY_S:
                with self.tf.device(self.device):
                    step = self.steps.get("conv") or TrainStep(self.tf, "conv", "fp32").use(batch)
                    figure = bench.measure(
                        step, items_per_step=batch, unit="samples/s",
                        clock=bench.Clock(clock.left() / (len(bench.LOADER_WORKERS) + 1)),
                        sync=step.sync,
                    )  # fmt: skip
            if figure is None:
                self.budget.skip("loader", "the conv step's consumption rate")
            else:
                part["step"] = {
                    "model": "conv", "precision": "fp32", "batch": batch,
                    **figure_over(figure, batch, "batches/s"),
                }  # fmt: skip
            for i, workers in enumerate(bench.LOADER_WORKERS):
                share = bench.Clock(clock.left() / (len(bench.LOADER_WORKERS) - i))
                if share.left() < 1.0:
                    self.budget.skip("loader", f"{workers} workers")
                    continue
                iterator = iter(self.dataset(workers))
                point = bench.measure(
                    lambda it=iterator: next(it), items_per_step=1, unit="batches/s", clock=share
                )
                del iterator
                if point is None:
                    self.budget.skip("loader", f"{workers} workers", "the clock ran out")
                    continue
                part["points"].append({"workers": workers, **point})
        finally:
            part["seconds"] = time.perf_counter() - t0

    # -- all-reduce

    def run_allreduce(self, doc, seconds):
        part = doc["allreduce"]
        t0 = time.perf_counter()
        try:
            self._allreduce(doc, part, bench.Clock(seconds))
        finally:
            part["seconds"] = time.perf_counter() - t0

    def _allreduce(self, doc, part, clock):
        tf = self.tf
        gpus = tf.config.list_logical_devices("GPU")
        if gpus:
            devices = [d.name for d in gpus]
            ops = tf.distribute.NcclAllReduce()
            part["backend"] = "MirroredStrategy (NcclAllReduce over the GPUs)"
        else:
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
            devices = devices[: harness.CPU_WORLD_SIZE]
            if len(devices) < harness.CPU_WORLD_SIZE:
                raise RuntimeError(
                    f"need {harness.CPU_WORLD_SIZE} logical CPU devices for the all-reduce, "
                    f"TensorFlow has {len(devices)} (setup failed?)"
                )
            ops = tf.distribute.ReductionToOneDevice()
            part["backend"] = (
                f"MirroredStrategy (ReductionToOneDevice over {len(devices)} logical CPU devices)"
            )
        strategy = tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=ops)
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
                self.budget.skip("allreduce", f"{nbytes} B")
                continue
            share = clock.left() / len([j for j in chosen if j >= i])
            if share < ALLREDUCE_SIZE_S / 2:
                self.budget.skip("allreduce", f"{nbytes} B")
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
            state = {"buf": per_replica(elements, lambda ctx: 0.0)}

            def once(state=state):
                state["buf"] = allreduce(state["buf"])

            def sync(state=state):
                for t in local(state["buf"]):
                    t[:1].numpy()

            reps = bench.REPS if share >= (bench.REPS + 3) * bench.TARGET_REP_S else bench.MIN_REPS
            figure = bench.measure(
                once, items_per_step=1, unit="calls/s", clock=bench.Clock(share), sync=sync,
                reps=reps,
            )  # fmt: skip
            del state
            if figure is None:
                self.budget.skip("allreduce", f"{nbytes} B", "the clock ran out")
                continue
            seconds = 1.0 / figure["median"]
            algbw = elements * 4 / seconds / 1e9
            point = {
                "bytes": elements * 4,
                "iterations": figure["steps_per_rep"] * len(figure["samples"]),
                "seconds": seconds,
                "algbw_gbps": algbw,
                "busbw_gbps": bench.busbw(algbw, world),
                "busbw": bench.stats(
                    [bench.busbw(elements * 4 * s / 1e9, world) for s in figure["samples"]],
                    "GB/s",
                ),
            }
            if world == 1:
                point["note"] = "one rank: no communication"
            part["points"].append(point)
        part["correct"] = correct


# --------------------------------------------------------------------------


def main():
    errors = []
    budget = bench.Budget.from_env(errors)

    def body(run):
        run.errors.extend(errors)
        try:
            tf = run.load("tensorflow")
            if tf is None:
                return
            b = Bench(tf, budget)
            # A failed setup is recorded; training still runs (the all-reduce then says why not).
            run.section("setup", 60, b.setup)
            run.section("versions", 60, b.versions)
            run.section("devices", 60, b.devices)
            sections = (
                ("throughput", b.run_throughput),
                ("compile", b.run_compile),
                ("batch", b.run_batch),
                ("loader", b.run_loader),
                ("allreduce", b.run_allreduce),
            )
            for name, fn in sections:
                share = budget.share(name)
                log(f"{name}: {share:.1f} s of the budget")
                run.section(
                    name,
                    share + bench.SECTION_GRACE_S,
                    lambda doc, fn=fn, share=share: fn(doc, share),
                )
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
