#!/usr/bin/env python3
"""envbuild smoke payload for TensorFlow images.

Copied into a container with the other payload modules and run as ``python3
tensorflow_smoke.py``. The harness (smoke_harness.py) prints exactly one JSON document on
stdout (all other output, including anything TensorFlow, Keras or NCCL write to fd 1, is
diverted to stderr), in the same shape for every framework, and exits 0 when every check
passed, 1 otherwise; this file is the TensorFlow part alone.

Sections:
  * setup               -- before TensorFlow initializes its devices: GPU
                           memory growth, or two logical CPU devices on a
                           GPU-less host (for the all-reduce);
  * versions / devices  -- what the image and the machine provide;
  * train               -- ~20 optimizer steps of a tiny Keras MLP on a fixed
                           batch (mixed_float16 policy on GPU, float32 on
                           CPU); the loss has to fall;
  * allreduce           -- tf.distribute.MirroredStrategy over every GPU
                           (NcclAllReduce), or over two logical CPU devices
                           (ReductionToOneDevice); SUM of (replica+1) must
                           equal n(n+1)/2 everywhere; bandwidth is measured
                           as in nccl-tests.

Only the standard library, the sibling payload modules (smoke_verdicts.py
judges what the sections measured) and tensorflow are used.  Every
section runs under the harness's deadline: a section that hangs is reported
and the payload still prints its report and exits.

Knob: ENVBUILD_SMOKE_STEPS (optimizer steps, default 20, minimum 2).
"""

import math
import os
import platform
import time

import image_user
import package_imports
import smoke_harness as harness
import smoke_verdicts as verdicts
from smoke_harness import CHECKPOINT_STEPS, COMPILE_STEPS, describe_exc, log

PAYLOAD = "tensorflow"

LEARNING_RATE = 0.02
MOMENTUM = 0.9
LOADER_BATCHES = 16
LOADER_BATCH = 64
LOADER_FEATURES = 1024


def setup_devices(tf, state):
    """Must run before anything makes TensorFlow initialize its devices."""
    gpus = tf.config.list_physical_devices("GPU")
    state["gpus"] = len(gpus)
    if gpus:
        for gpu in gpus:
            try:
                # Do not grab all GPU memory: the payload needs little.
                tf.config.experimental.set_memory_growth(gpu, True)
            except Exception as exc:  # already initialized: harmless
                log(f"set_memory_growth({gpu.name}): {describe_exc(exc)}")
        return
    cpus = tf.config.list_physical_devices("CPU")
    if not cpus:
        raise RuntimeError("TensorFlow lists no CPU device")
    # NCCL is GPU-only; on a CPU host the all-reduce runs between two logical
    # CPU devices carved out of the one physical CPU.
    tf.config.set_logical_device_configuration(
        cpus[0],
        [tf.config.LogicalDeviceConfiguration() for _ in range(verdicts.CPU_WORLD_SIZE)],
    )


def collect_versions(tf, versions):
    versions["framework"] = str(tf.__version__)
    # CUDA/cuDNN are the versions TensorFlow was built against, reported only
    # when TensorFlow actually sees a GPU.  On a GPU-less host both the CPU
    # wheel and a CUDA wheel report null, so the host side compares these
    # against the image labels only when a GPU is there.
    if not tf.config.list_physical_devices("GPU"):
        return
    info = dict(tf.sysconfig.get_build_info())
    for key, name in (("cuda", "cuda_version"), ("cudnn", "cudnn_version")):
        value = info.get(name)
        versions[key] = str(value) if value not in (None, "") else None
    # TensorFlow does not usually expose its NCCL version; take it if a build
    # does.  (Otherwise the all-reduce section may fill it in from the
    # libnccl that the NCCL all-reduce loaded.)
    nccl = info.get("nccl_version")
    if nccl not in (None, ""):
        versions["nccl"] = str(nccl)


