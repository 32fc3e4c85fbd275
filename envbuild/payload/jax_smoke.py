#!/usr/bin/env python3
"""envbuild smoke payload for JAX images.

Copied into a container with the other payload modules and run as ``python3 jax_smoke.py``.
The harness (smoke_harness.py) prints exactly one JSON document on stdout (all other output,
including anything JAX, XLA or NCCL write to fd 1, is diverted to stderr), in the same shape
for every framework, and exits 0 when every check passed, 1 otherwise; this file is the JAX
part alone.

Sections:
  * versions / devices  -- what the image and the machine provide;
  * train               -- ~20 jitted SGD steps of a tiny MLP (params as a
                           pytree) on a fixed batch (bfloat16 compute on GPU,
                           float32 on CPU); the loss has to fall;
  * allreduce           -- psum over every device of the default backend
                           (GPUs: NCCL; or two forced host devices), via
                           shard_map on a 1-d Mesh (jax.pmap as a fallback);
                           SUM of (index+1) must equal n(n+1)/2 everywhere;
                           bandwidth is measured as in nccl-tests.

Only the standard library, the sibling payload modules (smoke_verdicts.py
judges what the sections measured), jax (with jax.numpy) and numpy (a jax
dependency) are used.  Every section runs under the harness's deadline: a
section that hangs is reported and the payload still prints its report and
exits.

Knob: ENVBUILD_SMOKE_STEPS (optimizer steps, default 20, minimum 2).
"""

import math
import os
import platform
import sys
import time
import traceback

import image_user
import package_imports
import payload_versions
import smoke_harness as harness
import smoke_verdicts as verdicts
from smoke_harness import CHECKPOINT_STEPS, COMPILE_STEPS, describe_exc, log

PAYLOAD = "jax"

LEARNING_RATE = 0.02
MOMENTUM = 0.9
LOADER_BATCHES = 16
LOADER_BATCH = 64
LOADER_FEATURES = 1024

HOST_DEVICE_FLAG = "--xla_force_host_platform_device_count"


def force_host_devices():
    """Give the host (CPU) platform two devices, for the CPU all-reduce.

    Must happen before jax is imported.  Whether a GPU will be used is not
    known yet, so this is done unconditionally: the flag only affects the
    host platform and is harmless when the default backend is a GPU.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if HOST_DEVICE_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {HOST_DEVICE_FLAG}={verdicts.CPU_WORLD_SIZE}".strip()


def cuda_version_string(v):
    """12090 -> '12.9'."""
    if v is None:
        return None
    major, rest = divmod(int(v), 1000)
    return f"{major}.{rest // 10}"


def gpu_backend(jax):
    return jax.default_backend() == "gpu"


def cuda_versions_module():
    """The CUDA plugin's ``_versions`` module, or None (CPU-only jaxlib)."""
    try:
        from jax._src.lib import cuda_versions

        if cuda_versions is not None:
            return cuda_versions
    except Exception as exc:
        log(f"jax._src.lib.cuda_versions: {describe_exc(exc)}")
    import importlib

    for name in ("jax_cuda13_plugin", "jax_cuda12_plugin", "jaxlib.cuda"):
        try:
            return importlib.import_module(f"{name}._versions")
        except Exception:
            continue
    return None


def jaxlib_version():
    try:
        import jaxlib

        version = getattr(jaxlib, "__version__", None)
        if version:
            return str(version)
    except Exception:
        pass
    try:
        from jaxlib import version as jaxlib_version_module

        return str(jaxlib_version_module.__version__)
    except Exception:
        pass
    try:
        from importlib import metadata

        return metadata.version("jaxlib")
    except Exception:
        return None


