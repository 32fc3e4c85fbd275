#!/usr/bin/env python3
"""envbuild smoke payload for TensorFlow images.

Copied into a container and run as ``python3 tensorflow_smoke.py``.  It
prints exactly one JSON document on stdout (all other output, including
anything TensorFlow, Keras or NCCL write to fd 1, is diverted to stderr) and
exits 0 when every check passed, 1 otherwise.  The document has the same
shape as the one torch_smoke.py prints.

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

Only the standard library and tensorflow are used.  Every section runs in a
worker thread with a deadline: a section that hangs is reported and the
payload still prints its report and exits.

Knob: ENVBUILD_SMOKE_STEPS (optimizer steps, default 20, minimum 2).
"""

import ctypes
import json
import math
import os
import platform
import sys
import threading
import time
import traceback

PAYLOAD = "tensorflow"
PAYLOAD_VERSION = 1

DEFAULT_STEPS = 20
# The last loss must be at least this fraction below the first one, so that
# a no-op optimizer (constant loss, maybe with tiny numerical jitter) fails.
MIN_RELATIVE_DROP = 0.01
LEARNING_RATE = 0.02
MOMENTUM = 0.9

# Deadlines (seconds) per section, and for all sections together; the host
# runs the container under its own, longer, timeout.
SECTION_TIMEOUT_S = {"setup": 120.0, "versions": 60.0, "devices": 60.0, "train": 180.0}
ALLREDUCE_TIMEOUT_S = 240.0
TOTAL_TIMEOUT_S = 480.0

GPU_BYTES = 16 * 1024 * 1024
CPU_BYTES = 4 * 1024 * 1024
GPU_WARMUP, GPU_ITERS = 5, 20
CPU_WARMUP, CPU_ITERS = 2, 10
CPU_WORLD_SIZE = 2


def log(msg):
    sys.stderr.write(f"[tensorflow_smoke] {msg}\n")
    sys.stderr.flush()


def describe_exc(exc):
    text = str(exc).strip()
    # Keep error entries to one readable line (TF/NCCL messages can be long).
    text = " ".join(text.split())
    if len(text) > 500:
        text = text[:497] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def divert_stdout():
    """Point fd 1 at stderr; return a private fd for the JSON document."""
    sys.stdout.flush()
    json_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return json_fd