def collect_devices(tf):
    devices = []
    for i, gpu in enumerate(tf.config.list_physical_devices("GPU")):
        entry = {"kind": "gpu", "index": i, "name": gpu.name}
        try:
            details = tf.config.experimental.get_device_details(gpu)
            if details.get("device_name"):
                entry["name"] = str(details["device_name"])
            cc = details.get("compute_capability")
            if cc:
                entry["capability"] = ".".join(str(int(x)) for x in cc)
        except Exception as exc:
            log(f"get_device_details({gpu.name}): {describe_exc(exc)}")
        devices.append(entry)
    if not devices:
        logical = []
        try:
            logical = tf.config.list_logical_devices("CPU")
        except Exception as exc:
            log(f"list_logical_devices: {describe_exc(exc)}")
        devices.append(
            {
                "kind": "cpu",
                "index": 0,
                "name": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
                "logical_devices": len(logical),
            }
        )
    return devices


def run_train(tf, train, lr=None):
    """Fill ``train`` in place; raise on failure."""
    lr = LEARNING_RATE if lr is None else lr
    keras = tf.keras
    use_gpu = bool(tf.config.list_physical_devices("GPU"))
    train["device"] = "gpu" if use_gpu else "cpu"
    if use_gpu:
        policy = "mixed_float16"
        train["dtype"] = "float16"
        train["autocast"] = True
    else:
        policy = "float32"
        train["dtype"] = "float32"
        train["autocast"] = False

    keras.utils.set_random_seed(1234)
    # Fixed synthetic regression batch.
    n, d_in, d_hidden = 512, 32, 64
    with tf.device("/cpu:0"):
        x = tf.random.normal((n, d_in), seed=1)
        w_true = tf.random.normal((d_in, 1), seed=2) / math.sqrt(d_in)
        y = 2.0 * tf.tanh(tf.matmul(x, w_true)) + 0.05 * tf.random.normal((n, 1), seed=3)

    keras.mixed_precision.set_global_policy(policy)
    try:
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input(shape=(d_in,)),
                keras.layers.Dense(d_hidden, activation="relu"),
                keras.layers.Dense(d_hidden, activation="relu"),
                # The output (and so the loss) stays float32 under mixed precision.
                keras.layers.Dense(1, dtype="float32"),
            ]
        )
        # With the mixed_float16 policy, compile() wraps the optimizer in a
        # LossScaleOptimizer by itself.
        model.compile(
            optimizer=keras.optimizers.SGD(learning_rate=lr, momentum=MOMENTUM),
            loss="mse",
        )
        # One batch per epoch, so each epoch's "loss" is exactly the loss of
        # one optimizer step (computed before that step's update).
        t0 = time.perf_counter()
        history = model.fit(x, y, batch_size=n, epochs=train["steps"], shuffle=False, verbose=0)
        train["seconds"] = time.perf_counter() - t0
    finally:
        keras.mixed_precision.set_global_policy("float32")

    verdicts.judge_losses(train, [float(v) for v in history.history.get("loss", [])])


def _regression(tf, n, d_in, seed):
    """A fixed synthetic regression batch (x, y), made on the CPU."""
    with tf.device("/cpu:0"):
        x = tf.random.normal((n, d_in), seed=seed)
        w_true = tf.random.normal((d_in, 1), seed=seed + 1) / math.sqrt(d_in)
        y = 2.0 * tf.tanh(tf.matmul(x, w_true)) + 0.05 * tf.random.normal((n, 1), seed=seed + 2)
    return x, y


def _mlp(tf, d_in, d_hidden):
    keras = tf.keras
    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input(shape=(d_in,)),
            keras.layers.Dense(d_hidden, activation="relu"),
            keras.layers.Dense(1),
        ]
    )


