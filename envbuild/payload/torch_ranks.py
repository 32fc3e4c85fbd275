"""torch.distributed ranks on one machine, for the torch payloads; runs INSIDE the container.

The smoke payload's all-reduce and the bench's run their ranks alike: one spawned process per
rank (one per GPU with NCCL, CPU_WORLD_SIZE with gloo), each joining one process group over
127.0.0.1 and sending one dict back through a pipe; the parent collects the dicts under a
deadline and kills whatever is left, so that a rank that dies or hangs is a recorded error,
never a hung payload.  Standard library only; torch is imported inside the ranks.
"""

import contextlib
import os
import socket
import sys
import time

# A rank that fails leaves the others waiting in a collective: they get this long to answer.
FAILED_RANK_GRACE_S = 15.0


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now: the ranks' rendezvous."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
    finally:
        s.close()


def join_process_group(rank, world, port, backend, timeout_s):
    """Make this spawned process rank ``rank`` of ``world`` (``backend`` "nccl": on GPU
    ``rank``; "gloo": on the CPU), its rendezvous 127.0.0.1:``port``, its collectives timing
    out after ``timeout_s``: (torch, torch.distributed, the rank's device).  What the process
    prints goes to stderr: nothing from a rank may reach the parent's stdout (the report)."""
    with contextlib.suppress(OSError):
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
    )
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
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    return torch, dist, device


def synchronize(torch, device):
    """Wait for the work queued on ``device`` (on the CPU a collective is done when it returns)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_sum(torch, t, expected):
    """(whether every element of ``t`` is ``expected``, the first one that is not, else it)."""
    bad = t != expected
    if not bool(bad.any()):
        return True, float(expected)
    idx = int(bad.reshape(-1).nonzero()[0].item())
    return False, float(t.reshape(-1)[idx].item())


def run_ranks(target, world, args, wait_until):
    """Spawn ``world`` processes ``target(rank, world, port, *args, conn)``, each of which sends
    one dict through ``conn``: {rank: its dict} of those that answered by ``wait_until``
    (monotonic; FAILED_RANK_GRACE_S after the first whose dict is not ``ok``), the ranks that
    did not (killed), and whether one failed.  A rank that died without a dict answers
    ``{"rank", "ok": False, "error"}``."""
    import multiprocessing
    from multiprocessing.connection import wait

    ctx = multiprocessing.get_context("spawn")
    port = free_port()
    procs, readers, results = [], {}, {}
    failed = False
    try:
        for rank in range(world):
            r, w = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=target,
                args=(rank, world, port, *args, w),
                name=f"allreduce-rank{rank}",
                daemon=True,
            )
            p.start()
            w.close()
            procs.append(p)
            readers[r] = rank
        while readers:
            remaining = wait_until - time.monotonic()
            if remaining <= 0:
                break
            for r in wait(list(readers), timeout=remaining):
                rank = readers.pop(r)
                results[rank] = _answer(r, rank, procs[rank])
                if not results[rank].get("ok") and not failed:
                    failed = True  # the others will likely hang: short grace
                    wait_until = min(wait_until, time.monotonic() + FAILED_RANK_GRACE_S)
        missing = sorted(readers.values())
    finally:
        for r in list(readers):
            r.close()
        stop_processes(procs)
    return results, missing, failed


def _answer(reader, rank, proc):
    """The dict rank ``rank`` sent, or why it sent none."""
    try:
        return reader.recv()
    except (EOFError, OSError):
        proc.join(2.0)
        return {
            "rank": rank,
            "ok": False,
            "error": f"rank {rank}: process died without a result (exitcode {proc.exitcode})",
        }
    finally:
        reader.close()


def stop_processes(procs):
    """Terminate the processes still alive, then kill those that do not end within 5 s."""
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


def report_rank(conn, res, rank, body):
    """Run ``body()`` in rank ``rank``'s spawned process: ``res["ok"]`` once it returns,
    ``res["error"]`` when it raises anything, even KeyboardInterrupt; ``res`` goes back through
    ``conn`` whatever happens, and only then is the process group left. Leaving it can hang
    once the rank that held the rendezvous store has gone (seen in CI: rank 0 reported and
    exited, rank 1 never reported); the parent stops a rank that has not ended."""
    import traceback

    import smoke_harness as harness

    try:
        body()
        res["ok"] = True
    except BaseException as exc:  # report everything, even KeyboardInterrupt
        res["error"] = f"rank {rank}: {harness.describe_exc(exc)}"
        traceback.print_exc(file=sys.stderr)
    with contextlib.suppress(Exception):
        conn.send(res)
        conn.close()
    if res.get("ok"):
        with contextlib.suppress(Exception):
            import torch.distributed as dist

            dist.destroy_process_group()