def clean_json(obj):
    """Replace non-finite floats (invalid in JSON) by null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return dict((k, clean_json(v)) for k, v in list(obj.items()))
    if isinstance(obj, (list, tuple)):
        return [clean_json(v) for v in list(obj)]
    return obj


def snapshot(section):
    """A copy of a section dict that a hung worker thread can no longer change."""
    for _ in range(5):
        try:
            return json.loads(json.dumps(clean_json(section)))
        except Exception:  # the worker changed it under our feet: retry
            time.sleep(0.01)
    return dict(section)


def run_bounded(name, fn, timeout_s):
    """Run ``fn()`` in a daemon thread for at most ``timeout_s`` seconds.

    Returns (finished, exception).  A thread that is still running after the
    deadline is abandoned (it cannot be killed); the caller reports it.
    """
    box = {}

    def target():
        try:
            fn()
        except BaseException as exc:  # report everything, even SystemExit
            box["exc"] = exc
            traceback.print_exc(file=sys.stderr)

    th = threading.Thread(target=target, name=f"section-{name}", daemon=True)
    th.start()
    th.join(max(0.0, timeout_s))
    if th.is_alive():
        return False, None
    return True, box.get("exc")


def nccl_version_string(v):
    """22707 / 2708 / (2, 27, 7) -> 'x.y.z'."""
    if v is None:
        return None
    if isinstance(v, (tuple, list)):
        return ".".join(str(int(x)) for x in v[:3])
    if isinstance(v, str):
        return v
    v = int(v)
    if v >= 10000:  # NCCL >= 2.9: major*10000 + minor*100 + patch
        major, rest = divmod(v, 10000)
    else:  # older: major*1000 + minor*100 + patch
        major, rest = divmod(v, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


def loaded_nccl_version():
    """ncclGetVersion() of the libnccl this process has mapped, else None.

    Only a library that is already loaded (seen in /proc/self/maps) is asked,
    so a stray libnccl elsewhere on the system cannot be reported by mistake;
    a statically linked NCCL is not found and gives None.
    """
    try:
        with open("/proc/self/maps") as fh:
            paths = sorted(
                {
                    line.split(None, 5)[5].strip()
                    for line in fh
                    if "libnccl" in line and len(line.split(None, 5)) == 6
                }
            )
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
            version = ctypes.c_int(0)
            if lib.ncclGetVersion(ctypes.byref(version)) == 0 and version.value > 0:
                return nccl_version_string(version.value)
        except Exception:
            continue
    return None


# --------------------------------------------------------------------------
# setup, versions and devices


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
        [tf.config.LogicalDeviceConfiguration() for _ in range(CPU_WORLD_SIZE)],
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


# --------------------------------------------------------------------------
# training step


def steps_from_env(errors):
    raw = os.environ.get("ENVBUILD_SMOKE_STEPS", "").strip()
    if not raw:
        return DEFAULT_STEPS
    try:
        steps = int(raw)
        if steps < 2:
            raise ValueError("must be >= 2")
        return steps
    except ValueError as exc:
        errors.append(
            f"train: ValueError: bad ENVBUILD_SMOKE_STEPS={raw!r} ({exc}); using {DEFAULT_STEPS}"
        )
        return DEFAULT_STEPS


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

    losses = [float(v) for v in history.history.get("loss", [])]
    train["losses"] = losses
    if len(losses) < 2:
        raise RuntimeError(f"expected {train['steps']} per-step losses, got {len(losses)}")
    first, last = losses[0], losses[-1]
    train["loss_first"] = first
    train["loss_last"] = last
    fell = (
        math.isfinite(first)
        and math.isfinite(last)
        and last < first
        and (first - last) > MIN_RELATIVE_DROP * abs(first)
    )
    train["loss_fell"] = bool(fell)
    if not fell:
        raise RuntimeError(
            f"loss did not fall over {len(losses)} steps: first={first!r} last={last!r}"
        )


# --------------------------------------------------------------------------
# all-reduce


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
        nbytes, warmup, iters = GPU_BYTES, GPU_WARMUP, GPU_ITERS
    else:
        cpus = tf.config.list_logical_devices("CPU")
        backend, devices = "cpu", [d.name for d in cpus[:CPU_WORLD_SIZE]]
        if len(devices) < CPU_WORLD_SIZE:
            raise RuntimeError(
                f"need {CPU_WORLD_SIZE} logical CPU devices for the all-reduce, "
                f"TensorFlow has {len(cpus)} (setup failed?)"
            )
        cross_device_ops = tf.distribute.ReductionToOneDevice()
        ar["method"] = "MirroredStrategy/ReductionToOneDevice"
        nbytes, warmup, iters = CPU_BYTES, CPU_WARMUP, CPU_ITERS
    elements = nbytes // 4
    ar.update(backend=backend, elements=elements, bytes=elements * 4, iterations=iters)

    strategy = tf.distribute.MirroredStrategy(devices=devices, cross_device_ops=cross_device_ops)
    world = int(strategy.num_replicas_in_sync)
    expected = world * (world + 1) / 2.0
    ar.update(world_size=world, expected=expected)

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

    correct = bool(correct1 and correct2)
    ar["correct"] = correct
    ar["got"] = got2 if correct1 else got1
    ar["seconds"] = seconds
    if seconds > 0:
        algbw = ar["bytes"] / seconds / 1e9
        ar["algbw_gbps"] = algbw
        ar["busbw_gbps"] = algbw * 2.0 * (world - 1) / world if world > 1 else 0.0
    if backend == "nccl" and versions.get("nccl") is None:
        versions["nccl"] = loaded_nccl_version()
    if not correct:
        errors.append(
            f"allreduce: wrong result: expected {expected!r} everywhere, got {ar['got']!r}"
        )


# --------------------------------------------------------------------------


def main():
    json_fd = divert_stdout()
    errors = []
    versions = {
        "python": platform.python_version(),
        "framework": None,
        "cuda": None,
        "cudnn": None,
        "nccl": None,
    }
    devices = []
    train = {
        "device": None,
        "dtype": None,
        "autocast": False,
        "steps": DEFAULT_STEPS,
        "losses": [],
        "loss_first": None,
        "loss_last": None,
        "loss_fell": False,
        "seconds": None,
    }
    allreduce = {
        "backend": None,
        "world_size": None,
        "elements": None,
        "bytes": None,
        "dtype": "float32",
        "iterations": None,
        "seconds": None,
        "algbw_gbps": None,
        "busbw_gbps": None,
        "correct": False,
        "expected": None,
        "got": None,
    }
    t_start = time.perf_counter()
    deadline = time.monotonic() + TOTAL_TIMEOUT_S
    hung = False

    tf = None
    try:
        import tensorflow as tf
    except BaseException as exc:  # a broken tensorflow may raise anything
        errors.append("import: " + describe_exc(exc))
        traceback.print_exc(file=sys.stderr)

    if tf is not None:
        state = {}
        train["steps"] = steps_from_env(errors)
        sections = [
            ("setup", lambda: setup_devices(tf, state)),
            ("versions", lambda: collect_versions(tf, versions)),
            ("devices", lambda: devices.extend(collect_devices(tf))),
            ("train", lambda: run_train(tf, train)),
            ("allreduce", lambda: run_allreduce(tf, allreduce, errors, versions)),
        ]
        for name, fn in sections:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                errors.append(f"{name}: skipped, the payload's {TOTAL_TIMEOUT_S:g} s are used up")
                continue
            limit = min(SECTION_TIMEOUT_S.get(name, ALLREDUCE_TIMEOUT_S), remaining)
            log(f"section {name} ...")
            t0 = time.perf_counter()
            finished, exc = run_bounded(name, fn, limit)
            if not finished:
                hung = True
                errors.append(f"{name}: no result within {limit:.0f} s (hung?), abandoned")
                # The abandoned thread may still write: freeze what we report.
                versions = snapshot(versions)
                devices = snapshot(devices)
                train = snapshot(train)
                allreduce = snapshot(allreduce)
            elif exc is not None:
                errors.append(f"{name}: {describe_exc(exc)}")
            log(f"section {name} done in {time.perf_counter() - t0:.2f} s")

    checks = {
        "loss_fell": bool(train.get("loss_fell")),
        "allreduce_correct": bool(allreduce.get("correct")),
    }
    ok = all(checks.values()) and not errors
    doc = {
        "payload": PAYLOAD,
        "payload_version": PAYLOAD_VERSION,
        # CUDA/cuDNN/NCCL versions are read only where a GPU is present: the host must not
        # expect them from a GPU-less run.
        "cuda_needs_gpu": True,
        "ok": bool(ok),
        "versions": versions,
        "devices": devices,
        "train": train,
        "allreduce": allreduce,
        "checks": checks,
        "errors": list(errors),
    }
    try:
        text = json.dumps(clean_json(doc), indent=2, allow_nan=False)
    except Exception as exc:  # should not happen; still emit valid JSON
        text = json.dumps(
            {
                "payload": PAYLOAD,
                "payload_version": PAYLOAD_VERSION,
                "ok": False,
                "versions": {},
                "devices": [],
                "train": {},
                "allreduce": {},
                "checks": {"loss_fell": False, "allreduce_correct": False},
                "errors": [*errors, "json: " + describe_exc(exc)],
            }
        )
        ok = False
    log(
        f"total {time.perf_counter() - t_start:.2f} s, ok={ok}"
        + (" (a section hung)" if hung else "")
    )
    with os.fdopen(json_fd, "w") as out:
        out.write(text + "\n")
        out.flush()
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    # Leave without interpreter teardown: an abandoned (hung) section thread,
    # or TensorFlow's own shutdown, must neither block the exit nor change
    # its status after the report went out.
    os._exit(code)
