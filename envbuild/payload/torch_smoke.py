#!/usr/bin/env python3
"""envbuild smoke payload for PyTorch images.

Copied into a container with the other payload modules and run as ``python3
torch_smoke.py``. The harness (smoke_harness.py) prints exactly one JSON document on stdout
(all other output, including anything torch, NCCL or gloo write to fd 1, is diverted to
stderr), gives every section a deadline, and exits 0 when every check passed, 1 otherwise;
smoke_verdicts.py judges what the sections measured, alike for every framework; this file is
the torch part alone.

Sections:
  * user                -- who the payload runs as, and what it may write
                           (image_user.py);
  * versions / devices  -- what the image and the machine provide;
  * train               -- ~20 optimizer steps of a tiny MLP on a fixed batch
                           (autocast bf16/fp16 on GPU, float32 on CPU); the
                           loss has to fall;
  * allreduce           -- one process per visible GPU (NCCL), or two CPU
                           processes (gloo); SUM of (rank+1) must equal
                           n(n+1)/2 everywhere; bandwidth is measured as in
                           nccl-tests;
  * loader              -- a DataLoader with 2 worker processes feeds the step
                           1 MiB batches through /dev/shm; batches/s and the
                           /dev/shm size seen;
  * checkpoint          -- model and optimizer state saved, loaded into fresh
                           ones, training goes on where it was;
  * numpy               -- torch.from_numpy / .numpy() round trip (skipped
                           when the image has no numpy);
  * compile             -- a torch.compile'd step (inductor: C++ on CPU, triton
                           on GPU) trains, its kernels cached in the image's
                           cache folder; a missing compiler is named;
  * packages            -- every top-level module of every distribution in
                           the image's lock imports, in a child interpreter.

Only the standard library, the sibling payload modules, torch (and numpy, when installed) are
used.  Every wait on a child process has a deadline (torch_ranks.py runs the all-reduce's);
children that die or hang are killed and reported.

Knob: ENVBUILD_SMOKE_STEPS (optimizer steps, default 20, minimum 2).
"""

import math
import os
import platform
import shutil
import tempfile
import time

import image_user
import package_imports
import payload_versions
import smoke_harness as harness
import smoke_verdicts as verdicts
import torch_ranks
from smoke_harness import CHECKPOINT_STEPS, COMPILE_STEPS

PAYLOAD = "torch"

# The all-reduce's own deadline (for all children together); the section's is
# longer by the margin that stopping the children and reporting them needs.
ALLREDUCE_TIMEOUT_S = 300.0
ALLREDUCE_MARGIN_S = 30.0

# 8 batches from 2 worker processes: every batch crosses /dev/shm, LOADER_PREFETCH per worker
# at a time, in about a second.
LOADER_WORKERS = 2
# 32 MiB batches, as real training's are (a batch of 256 224x224 RGB images is 154 MB): the two
# workers' prefetched batches need more than Docker's default 64 MB /dev/shm, which is what the
# image's declared --shm-size is for (the smoke test fails without it, as training would).
LOADER_BATCHES = 8
LOADER_BATCH = 512
LOADER_FEATURES = 16384
LOADER_TIMEOUT_S = 60.0  # one batch; a worker that died or hangs fails the section
LOADER_PREFETCH = 2  # batches each worker keeps ready (torch's default), all in /dev/shm at once
# How torch says a worker could not put a batch in /dev/shm, depending on where it ran out: a
# worker killed by SIGBUS, or an allocation refused. Where the batch is pickled by the worker's
# queue thread, the refusal is printed there and the batch is dropped: the loader then waits for
# it until its timeout, or finds the worker gone.
_SHM_WORDS = ("shared memory", "No space left on device", "Bus error")
_SHM_SILENT = ("timed out", "exited unexpectedly")


def collect_versions(torch, versions, errors):
    versions["framework"] = str(torch.__version__)
    versions["cuda"] = getattr(torch.version, "cuda", None)
    if torch.cuda.is_available():
        try:
            if torch.backends.cudnn.is_available():
                versions["cudnn"] = payload_versions.cudnn_version_from(
                    torch.backends.cudnn.version()
                )
        except Exception as exc:
            errors.append("versions.cudnn: " + harness.describe_exc(exc))
    if versions["cuda"] is not None:
        try:
            versions["nccl"] = payload_versions.nccl_version_from(torch.cuda.nccl.version())
        except Exception as exc:
            errors.append("versions.nccl: " + harness.describe_exc(exc))


