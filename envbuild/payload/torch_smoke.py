#!/usr/bin/env python3
"""envbuild smoke payload for PyTorch images.

Copied into a container beside smoke_harness.py and run as ``python3
torch_smoke.py``.  The harness prints exactly one JSON document on stdout (all
other output, including anything torch, NCCL or gloo write to fd 1, is
diverted to stderr), gives every section a deadline, and exits 0 when every
check passed, 1 otherwise; this file is the torch part alone.

Sections:
  * versions / devices  -- what the image and the machine provide;
  * train               -- ~20 optimizer steps of a tiny MLP on a fixed batch
                           (autocast bf16/fp16 on GPU, float32 on CPU); the
                           loss has to fall;
  * allreduce           -- one process per visible GPU (NCCL), or two CPU
                           processes (gloo); SUM of (rank+1) must equal
                           n(n+1)/2 everywhere; bandwidth is measured as in
                           nccl-tests.

Only the standard library, the harness and torch are used.  Every wait on a
child process has a deadline; children that die or hang are killed and
reported.

Knob: ENVBUILD_SMOKE_STEPS (optimizer steps, default 20, minimum 2).
"""

import contextlib
import math
import os
import platform
import socket
import sys
import time
import traceback

import smoke_harness as harness

PAYLOAD = "torch"

# The all-reduce's own deadline (for all children together); the section's is
# longer by the margin that stopping the children and reporting them needs.
ALLREDUCE_TIMEOUT_S = 300.0
ALLREDUCE_MARGIN_S = 30.0
ALLREDUCE_GRACE_S = 15.0  # how long to wait for the others once a rank failed


# --------------------------------------------------------------------------
# versions and devices


def collect_versions(torch, versions, errors):
    versions["framework"] = str(torch.__version__)
    versions["cuda"] = getattr(torch.version, "cuda", None)
    if torch.cuda.is_available():
        try:
            if torch.backends.cudnn.is_available():
                versions["cudnn"] = harness.cudnn_version_from(torch.backends.cudnn.version())
        except Exception as exc:
            errors.append("versions.cudnn: " + harness.describe_exc(exc))
    if versions["cuda"] is not None:
        try:
            versions["nccl"] = harness.nccl_version_from(torch.cuda.nccl.version())
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


# --------------------------------------------------------------------------
# training step


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

    harness.judge_losses(train, losses)


# --------------------------------------------------------------------------
# all-reduce


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def _check_sum(torch, t, expected):
    bad = t != expected
    if not bool(bad.any()):
        return True, float(expected)
    idx = int(bad.reshape(-1).nonzero()[0].item())
    return False, float(t.reshape(-1)[idx].item())


def _allreduce_worker(rank, world, backend, port, elements, warmup, iters, conn):
    """Child process body (spawn context).  Sends one dict through ``conn``."""
    try:
        os.dup2(2, 1)  # nothing from a child may reach the parent's stdout
        sys.stdout = sys.stderr
    except OSError:
        pass
    res = {"rank": rank, "ok": False, "correct": False, "got": None, "seconds": None, "error": None}
    try:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        os.environ["RANK"] = str(rank)
        os.environ["LOCAL_RANK"] = str(rank)
        os.environ["WORLD_SIZE"] = str(world)
        if backend == "gloo":
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import datetime

        import torch
        import torch.distributed as dist

        if backend == "nccl":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        else:
            device = torch.device("cpu")
        dist.init_process_group(
            backend=backend,
            init_method="env://",
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=ALLREDUCE_TIMEOUT_S / 2),
        )

        def sync():
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        expected = world * (world + 1) / 2.0
        t = torch.empty(elements, dtype=torch.float32, device=device)

        # correctness on a fresh buffer
        t.fill_(rank + 1)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        sync()
        correct1, got1 = _check_sum(torch, t, expected)

        # bandwidth (values are irrelevant; zeros cannot overflow)
        t.zero_()
        for _ in range(warmup):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        sync()
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        sync()
        seconds = (time.perf_counter() - t0) / iters

        # correctness again after the buffer has been used repeatedly
        t.fill_(rank + 1)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        sync()
        correct2, got2 = _check_sum(torch, t, expected)

        res["correct"] = bool(correct1 and correct2)
        res["got"] = got1 if not correct1 else got2
        res["seconds"] = seconds
        res["ok"] = True
        with contextlib.suppress(Exception):
            dist.destroy_process_group()
    except BaseException as exc:  # report everything, even KeyboardInterrupt
        res["error"] = f"rank {rank}: {harness.describe_exc(exc)}"
        traceback.print_exc(file=sys.stderr)
    try:
        conn.send(res)
        conn.close()
    except Exception:
        pass


