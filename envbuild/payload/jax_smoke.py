#!/usr/bin/env python3
"""envbuild smoke payload for JAX images.

Copied into a container and run as ``python3 jax_smoke.py``.  It prints
exactly one JSON document on stdout (all other output, including anything
JAX, XLA or NCCL write to fd 1, is diverted to stderr) and exits 0 when
every check passed, 1 otherwise.  The document has the same shape as the one
torch_smoke.py prints.

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

Only the standard library, jax (with jax.numpy) and numpy (a jax
dependency) are used.  Every section runs in a worker thread with a deadline:
a section that hangs is reported and the payload still prints its report and
exits.

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

PAYLOAD = "jax"
PAYLOAD_VERSION = 1

DEFAULT_STEPS = 20
# The last loss must be at least this fraction below the first one, so that
# a no-op optimizer (constant loss, maybe with tiny numerical jitter) fails.
MIN_RELATIVE_DROP = 0.01
LEARNING_RATE = 0.02
MOMENTUM = 0.9

# Deadlines (seconds) per section, and for all sections together; the host
# runs the container under its own, longer, timeout.
SECTION_TIMEOUT_S = {"versions": 120.0, "devices": 60.0, "train": 180.0}
ALLREDUCE_TIMEOUT_S = 240.0
TOTAL_TIMEOUT_S = 480.0

GPU_BYTES = 16 * 1024 * 1024
CPU_BYTES = 4 * 1024 * 1024
GPU_WARMUP, GPU_ITERS = 5, 20
CPU_WARMUP, CPU_ITERS = 2, 10
CPU_WORLD_SIZE = 2
HOST_DEVICE_FLAG = "--xla_force_host_platform_device_count"


def force_host_devices():
    """Give the host (CPU) platform two devices, for the CPU all-reduce.

    Must happen before jax is imported.  Whether a GPU will be used is not
    known yet, so this is done unconditionally: the flag only affects the
    host platform and is harmless when the default backend is a GPU.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if HOST_DEVICE_FLAG not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {HOST_DEVICE_FLAG}={CPU_WORLD_SIZE}".strip()


def log(msg):
    sys.stderr.write(f"[jax_smoke] {msg}\n")
    sys.stderr.flush()


def describe_exc(exc):
    text = str(exc).strip()
    # Keep error entries to one readable line (XLA/NCCL messages can be long).
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
# versions and devices


def cuda_version_string(v):
    """12090 -> '12.9'."""
    if v is None:
        return None
    major, rest = divmod(int(v), 1000)
    return f"{major}.{rest // 10}"


def cudnn_version_string(v):
    """90800 -> '9.8.0', 8902 -> '8.9.2'."""
    if v is None:
        return None
    v = int(v)
    if v >= 90000:  # cuDNN >= 9: major*10000 + minor*100 + patch
        major, rest = divmod(v, 10000)
    else:  # cuDNN <= 8: major*1000 + minor*100 + patch
        major, rest = divmod(v, 1000)
    minor, patch = divmod(rest, 100)
    return f"{major}.{minor}.{patch}"


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
        ("cudnn", "cudnn_get_version", cudnn_version_string),
        ("nccl", "nccl_get_version", nccl_version_string),
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

    # Same init as torch.nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    params = []
    sizes = [d_in, d_hidden, d_hidden, 1]
    for i in range(len(sizes) - 1):
        fan_in, fan_out = sizes[i], sizes[i + 1]
        kp, k1, k2 = jax.random.split(kp, 3)
        bound = 1.0 / math.sqrt(fan_in)
        params.append(
            {
                "w": jax.random.uniform(k1, (fan_in, fan_out), jnp.float32, -bound, bound),
                "b": jax.random.uniform(k2, (fan_out,), jnp.float32, -bound, bound),
            }
        )
    params = jax.device_put(params, device)
    velocity = jax.tree_util.tree_map(jnp.zeros_like, params)

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

    lr_arr = jnp.asarray(lr, jnp.float32)
    losses = []
    train["losses"] = losses
    t0 = time.perf_counter()
    for _ in range(train["steps"]):
        params, velocity, loss = step(params, velocity, x, y, lr_arr)
        losses.append(float(loss))
    jax.block_until_ready(params)
    train["seconds"] = time.perf_counter() - t0

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


def _shard_map_allreduce(jax, devs, elements):
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


def _pmap_allreduce(jax, devs, elements):
    """(fn, make) with fn a pmapped psum over ``devs``."""
    import numpy as np

    n = len(devs)
    fn = jax.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i", devices=devs)

    def make(fill):
        host = np.stack([np.full((elements,), fill(k), np.float32) for k in range(n)])
        return host  # pmap splits the leading axis over devs

    return fn, make


def _check_sum(jnp, arr, expected):
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
    if gpu_backend(jax):
        backend = "nccl"
        nbytes, warmup, iters = GPU_BYTES, GPU_WARMUP, GPU_ITERS
    else:
        backend = "cpu"
        nbytes, warmup, iters = CPU_BYTES, CPU_WARMUP, CPU_ITERS
    world = len(devs)
    elements = nbytes // 4
    expected = world * (world + 1) / 2.0
    ar.update(
        backend=backend,
        world_size=world,
        elements=elements,
        bytes=elements * 4,
        iterations=iters,
        expected=expected,
    )
    if backend == "cpu" and world < CPU_WORLD_SIZE:
        errors.append(
            f"allreduce: only {world} host device(s) although XLA_FLAGS asks for "
            f"{CPU_WORLD_SIZE} ({os.environ.get('XLA_FLAGS', '')!r}); was jax imported earlier?"
        )

    def ones_fill(k):
        return float(k + 1)

    # shard_map on a Mesh is the current API; jax.pmap (deprecated in newer
    # releases) is the fallback for a jax where shard_map does not work.
    try:
        fn, make = _shard_map_allreduce(jax, devs, elements)
        first_out = jax.block_until_ready(fn(make(ones_fill)))
        ar["method"] = "shard_map/psum"
    except Exception as exc:
        log(f"shard_map all-reduce failed, trying pmap: {describe_exc(exc)}")
        traceback.print_exc(file=sys.stderr)
        fn, make = _pmap_allreduce(jax, devs, elements)
        first_out = jax.block_until_ready(fn(make(ones_fill)))
        ar["method"] = f"pmap/psum (shard_map failed: {describe_exc(exc)[:200]})"

    # correctness on fresh buffers
    correct1, got1 = _check_sum(jnp, first_out, expected)
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
    correct2, got2 = _check_sum(jnp, jax.block_until_ready(fn(make(ones_fill))), expected)

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
        "jaxlib": None,
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

    jax = None
    try:
        force_host_devices()
        import jax
    except BaseException as exc:  # a broken jax may raise anything
        errors.append("import: " + describe_exc(exc))
        traceback.print_exc(file=sys.stderr)

    if jax is not None:
        train["steps"] = steps_from_env(errors)
        sections = [
            ("versions", lambda: collect_versions(jax, versions, errors)),
            ("devices", lambda: devices.extend(collect_devices(jax))),
            ("train", lambda: run_train(jax, train)),
            ("allreduce", lambda: run_allreduce(jax, allreduce, errors, versions)),
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
    # or XLA's own shutdown, must neither block the exit nor change
    # its status after the report went out.
    os._exit(code)