def run_compile(tf, part, steps=COMPILE_STEPS):
    """Fill ``part``: a ``jit_compile=True`` (XLA) training step; its loss falls."""
    keras = tf.keras
    x, y = _regression(tf, 512, 32, seed=11)
    model = _mlp(tf, 32, 64)
    model.compile(
        optimizer=keras.optimizers.SGD(learning_rate=LEARNING_RATE, momentum=MOMENTUM),
        loss="mse",
        jit_compile=True,
    )
    part["device"] = "gpu" if tf.config.list_physical_devices("GPU") else "cpu"
    part["backend"] = "xla"
    t0 = time.perf_counter()
    losses = [float(model.train_on_batch(x, y))]  # the first call compiles
    part["compile_seconds"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    for _ in range(steps - 1):
        losses.append(float(model.train_on_batch(x, y)))
    part["step_ms"] = (time.perf_counter() - t1) * 1000.0 / max(1, steps - 1)
    verdicts.judge_losses(part, losses)


def run_loader(tf, part):
    """Fill ``part``: a tf.data pipeline (parallel map, prefetch) feeds the training step."""
    features, batch, batches = LOADER_FEATURES, LOADER_BATCH, LOADER_BATCHES

    def sample(index):
        x = tf.random.stateless_normal((features,), seed=tf.stack([index, 7]))
        y = tf.reshape(tf.tanh(tf.reduce_sum(x[:8])), (1,))
        return x, y

    data = (
        tf.data.Dataset.range(batch * batches)
        .map(sample, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        .batch(batch)
        .prefetch(tf.data.AUTOTUNE)
    )
    model = _mlp(tf, features, 32)
    model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.05, momentum=0.9), loss="mse")
    part.update(batch_bytes=batch * features * 4, batches=0)
    losses = []
    t0 = time.perf_counter()
    for x, y in data:
        losses.append(float(model.train_on_batch(x, y)))
        part["batches"] += 1
    seconds = time.perf_counter() - t0
    part["batches_per_s"] = part["batches"] / seconds if seconds > 0 else None
    # The batches differ: compare the first and the last quarter's average loss.
    window = max(1, len(losses) // 4)
    verdicts.judge_losses(part, [sum(losses[:window]) / window, sum(losses[-window:]) / window])


def run_checkpoint(tf, part, steps=CHECKPOINT_STEPS):
    """Fill ``part``: train, save model and optimizer (tf.train.Checkpoint), restore them into a
    fresh model and optimizer, and train on: the resumed run matches the uninterrupted one."""
    import shutil
    import tempfile

    x, y = _regression(tf, 256, 16, seed=21)

    def fresh():
        model = _mlp(tf, 16, 32)
        optimizer = tf.keras.optimizers.SGD(learning_rate=LEARNING_RATE, momentum=MOMENTUM)
        model.compile(optimizer=optimizer, loss="mse")
        model.optimizer.build(model.trainable_variables)  # its momentum slots exist to save
        return model

    def train(model, n):
        return [float(model.train_on_batch(x, y)) for _ in range(n)]

    model = fresh()
    before = train(model, steps)
    folder = tempfile.mkdtemp(prefix="envbuild-ckpt-")
    try:
        path = tf.train.Checkpoint(model=model, optimizer=model.optimizer).write(
            os.path.join(folder, "state")
        )
        part["bytes"] = sum(
            os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder)
        )
        uninterrupted = train(model, steps)
        resumed_model = fresh()
        tf.train.Checkpoint(model=resumed_model, optimizer=resumed_model.optimizer).read(
            path
        ).assert_existing_objects_matched()
        resumed = train(resumed_model, steps)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    verdicts.judge_checkpoint(part, before, uninterrupted, resumed, tolerance=1e-3)


def run_numpy(tf, part):
    """Fill ``part``: tensors to numpy arrays and back."""
    import numpy

    part["version"] = str(numpy.__version__)
    array = numpy.arange(12, dtype=numpy.float32).reshape(3, 4)
    tensor = tf.convert_to_tensor(array)
    back = (tensor * 2).numpy()
    checks = {
        "round_trip": bool(numpy.array_equal(tensor.numpy(), array)),
        "dtype": tensor.dtype == tf.float32 and back.dtype == numpy.float32,
        "values": bool(numpy.array_equal(back, array * 2)),
    }
    verdicts.judge_round_trip(part, checks)


def _check_sum(tf, t, expected):
    bad = tf.not_equal(t, expected)
    if not bool(tf.reduce_any(bad).numpy()):
        return True, float(expected)
    return False, float(tf.boolean_mask(t, bad)[0].numpy())