def collect_devices(torch):
    devices = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            devices.append(
                {
                    "kind": "cuda",
                    "index": i,
                    "name": str(props.name),
                    "memory_bytes": int(props.total_memory),
                    "capability": f"{props.major}.{props.minor}",
                }
            )
    if not devices:
        devices.append(
            {
                "kind": "cpu",
                "index": 0,
                "name": platform.processor() or platform.machine(),
                "cores": os.cpu_count(),
            }
        )
    return devices


def make_grad_scaler(torch):
    try:
        return torch.amp.GradScaler("cuda", init_scale=2.0**10)
    except (AttributeError, TypeError):
        return torch.cuda.amp.GradScaler(init_scale=2.0**10)


def run_train(torch, train):
    """Fill ``train`` in place; raise on failure."""
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    train["device"] = device.type
    amp_dtype = None
    scaler = None
    if use_cuda:
        if torch.cuda.is_bf16_supported():
            amp_dtype = torch.bfloat16
            train["dtype"] = "bfloat16"
        else:
            amp_dtype = torch.float16
            train["dtype"] = "float16"
            scaler = make_grad_scaler(torch)
        train["autocast"] = True
    else:
        train["dtype"] = "float32"
        train["autocast"] = False

    # Fixed synthetic regression batch, generated on the CPU so it is the
    # same whatever the device.
    gen = torch.Generator().manual_seed(1234)
    n, d_in, d_hidden = 512, 32, 64
    x = torch.randn(n, d_in, generator=gen)
    w_true = torch.randn(d_in, 1, generator=gen) / math.sqrt(d_in)
    y = 2.0 * torch.tanh(x @ w_true) + 0.05 * torch.randn(n, 1, generator=gen)
    x, y = x.to(device), y.to(device)

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(d_in, d_hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(d_hidden, d_hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(d_hidden, 1),
    ).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    loss_fn = torch.nn.MSELoss()

    losses = []
    train["losses"] = losses
    if use_cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(train["steps"]):
        opt.zero_grad(set_to_none=True)
        if amp_dtype is not None:
            with torch.autocast(device_type="cuda", dtype=amp_dtype):
                out = model(x)
                loss = loss_fn(out.float(), y)
        else:
            out = model(x)
            loss = loss_fn(out, y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        losses.append(float(loss.detach().float().cpu().item()))
    if use_cuda:
        torch.cuda.synchronize()
    train["seconds"] = time.perf_counter() - t0

    verdicts.judge_losses(train, losses)


def _allreduce_worker(rank, world, port, backend, elements, warmup, iters, conn):
    """One rank (a spawned process): the sum checked on a fresh buffer, the bandwidth, the sum
    checked again after the buffer was used repeatedly.  Sends one dict through ``conn``."""
    res = {"rank": rank, "ok": False, "correct": False, "got": None, "seconds": None, "error": None}
    torch_ranks.report_rank(
        conn,
        res,
        rank,
        lambda: _allreduce_rank(res, rank, world, port, backend, elements, warmup, iters),
    )


def _allreduce_rank(res, rank, world, port, backend, elements, warmup, iters):
    """The work of one smoke all-reduce rank; its findings in ``res``."""
    torch, dist, device = torch_ranks.join_process_group(
        rank, world, port, backend, ALLREDUCE_TIMEOUT_S / 2
    )
    expected = world * (world + 1) / 2.0
    t = torch.empty(elements, dtype=torch.float32, device=device)

    # correctness on a fresh buffer
    t.fill_(rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    torch_ranks.synchronize(torch, device)
    correct1, got1 = torch_ranks.check_sum(torch, t, expected)

    # bandwidth (values are irrelevant; zeros cannot overflow)
    t.zero_()
    for _ in range(warmup):
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    torch_ranks.synchronize(torch, device)
    dist.barrier()
    torch_ranks.synchronize(torch, device)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    torch_ranks.synchronize(torch, device)
    seconds = (time.perf_counter() - t0) / iters

    # correctness again after the buffer has been used repeatedly
    t.fill_(rank + 1)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    torch_ranks.synchronize(torch, device)
    correct2, got2 = torch_ranks.check_sum(torch, t, expected)

    res["correct"] = bool(correct1 and correct2)
    res["got"] = got1 if not correct1 else got2
    res["seconds"] = seconds


def run_allreduce(torch, ar, errors, timeout_s=ALLREDUCE_TIMEOUT_S):
    """Fill ``ar`` in place; append problems to ``errors``."""
    import torch.distributed as dist

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        backend, world = "nccl", torch.cuda.device_count()
    else:
        backend, world = "gloo", verdicts.CPU_WORLD_SIZE
    elements, warmup, iters = verdicts.plan_allreduce(ar, backend, gpu=backend == "nccl")
    verdicts.allreduce_world(ar, world)

    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this build")
    if backend == "nccl" and not dist.is_nccl_available():
        raise RuntimeError("CUDA devices present but NCCL backend unavailable")
    if backend == "gloo" and not dist.is_gloo_available():
        raise RuntimeError("gloo backend unavailable")

    results, missing, failed = torch_ranks.run_ranks(
        _allreduce_worker,
        world,
        (backend, elements, warmup, iters),
        time.monotonic() + timeout_s,
    )
    for rank in sorted(results):
        if results[rank].get("error"):
            errors.append("allreduce: " + results[rank]["error"])
    why = "grace period after another rank failed" if failed else f"{timeout_s:g} s"
    for rank in missing:
        errors.append(f"allreduce: rank {rank}: no result within the deadline ({why}), killed")
    all_in = len(results) == world and all(r.get("ok") for r in results.values())
    correct = all_in and all(r.get("correct") for r in results.values())
    got = None
    for rank in sorted(results):
        g = results[rank].get("got")
        if g is None:
            continue
        if got is None or not results[rank].get("correct"):
            got = g
            if not results[rank].get("correct"):
                break
    if all_in:
        verdicts.record_bandwidth(ar, max(r["seconds"] for r in results.values()))
        verdicts.record_allreduce(ar, errors, correct=correct, got=got)
    else:  # the missing or failed ranks are the errors already
        ar["got"] = got


def _regression(torch, n, d_in, seed):
    """A fixed synthetic regression batch (x, y), made on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d_in, generator=gen)
    w_true = torch.randn(d_in, 1, generator=gen) / math.sqrt(d_in)
    y = 2.0 * torch.tanh(x @ w_true) + 0.05 * torch.randn(n, 1, generator=gen)
    return x, y


def _mlp(torch, d_in, d_hidden, device):
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(d_in, d_hidden),
        torch.nn.ReLU(),
        torch.nn.Linear(d_hidden, 1),
    ).to(device)


def compiler_problem(exc, use_cuda):
    """The cause, in a user's words, when torch.compile failed for want of a toolchain; else None."""
    text = f"{type(exc).__name__}: {exc}"
    if "Python.h" in text:
        return "torch.compile needs Python's C headers (Python.h, e.g. libpython3-dev) in the image"
    if use_cuda and ("Failed to find C compiler" in text or "CC environment" in text):
        return "torch.compile needs a C compiler (gcc) in the image for triton's launcher"
    if "InvalidCxxCompiler" in text or "No working C++ compiler" in text:
        return "torch.compile needs a C++ compiler (g++) in the image"
    return None


def fresh_inductor_cache():
    """A fresh inductor cache, so that the kernels really are built here, never taken from an
    earlier run; made inside the folder the image names for it (TORCHINDUCTOR_CACHE_DIR), so that
    a compiled step proves the image's user can cache kernels where the image says."""
    configured = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if configured:
        os.makedirs(configured, exist_ok=True)
    folder = tempfile.mkdtemp(prefix="envbuild-inductor-", dir=configured or None)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
    return folder


def run_compile(torch, part, steps=COMPILE_STEPS):
    """Fill ``part``: a torch.compile'd training step (inductor: C++ on CPU, triton on GPU)
    trains and its loss falls; raise with the cause when the image cannot compile."""
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
    part["device"] = device.type
    part["backend"] = "inductor/triton" if use_cuda else "inductor/c++"
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    part["compiler"] = cxx
    if not use_cuda and cxx is None:
        raise RuntimeError("torch.compile needs a C++ compiler (g++) in the image: no g++ on PATH")
    import torch._inductor.config as inductor_config

    part["cache_dir"] = fresh_inductor_cache()
    # One process compiles (no worker pool to start on a small host); on the CPU without
    # vectorization probes (a dozen extra compiler runs), which keeps the section to seconds.
    inductor_config.compile_threads = 1
    if not use_cuda and hasattr(inductor_config.cpp, "vec_isa_ok"):
        inductor_config.cpp.vec_isa_ok = False
    part["vectorized"] = bool(use_cuda)

    x, y = _regression(torch, 512, 32, seed=4321)
    x, y = x.to(device), y.to(device)
    model = _mlp(torch, 32, 64, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    def step(xb, yb):
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        return loss

    compiled = torch.compile(step)
    losses = []
    part["losses"] = losses
    t0 = time.perf_counter()
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        try:
            loss = compiled(x, y)
        except Exception as exc:
            cause = compiler_problem(exc, use_cuda) if i == 0 else None
            if cause is None:
                raise
            raise RuntimeError(f"{cause}: {harness.describe_exc(exc)}") from exc
        opt.step()
        losses.append(float(loss.detach().float().cpu().item()))
        if use_cuda:
            torch.cuda.synchronize()
        if i == 0:
            part["compile_seconds"] = time.perf_counter() - t0
            t1 = time.perf_counter()
    part["step_ms"] = (time.perf_counter() - t1) / max(1, steps - 1) * 1000.0
    verdicts.judge_losses(part, losses)


class _SyntheticSamples:
    """Deterministic regression samples; a map-style Dataset (the class is made a Dataset in
    run_loader, where torch is at hand). Each sample says which loader worker made it."""

    def __init__(self, torch, length, features):
        self.torch = torch
        self.length = length
        self.features = features
        gen = torch.Generator().manual_seed(99)
        self.w = torch.randn(features, 1, generator=gen) / math.sqrt(features)

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        torch = self.torch
        info = torch.utils.data.get_worker_info()
        gen = torch.Generator().manual_seed(1000 + index)
        x = torch.randn(self.features, generator=gen)
        y = torch.tanh(x @ self.w)
        return x, y, -1 if info is None else info.id


def loader_shm_problem(text, shm_bytes, workers, batch_bytes, prefetch=LOADER_PREFETCH):
    """What to tell the user when the loader failed with `text` for want of /dev/shm, or None:
    torch named it, or the loader timed out or lost a worker while /dev/shm (`shm_bytes`) is
    smaller than the batches its workers keep there at once."""
    in_flight = workers * prefetch * batch_bytes
    named = any(word in text for word in _SHM_WORDS)
    too_small = shm_bytes is not None and shm_bytes < in_flight
    if not named and not (too_small and any(word in text for word in _SHM_SILENT)):
        return None
    said = text.strip().splitlines()[0][:200] if text.strip() else "no message"
    return (
        f"the DataLoader's {workers} workers ran out of shared memory: /dev/shm holds "
        f"{shm_bytes // 2**20 if shm_bytes else '?'} MB and each batch takes "
        f"{batch_bytes // 2**20} MB there ({workers * prefetch} prefetched: "
        f"{in_flight // 2**20} MB); run the image as it was tested, with docker run "
        f"--shm-size=1g (the image's label org.envbuild.run.shm-size); torch said: {said}"
    )


def run_loader(torch, part):
    """Fill ``part``: a DataLoader with worker processes feeds the training step real batches
    (their tensors travel through /dev/shm); batches/s and /dev/shm's size are reported."""
    try:
        st = os.statvfs("/dev/shm")
        part["shm_bytes"] = st.f_frsize * st.f_blocks
        part["shm_free_bytes"] = st.f_frsize * st.f_bavail
    except OSError as exc:
        part["shm_bytes"] = None
        part["shm_error"] = harness.describe_exc(exc)
    workers, batch, features = LOADER_WORKERS, LOADER_BATCH, LOADER_FEATURES
    dataset_class = type("SyntheticSamples", (_SyntheticSamples, torch.utils.data.Dataset), {})
    dataset = dataset_class(torch, LOADER_BATCHES * batch, features)
    # fork, what torch users on Linux get by default up to Python 3.13 (3.14 defaults to
    # forkserver, which would need a picklable dataset).
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=batch,
        num_workers=workers,
        shuffle=False,
        timeout=LOADER_TIMEOUT_S,
        prefetch_factor=LOADER_PREFETCH,
        multiprocessing_context="fork",
    )
    part.update(workers=workers, batch_bytes=batch * features * 4, batches=0)
    model = _mlp(torch, features, 32, torch.device("cpu"))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses, seen = [], set()
    part["batch_losses"] = losses
    t0 = time.perf_counter()
    try:
        for x, y, worker in loader:
            seen.update(int(w) for w in worker.tolist())
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(loss.detach().item()))
            part["batches"] += 1
    except RuntimeError as exc:
        problem = loader_shm_problem(str(exc), part.get("shm_bytes"), workers, batch * features * 4)
        if problem is not None:
            raise RuntimeError(problem) from exc
        raise
    seconds = time.perf_counter() - t0
    part["seconds"] = seconds
    part["batches_per_s"] = part["batches"] / seconds if seconds > 0 else None
    part["workers_seen"] = sorted(seen)
    if sorted(seen) != list(range(workers)):
        raise RuntimeError(f"batches came from workers {sorted(seen)}, expected 0..{workers - 1}")
    # The batches differ: the verdict compares the first and the last quarter's average loss.
    window = max(1, len(losses) // 4)
    verdicts.judge_losses(part, [sum(losses[:window]) / window, sum(losses[-window:]) / window])


def run_checkpoint(torch, part, steps=CHECKPOINT_STEPS):
    """Fill ``part``: train, save model and optimizer state, load them into a fresh model and
    optimizer, go on; the resumed run gives the loss the uninterrupted one gives, and it falls."""
    x, y = _regression(torch, 256, 16, seed=777)

    def fresh():
        model = _mlp(torch, 16, 32, torch.device("cpu"))
        return model, torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)

    def train(model, opt, n):
        out = []
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            out.append(float(loss.detach().item()))
        return out

    model, opt = fresh()
    before = train(model, opt, steps)
    folder = tempfile.mkdtemp(prefix="envbuild-checkpoint-")
    path = os.path.join(folder, "checkpoint.pt")
    try:
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, path)
        part["bytes"] = os.path.getsize(path)
        state = torch.load(path, map_location="cpu")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    resumed_model, resumed_opt = fresh()
    with torch.no_grad():  # make sure the load, not the seed, is what restores the weights
        for p in resumed_model.parameters():
            p.add_(1.0)
    resumed_model.load_state_dict(state["model"])
    resumed_opt.load_state_dict(state["optimizer"])
    expected = train(model, opt, steps)  # the uninterrupted run
    resumed = train(resumed_model, resumed_opt, steps)
    verdicts.judge_checkpoint(part, before, expected, resumed)


def run_numpy(torch, part):
    """Fill ``part``: torch.from_numpy shares memory, .numpy() gives it back equal; skipped (not
    failed) when the image has no numpy."""
    import importlib.util

    if importlib.util.find_spec("numpy") is None:
        part["skipped"] = "numpy is not installed in this image"
        part["ok"] = True
        return
    import numpy

    part["version"] = str(numpy.__version__)
    array = numpy.arange(12, dtype=numpy.float32).reshape(3, 4)
    tensor = torch.from_numpy(array)
    array[0, 0] = 42.0  # from_numpy shares the buffer
    back = (tensor * 2).numpy()
    checks = {
        "shares_memory": float(tensor[0, 0]) == 42.0,
        "round_trip": bool(numpy.array_equal(tensor.numpy(), array)),
        "dtype": tensor.dtype == torch.float32 and back.dtype == numpy.float32,
        "values": bool(numpy.array_equal(back, array * 2)),
    }
    verdicts.judge_round_trip(part, checks)


def training_parts():
    """The report's parts: the harness's training parts and what torch adds to them."""
    parts = verdicts.training_parts()
    parts["compile"].update(compiler=None, vectorized=None, cache_dir=None)
    parts["loader"].update(
        workers=LOADER_WORKERS, shm_bytes=None, shm_free_bytes=None, workers_seen=[]
    )
    return parts


def smoke(run):
    image_user.user_section(run)
    torch = run.load("torch")
    if torch is None:
        return
    run.doc["train"]["steps"] = verdicts.steps_from_env(run.errors)
    run.section(
        "versions", 120, lambda doc: collect_versions(torch, doc["versions"], doc["errors"])
    )
    run.section("devices", 60, lambda doc: doc["devices"].extend(collect_devices(torch)))
    run.section("train", 180, lambda doc: run_train(torch, doc["train"]))
    # The loader forks its workers: before compile starts inductor's threads.
    run.section("loader", 120, harness.timed("loader", lambda part: run_loader(torch, part)))
    run.section(
        "checkpoint", 60, harness.timed("checkpoint", lambda part: run_checkpoint(torch, part))
    )
    run.section("numpy", 30, harness.timed("numpy", lambda part: run_numpy(torch, part)))
    run.section("compile", 240, harness.timed("compile", lambda part: run_compile(torch, part)))
    package_imports.packages_section(run)

    def allreduce(doc):
        # Leave the section the time to stop the children and report them.
        timeout_s = min(ALLREDUCE_TIMEOUT_S, run.time_left() - ALLREDUCE_MARGIN_S)
        run_allreduce(torch, doc["allreduce"], doc["errors"], max(timeout_s, 1.0))

    run.section("allreduce", ALLREDUCE_TIMEOUT_S + ALLREDUCE_MARGIN_S, allreduce)


if __name__ == "__main__":
    harness.main(PAYLOAD, smoke, parts=training_parts(), checks=harness.TRAINING_CHECKS)