def collect_versions(jax, versions, errors):
    versions["framework"] = str(jax.__version__)
    versions["jaxlib"] = jaxlib_version()
    # CUDA/cuDNN/NCCL are reported only when the default backend is a GPU, so
    # a GPU-less host reports null whatever the wheel (the host side compares
    # them against the image labels only when a GPU is there).
    if not gpu_backend(jax):
        return
    mod = cuda_versions_module()
    if mod is None:
        errors.append("versions: GPU backend present but no CUDA plugin versions module found")
        return
    probes = (
        ("cuda", "cuda_runtime_get_version", cuda_version_string),
        ("cudnn", "cudnn_get_version", payload_versions.cudnn_version_from),
        ("nccl", "nccl_get_version", payload_versions.nccl_version_from),
    )
    for key, fn_name, fmt in probes:
        fn = getattr(mod, fn_name, None)
        if fn is None:
            # jaxlib has no NCCL getter so far: the all-reduce section asks
            # the libnccl that XLA loaded instead.
            continue
        try:
            versions[key] = fmt(fn())
        except Exception as exc:
            errors.append(f"versions.{key}: {describe_exc(exc)}")


def collect_devices(jax):
    devices = []
    for d in jax.devices():
        kind = str(d.platform)
        entry = {"kind": kind, "index": int(d.id), "name": str(d.device_kind)}
        if kind == "gpu":
            try:
                stats = d.memory_stats() or {}
                if stats.get("bytes_limit"):
                    entry["memory_bytes"] = int(stats["bytes_limit"])
            except Exception as exc:
                log(f"memory_stats({d}): {describe_exc(exc)}")
            cc = getattr(d, "compute_capability", None)
            if cc:
                entry["capability"] = str(cc)
        elif kind == "cpu":
            entry["name"] = platform.processor() or platform.machine() or entry["name"]
            entry["cores"] = os.cpu_count()
        devices.append(entry)
    return devices


def run_train(jax, train, lr=None):
    """Fill ``train`` in place; raise on failure."""
    import jax.numpy as jnp

    lr = LEARNING_RATE if lr is None else lr
    use_gpu = gpu_backend(jax)
    train["device"] = "gpu" if use_gpu else "cpu"
    if use_gpu:
        # Parameters (and the optimizer state) stay float32; the forward and
        # backward passes run in bfloat16.
        compute_dtype = jnp.bfloat16
        train["dtype"] = "bfloat16"
        train["autocast"] = True
    else:
        compute_dtype = jnp.float32
        train["dtype"] = "float32"
        train["autocast"] = False
    device = jax.devices()[0]

    # Fixed synthetic regression batch.
    n, d_in, d_hidden = 512, 32, 64
    kx, kw, kn, kp = jax.random.split(jax.random.PRNGKey(1234), 4)
    x = jax.random.normal(kx, (n, d_in), jnp.float32)
    w_true = jax.random.normal(kw, (d_in, 1), jnp.float32) / math.sqrt(d_in)
    y = 2.0 * jnp.tanh(x @ w_true) + 0.05 * jax.random.normal(kn, (n, 1), jnp.float32)
    x, y = jax.device_put(x, device), jax.device_put(y, device)

    params = jax.device_put(_mlp_params(jax, [d_in, d_hidden, d_hidden, 1], kp), device)
    velocity = jax.tree_util.tree_map(jnp.zeros_like, params)
    step = _sgd_step(jax, compute_dtype)

    lr_arr = jnp.asarray(lr, jnp.float32)
    losses = []
    train["losses"] = losses
    t0 = time.perf_counter()
    for _ in range(train["steps"]):
        params, velocity, loss = step(params, velocity, x, y, lr_arr)
        losses.append(float(loss))
    jax.block_until_ready(params)
    train["seconds"] = time.perf_counter() - t0

    verdicts.judge_losses(train, losses)