def run_allreduce(tf, ar, errors, versions):
    """Fill ``ar`` in place; append problems to ``errors``."""
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        backend, devices = "nccl", [d.name for d in gpus]
        cross_device_ops = tf.distribute.NcclAllReduce()
        ar["method"] = "MirroredStrategy/NcclAllReduce"
    else:
        cpus = tf.config.list_logical_devices("CPU")
        backend, devices = "cpu", [d.name for d in cpus[: verdicts.CPU_WORLD_SIZE]]
        if len(devices) < verdicts.CPU_WORLD_SIZE:
            raise RuntimeError(
                f"need {verdicts.CPU_WORLD_SIZE} logical CPU devices for the all-reduce, "
                f"TensorFlow has {len(cpus)} (setup failed?)"
            )
        cross_device_ops = tf.distribute.ReductionToOneDevice()
        ar["method"] = "MirroredStrategy/ReductionToOneDevice"
    elements, warmup, iters = verdicts.plan_allreduce(ar, backend, gpu=backend == "nccl")

    strategy = tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=cross_device_ops)
    world = int(strategy.num_replicas_in_sync)
    expected = verdicts.allreduce_world(ar, world)

    def per_replica(fill):
        # value_fn runs under each replica's device scope.
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.fill([elements], tf.constant(fill(ctx), tf.float32))
        )

    @tf.function
    def allreduce(values):
        def replica_fn(v):
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, v)

        return strategy.run(replica_fn, args=(values,))

    def local(values):
        return list(strategy.experimental_local_results(values))

    def sync(values):
        for t in local(values):
            t[0].numpy()

    def check(values):
        results = local(values)
        if len(results) != world:
            raise RuntimeError(f"{len(results)} local results for {world} replicas")
        for t in results:
            correct, got = _check_sum(tf, t, expected)
            if not correct:
                return False, got
        return True, float(expected)

    ones = per_replica(lambda ctx: float(ctx.replica_id_in_sync_group + 1))
    # correctness on fresh buffers
    correct1, got1 = check(allreduce(ones))

    # bandwidth (values are irrelevant; zeros cannot overflow).  Each
    # iteration consumes the previous result, so the last result being ready
    # means that all of them are done.
    buf = per_replica(lambda ctx: 0.0)
    for _ in range(warmup):
        buf = allreduce(buf)
    sync(buf)
    t0 = time.perf_counter()
    for _ in range(iters):
        buf = allreduce(buf)
    sync(buf)
    seconds = (time.perf_counter() - t0) / iters

    # correctness again after the collective has been used repeatedly
    correct2, got2 = check(allreduce(ones))

    verdicts.finish_allreduce(
        ar, errors, versions, backend=backend, seconds=seconds,
        first=(correct1, got1), last=(correct2, got2),
    )  # fmt: skip


def smoke(run):
    image_user.user_section(run)
    tf = run.load("tensorflow")
    if tf is None:
        return
    state = {}
    run.doc["train"]["steps"] = verdicts.steps_from_env(run.errors)
    run.section("setup", 120, lambda doc: setup_devices(tf, state))
    run.section("versions", 60, lambda doc: collect_versions(tf, doc["versions"]))
    run.section("devices", 60, lambda doc: doc["devices"].extend(collect_devices(tf)))
    run.section("train", 180, lambda doc: run_train(tf, doc["train"]))
    run.section("compile", 180, harness.timed("compile", lambda part: run_compile(tf, part)))
    run.section("loader", 120, harness.timed("loader", lambda part: run_loader(tf, part)))
    run.section(
        "checkpoint", 120, harness.timed("checkpoint", lambda part: run_checkpoint(tf, part))
    )
    run.section("numpy", 30, harness.timed("numpy", lambda part: run_numpy(tf, part)))
    package_imports.packages_section(run)
    run.section(
        "allreduce",
        240,
        lambda doc: run_allreduce(tf, doc["allreduce"], doc["errors"], doc["versions"]),
    )


if __name__ == "__main__":
    harness.main(
        PAYLOAD,
        smoke,
        parts=verdicts.training_parts(),
        checks=harness.TRAINING_CHECKS,
        # CUDA/cuDNN/NCCL versions are read only where a GPU is present: the host must not
        # expect them from a GPU-less run.
        extra={"cuda_needs_gpu": True},
    )