def _stop(procs):
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 5.0
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(5.0)


def run_allreduce(torch, ar, errors, timeout_s=ALLREDUCE_TIMEOUT_S):
    """Fill ``ar`` in place; append problems to ``errors``."""
    import multiprocessing
    from multiprocessing.connection import wait

    import torch.distributed as dist

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        backend, world = "nccl", torch.cuda.device_count()
    else:
        backend, world = "gloo", harness.CPU_WORLD_SIZE
    elements, warmup, iters = harness.plan_allreduce(ar, backend, gpu=backend == "nccl")
    harness.allreduce_world(ar, world)

    if not dist.is_available():
        raise RuntimeError("torch.distributed is not available in this build")
    if backend == "nccl" and not dist.is_nccl_available():
        raise RuntimeError("CUDA devices present but NCCL backend unavailable")
    if backend == "gloo" and not dist.is_gloo_available():
        raise RuntimeError("gloo backend unavailable")

    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs, readers, results, missing = [], {}, {}, []
    failed = False
    try:
        for rank in range(world):
            r, w = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=_allreduce_worker,
                args=(rank, world, backend, port, elements, warmup, iters, w),
                name=f"allreduce-rank{rank}",
                daemon=True,
            )
            p.start()
            w.close()
            procs.append(p)
            readers[r] = rank

        deadline = time.monotonic() + timeout_s
        while readers:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for r in wait(list(readers), timeout=remaining):
                rank = readers.pop(r)
                try:
                    res = r.recv()
                except (EOFError, OSError):
                    procs[rank].join(2.0)
                    res = {
                        "rank": rank,
                        "ok": False,
                        "correct": False,
                        "got": None,
                        "seconds": None,
                        "error": f"rank {rank}: process died without a result "
                        f"(exitcode {procs[rank].exitcode})",
                    }
                finally:
                    r.close()
                results[rank] = res
                if not res.get("ok") and not failed:
                    failed = True  # the others will likely hang: short grace
                    deadline = min(deadline, time.monotonic() + ALLREDUCE_GRACE_S)
        missing = sorted(readers.values())
    finally:
        for r in list(readers):
            r.close()
        _stop(procs)

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
        harness.record_bandwidth(ar, max(r["seconds"] for r in results.values()))
        harness.record_allreduce(ar, errors, correct=correct, got=got)
    else:  # the missing or failed ranks are the errors already
        ar["got"] = got


# --------------------------------------------------------------------------


def smoke(run):
    torch = run.load("torch")
    if torch is None:
        return
    run.doc["train"]["steps"] = harness.steps_from_env(run.errors)
    run.section(
        "versions", 120, lambda doc: collect_versions(torch, doc["versions"], doc["errors"])
    )
    run.section("devices", 60, lambda doc: doc["devices"].extend(collect_devices(torch)))
    run.section("train", 180, lambda doc: run_train(torch, doc["train"]))

    def allreduce(doc):
        # Leave the section the time to stop the children and report them.
        timeout_s = min(ALLREDUCE_TIMEOUT_S, run.time_left() - ALLREDUCE_MARGIN_S)
        run_allreduce(torch, doc["allreduce"], doc["errors"], max(timeout_s, 1.0))

    run.section("allreduce", ALLREDUCE_TIMEOUT_S + ALLREDUCE_MARGIN_S, allreduce)


if __name__ == "__main__":
    harness.main(PAYLOAD, smoke)