def _mlp_params(jax, sizes, key):
    """An MLP's parameters as a pytree; the same init as torch.nn.Linear:
    U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    import jax.numpy as jnp

    params = []
    for i in range(len(sizes) - 1):
        fan_in, fan_out = sizes[i], sizes[i + 1]
        key, k1, k2 = jax.random.split(key, 3)
        bound = 1.0 / math.sqrt(fan_in)
        params.append(
            {
                "w": jax.random.uniform(k1, (fan_in, fan_out), jnp.float32, -bound, bound),
                "b": jax.random.uniform(k2, (fan_out,), jnp.float32, -bound, bound),
            }
        )
    return params


def _sgd_step(jax, compute_dtype):
    """The jitted SGD-with-momentum step of an MSE regression: (params, velocity, x, y, lr) ->
    (params, velocity, loss)."""
    import jax.numpy as jnp

    def loss_fn(params, x, y):
        h = x.astype(compute_dtype)
        for i, layer in enumerate(params):
            h = h @ layer["w"].astype(compute_dtype) + layer["b"].astype(compute_dtype)
            if i < len(params) - 1:
                h = jax.nn.relu(h)
        return jnp.mean((h.astype(jnp.float32) - y) ** 2)

    @jax.jit
    def step(params, velocity, x, y, lr):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        velocity = jax.tree_util.tree_map(lambda v, g: MOMENTUM * v + g, velocity, grads)
        params = jax.tree_util.tree_map(lambda p, v: p - lr * v, params, velocity)
        return params, velocity, loss

    return step


def _regression(jax, n, d_in, seed):
    import jax.numpy as jnp

    kx, kw, kn = jax.random.split(jax.random.PRNGKey(seed), 3)
    x = jax.random.normal(kx, (n, d_in), jnp.float32)
    w_true = jax.random.normal(kw, (d_in, 1), jnp.float32) / math.sqrt(d_in)
    y = 2.0 * jnp.tanh(x @ w_true) + 0.05 * jax.random.normal(kn, (n, 1), jnp.float32)
    return x, y


def run_compile(jax, part, steps=COMPILE_STEPS):
    """Fill ``part``: the training step compiled ahead of time by XLA (``jit(...).lower().compile()``),
    then run; its loss falls."""
    import jax.numpy as jnp

    x, y = _regression(jax, 512, 32, seed=11)
    params = _mlp_params(jax, [32, 64, 1], jax.random.PRNGKey(0))
    velocity = jax.tree_util.tree_map(jnp.zeros_like, params)
    lr = jnp.asarray(LEARNING_RATE, jnp.float32)
    part["device"] = "gpu" if gpu_backend(jax) else "cpu"
    part["backend"] = "xla"
    t0 = time.perf_counter()
    compiled = _sgd_step(jax, jnp.float32).lower(params, velocity, x, y, lr).compile()
    part["compile_seconds"] = time.perf_counter() - t0
    losses = []
    t1 = time.perf_counter()
    for _ in range(steps):
        params, velocity, loss = compiled(params, velocity, x, y, lr)
        losses.append(float(loss))
    part["step_ms"] = (time.perf_counter() - t1) * 1000.0 / steps
    verdicts.judge_losses(part, losses)


def run_loader(jax, part):
    """Fill ``part``: batches made by a numpy iterator are put on the device and consumed by the
    jitted step, the way a JAX input pipeline feeds training."""
    import jax.numpy as jnp
    import numpy

    features, batch, batches = LOADER_FEATURES, LOADER_BATCH, LOADER_BATCHES
    rng = numpy.random.default_rng(7)

    def batches_of_numpy():
        for _ in range(batches):
            x = rng.standard_normal((batch, features), dtype=numpy.float32)
            y = numpy.tanh(x[:, :8].sum(axis=1, keepdims=True)).astype(numpy.float32)
            yield x, y

    device = jax.devices()[0]
    params = jax.device_put(_mlp_params(jax, [features, 32, 1], jax.random.PRNGKey(0)), device)
    velocity = jax.tree_util.tree_map(jnp.zeros_like, params)
    step = _sgd_step(jax, jnp.float32)
    lr = jnp.asarray(0.05, jnp.float32)
    part.update(batch_bytes=batch * features * 4, batches=0)
    losses = []
    t0 = time.perf_counter()
    for x, y in batches_of_numpy():
        x, y = jax.device_put(x, device), jax.device_put(y, device)
        params, velocity, loss = step(params, velocity, x, y, lr)
        losses.append(float(loss))
        part["batches"] += 1
    seconds = time.perf_counter() - t0
    part["batches_per_s"] = part["batches"] / seconds if seconds > 0 else None
    window = max(1, len(losses) // 4)
    verdicts.judge_losses(part, [sum(losses[:window]) / window, sum(losses[-window:]) / window])


def run_checkpoint(jax, part, steps=CHECKPOINT_STEPS):
    """Fill ``part``: train, save parameters and optimizer state (numpy .npz), load them into a
    fresh pytree, train on: the resumed run matches the uninterrupted one."""
    import shutil
    import tempfile

    import jax.numpy as jnp
    import numpy

    x, y = _regression(jax, 256, 16, seed=21)
    step = _sgd_step(jax, jnp.float32)
    lr = jnp.asarray(LEARNING_RATE, jnp.float32)

    def train(state, n):
        params, velocity = state
        losses = []
        for _ in range(n):
            params, velocity, loss = step(params, velocity, x, y, lr)
            losses.append(float(loss))
        return (params, velocity), losses

    params = _mlp_params(jax, [16, 32, 1], jax.random.PRNGKey(0))
    state = (params, jax.tree_util.tree_map(jnp.zeros_like, params))
    state, before = train(state, steps)
    leaves, tree = jax.tree_util.tree_flatten(state)
    folder = tempfile.mkdtemp(prefix="envbuild-ckpt-")
    try:
        path = os.path.join(folder, "state.npz")
        numpy.savez(path, *[numpy.asarray(leaf) for leaf in leaves])
        part["bytes"] = os.path.getsize(path)
        _, uninterrupted = train(state, steps)
        with numpy.load(path) as saved:
            loaded = [jnp.asarray(saved[f"arr_{i}"]) for i in range(len(leaves))]
        _, resumed = train(jax.tree_util.tree_unflatten(tree, loaded), steps)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    verdicts.judge_checkpoint(part, before, uninterrupted, resumed, tolerance=1e-4)


def run_numpy(jax, part):
    """Fill ``part``: numpy arrays to device arrays and back."""
    import jax.numpy as jnp
    import numpy

    part["version"] = str(numpy.__version__)
    array = numpy.arange(12, dtype=numpy.float32).reshape(3, 4)
    device_array = jnp.asarray(array)
    back = numpy.asarray(device_array * 2)
    checks = {
        "round_trip": bool(numpy.array_equal(numpy.asarray(device_array), array)),
        "dtype": device_array.dtype == jnp.float32 and back.dtype == numpy.float32,
        "values": bool(numpy.array_equal(back, array * 2)),
    }
    verdicts.judge_round_trip(part, checks)


def shard_map_allreduce(jax, devs, elements):
    """(fn, make) with fn a jitted psum over a 1-d Mesh of ``devs``."""
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:  # jax < 0.7
        from jax.experimental.shard_map import shard_map
    n = len(devs)
    mesh = Mesh(np.array(devs), ("i",))
    sharding = NamedSharding(mesh, P("i"))
    fn = jax.jit(
        shard_map(lambda x: jax.lax.psum(x, "i"), mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    )

    def make(fill):
        # Shard k (elements [k*E, (k+1)*E)) lives on devs[k] and holds fill(k).
        arrays = [
            jax.device_put(jnp.full((elements,), fill(k), jnp.float32), d)
            for k, d in enumerate(devs)
        ]
        return jax.make_array_from_single_device_arrays((n * elements,), sharding, arrays)

    return fn, make


def pmap_allreduce(jax, devs, elements):
    """(fn, make) with fn a pmapped psum over ``devs``."""
    import numpy as np

    n = len(devs)
    fn = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i", devices=devs)

    def make(fill):
        host = np.stack([np.full((elements,), fill(k), np.float32) for k in range(n)])
        return host  # pmap splits the leading axis over devs

    return fn, make


def check_sum(jnp, arr, expected):
    """Check every shard of ``arr`` on its own device; (correct, got)."""
    shards = getattr(arr, "addressable_shards", None)
    datas = [s.data for s in shards] if shards else [arr]
    for data in datas:
        bad = data != expected
        if bool(jnp.any(bad)):
            idx = int(jnp.argmax(bad.reshape(-1)))
            return False, float(data.reshape(-1)[idx])
    return True, float(expected)


def run_allreduce(jax, ar, errors, versions):
    """Fill ``ar`` in place; append problems to ``errors``."""
    import jax.numpy as jnp

    devs = jax.devices()
    backend = "nccl" if gpu_backend(jax) else "cpu"
    elements, warmup, iters = verdicts.plan_allreduce(ar, backend, gpu=backend == "nccl")
    world = len(devs)
    expected = verdicts.allreduce_world(ar, world)
    if backend == "cpu" and world < verdicts.CPU_WORLD_SIZE:
        errors.append(
            f"allreduce: only {world} host device(s) although XLA_FLAGS asks for "
            f"{verdicts.CPU_WORLD_SIZE} ({os.environ.get('XLA_FLAGS', '')!r}); "
            "was jax imported earlier?"
        )

    def ones_fill(k):
        return float(k + 1)

    # shard_map on a Mesh is the current API; jax.pmap (deprecated in newer
    # releases) is the fallback for a jax where shard_map does not work.
    try:
        fn, make = shard_map_allreduce(jax, devs, elements)
        first_out = jax.block_until_ready(fn(make(ones_fill)))
        ar["method"] = "shard_map/psum"
    except Exception as exc:
        log(f"shard_map all-reduce failed, trying pmap: {describe_exc(exc)}")
        traceback.print_exc(file=sys.stderr)
        fn, make = pmap_allreduce(jax, devs, elements)
        first_out = jax.block_until_ready(fn(make(ones_fill)))
        ar["method"] = f"pmap/psum (shard_map failed: {describe_exc(exc)[:200]})"

    # correctness on fresh buffers
    correct1, got1 = check_sum(jnp, first_out, expected)
    del first_out

    # bandwidth (values are irrelevant; zeros cannot overflow).  Each
    # iteration consumes the previous result.
    buf = make(lambda k: 0.0)
    for _ in range(warmup):
        buf = fn(buf)
    jax.block_until_ready(buf)
    t0 = time.perf_counter()
    for _ in range(iters):
        buf = fn(buf)
    jax.block_until_ready(buf)
    seconds = (time.perf_counter() - t0) / iters
    del buf

    # correctness again after the collective has been used repeatedly
    correct2, got2 = check_sum(jnp, jax.block_until_ready(fn(make(ones_fill))), expected)

    verdicts.finish_allreduce(
        ar, errors, versions, backend=backend, seconds=seconds,
        first=(correct1, got1), last=(correct2, got2),
    )  # fmt: skip


def smoke(run):
    force_host_devices()
    image_user.user_section(run)
    jax = run.load("jax")
    if jax is None:
        return
    run.doc["train"]["steps"] = verdicts.steps_from_env(run.errors)
    run.section("versions", 120, lambda doc: collect_versions(jax, doc["versions"], doc["errors"]))
    run.section("devices", 60, lambda doc: doc["devices"].extend(collect_devices(jax)))
    run.section("train", 180, lambda doc: run_train(jax, doc["train"]))
    run.section("compile", 180, harness.timed("compile", lambda part: run_compile(jax, part)))
    run.section("loader", 120, harness.timed("loader", lambda part: run_loader(jax, part)))
    run.section(
        "checkpoint", 120, harness.timed("checkpoint", lambda part: run_checkpoint(jax, part))
    )
    run.section("numpy", 30, harness.timed("numpy", lambda part: run_numpy(jax, part)))
    package_imports.packages_section(run)
    run.section(
        "allreduce",
        240,
        lambda doc: run_allreduce(jax, doc["allreduce"], doc["errors"], doc["versions"]),
    )


def parts():
    parts = verdicts.training_parts()
    parts["versions"]["jaxlib"] = None
    return parts


if __name__ == "__main__":
    harness.main(
        PAYLOAD,
        smoke,
        parts=parts(),
        checks=harness.TRAINING_CHECKS,
        # CUDA/cuDNN/NCCL versions are read only where a GPU is present: the host must not
        # expect them from a GPU-less run.
        extra={"cuda_needs_gpu": True},
    )
