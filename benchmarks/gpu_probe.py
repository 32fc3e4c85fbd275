"""Run envbuild's smoke payloads and the training paths they will check on a real GPU.

For a machine with an NVIDIA GPU and a CUDA torch in its python3 but no Docker (the device
machine lent to some sessions): the payloads run directly, as they do inside an image.
Prints one line per figure and writes everything to $OUT/gpu_probe.json (or ./gpu_probe.json).

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_probe.py [SECTION ...]   (all without one)

Sections (each on its own, a failure is recorded and the rest go on):
  payload-torch, payload-jax  the smoke payloads as `envbuild smoke` runs them (JSON report)
  payload-cuda-static  the static CUDA payload over this python's site-packages
  compile   a torch.compile'd training step on the GPU (inductor + triton): compile time,
            step time against eager, the loss falls
  amp       bf16 matrix product throughput; an autocast training step against float32
  loader    DataLoader with 2 worker processes feeding GPU steps; /dev/shm's size
  checkpoint  save model + optimizer, load into a fresh model, the loss goes on falling
  bench     the torch bench payload as `envbuild bench` runs it (ENVBUILD_BENCH_BUDGET_S
            150): fp32, bf16 and fp16 with loss scaling, the batch sweeps, NCCL over every GPU
  bench-oom the same under a cap of 1 GiB of GPU memory
            (torch.cuda.set_per_process_memory_fraction), so that the batch sweeps end where
            CUDA runs out of memory, as on a smaller card
  static    cuda_static.py against the installed CUDA libraries: the fatbin targets of
            libtorch_cuda.so against torch.cuda.get_arch_list() and cuobjdump; the versions
            cuDNN, NCCL, cuBLAS and the CUDA runtime report about themselves
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
PAYLOADS = REPO / "envbuild" / "payload"
sys.path.insert(0, str(PAYLOADS))

RESULTS: dict[str, Any] = {}
OUT = Path(os.environ.get("OUT", "."))


def section(name: str):  # type: ignore[no-untyped-def]
    def wrap(function):  # type: ignore[no-untyped-def]
        def run() -> None:
            started = time.perf_counter()
            try:
                RESULTS[name] = {"ok": True, **function()}
            except Exception as exc:
                traceback.print_exc()
                RESULTS[name] = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
            RESULTS[name]["seconds"] = round(time.perf_counter() - started, 2)
            print(f"[{name}] {json.dumps(RESULTS[name], default=str)[:1500]}", flush=True)
            # Written after every section: a run stopped at its time limit keeps what it had.
            OUT.mkdir(parents=True, exist_ok=True)
            (OUT / "gpu_probe.json").write_text(json.dumps(RESULTS, indent=2, default=str))

        return run

    return wrap


def payload(
    name: str, timeout: float, *args: str, env: dict[str, str] | None = None, prelude: str = ""
) -> dict[str, Any]:
    """Run payload `name` as the image runs it; `prelude`: Python run first, in its process."""
    started = time.perf_counter()
    command = [sys.executable, str(PAYLOADS / name), *args]
    if prelude:
        run_it = f"import runpy, sys; sys.argv = {[name, *args]!r}; runpy.run_path({name!r}, run_name='__main__')"
        command = [sys.executable, "-c", f"{prelude}\n{run_it}"]
    process = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(PAYLOADS),
        check=False,
        env={**os.environ, **(env or {})},
    )
    wall = time.perf_counter() - started
    report = json.loads(process.stdout)
    return {
        "exit": process.returncode,
        "wall_s": round(wall, 2),
        "report": report,
        "stderr_tail": process.stderr[-1500:],
    }


@section("environment")
def environment() -> dict[str, Any]:
    import torch

    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap", "--format=csv,noheader"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    props = torch.cuda.get_device_properties(0)
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "gpu": props.name,
        "capability": f"{props.major}.{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
        "gpus": torch.cuda.device_count(),
        "arch_list": torch.cuda.get_arch_list(),
        "nvidia_smi": smi.stdout.strip(),
        "shm_bytes": shutil.disk_usage("/dev/shm").total if Path("/dev/shm").is_dir() else None,
        "cc": shutil.which("cc") or shutil.which("gcc"),
    }


@section("payload-torch")
def payload_torch() -> dict[str, Any]:
    return payload("torch_smoke.py", 300)


@section("payload-jax")
def payload_jax() -> dict[str, Any]:
    return payload("jax_smoke.py", 240)


@section("payload-cuda-static")
def payload_cuda_static() -> dict[str, Any]:
    return payload("cuda_static.py", 300, "torch")


BENCH_BUDGET_S = 150
OOM_CAP_BYTES = 2**30


def bench_summary(run: dict[str, Any]) -> dict[str, Any]:
    """What the bench measured, in short: the throughput per model and precision, where each
    batch sweep stopped, the all-reduce; then the whole report, kept in gpu_probe.json."""
    report = run["report"]
    throughput = {
        f"{r.get('model')} {r.get('precision')}": (
            f"{r['median']:.0f} samples/s, loss {r.get('loss')}"
            if r.get("median")
            else r.get("unsupported") or r.get("skipped") or r
        )
        for r in report.get("throughput", {}).get("results", [])
    }
    sweeps = {
        f"{s['model']} {s['precision']}": {
            "points": [(p["batch"], round(p["peak_bytes"] / 2**30, 2)) for p in s["points"]],
            "largest_fit": s["largest_fit"],
            "stopped": s["stopped"],
        }
        for s in report.get("batch", {}).get("sweeps", [])
    }
    allreduce = report.get("allreduce", {})
    points = allreduce.get("points") or []
    return {
        "exit": run["exit"],
        "wall_s": run["wall_s"],
        "status": report.get("status"),
        "errors": report.get("errors"),
        "skipped": report.get("skipped"),
        "throughput": throughput,
        "sweeps": sweeps,
        "allreduce": {
            "backend": allreduce.get("backend"),
            "world_size": allreduce.get("world_size"),
            "correct": allreduce.get("correct"),
            "sizes": len(points),
            "largest": points[-1] if points else None,
        },
        "stderr_tail": run["stderr_tail"],
        # Last, so that the printed line shows the summary: the whole report, for the advice
        # (envbuild.bench.advice reads the sweeps' medians, which the summary leaves out).
        "report": report,
    }


@section("bench")
def bench_run() -> dict[str, Any]:
    budget = {"ENVBUILD_BENCH_BUDGET_S": str(BENCH_BUDGET_S)}
    return bench_summary(payload("torch_bench.py", BENCH_BUDGET_S + 120, env=budget))


@section("bench-oom")
def bench_oom() -> dict[str, Any]:
    import torch

    fraction = OOM_CAP_BYTES / torch.cuda.get_device_properties(0).total_memory
    prelude = f"import torch; torch.cuda.set_per_process_memory_fraction({fraction!r})"
    budget = {"ENVBUILD_BENCH_BUDGET_S": str(BENCH_BUDGET_S)}
    run = payload("torch_bench.py", BENCH_BUDGET_S + 120, env=budget, prelude=prelude)
    return {"cap_bytes": OOM_CAP_BYTES, **bench_summary(run)}


def _model(torch, width: int = 1024):  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, width),
        torch.nn.GELU(),
        torch.nn.Linear(width, width),
        torch.nn.GELU(),
        torch.nn.Linear(width, 1),
    ).cuda()


def _batch(torch, n: int = 4096):  # type: ignore[no-untyped-def]
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, 256, generator=generator)
    y = torch.tanh(x[:, :8].sum(dim=1, keepdim=True))
    return x.cuda(), y.cuda()


def _timed_steps(torch, step, steps: int) -> tuple[list[float], float]:  # type: ignore[no-untyped-def]
    losses = []
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        losses.append(step())
    torch.cuda.synchronize()
    return losses, (time.perf_counter() - started) / steps


@section("compile")
def compile_step() -> dict[str, Any]:
    import torch

    x, y = _batch(torch)
    figures: dict[str, Any] = {}
    for mode in ("eager", "compiled"):
        model = _model(torch)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def train(model=model, optimizer=optimizer) -> torch.Tensor:  # type: ignore[no-untyped-def]
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            loss.backward()
            optimizer.step()
            return loss.detach()

        step = torch.compile(train) if mode == "compiled" else train
        torch.cuda.synchronize()
        started = time.perf_counter()
        first = step()
        torch.cuda.synchronize()
        first_s = time.perf_counter() - started
        losses, per_step = _timed_steps(torch, step, 50)
        figures[mode] = {
            "first_step_s": round(first_s, 3),
            "step_ms": round(per_step * 1e3, 3),
            "loss_first": round(float(first), 5),
            "loss_last": round(float(losses[-1]), 5),
        }
    assert figures["compiled"]["loss_last"] < figures["compiled"]["loss_first"], "loss did not fall"
    return figures


@section("amp")
def amp() -> dict[str, Any]:
    import torch

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        a @ b
    stop.record()
    torch.cuda.synchronize()
    tflops = 2 * n**3 * 10 / (start.elapsed_time(stop) / 1e3) / 1e12
    x, y = _batch(torch, 16384)
    figures: dict[str, Any] = {"bf16_matmul_tflops": round(tflops, 1)}
    for dtype in (None, torch.bfloat16):
        model = _model(torch, 4096)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

        def train(model=model, optimizer=optimizer, dtype=dtype) -> torch.Tensor:  # type: ignore[no-untyped-def]
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            loss.backward()
            optimizer.step()
            return loss.detach()

        train()
        losses, per_step = _timed_steps(torch, train, 30)
        name = "bf16_autocast" if dtype is not None else "float32"
        figures[f"{name}_step_ms"] = round(per_step * 1e3, 3)
        figures[f"{name}_loss_fell"] = bool(losses[-1] < losses[0])
    return figures


class _Synthetic:
    def __init__(self, n: int, width: int) -> None:
        self.n, self.width = n, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):  # type: ignore[no-untyped-def]
        import torch

        generator = torch.Generator().manual_seed(index)
        x = torch.randn(self.width, generator=generator)
        return x, torch.tanh(x[:8].sum()).unsqueeze(0)


@section("loader")
def loader() -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader

    figures: dict[str, Any] = {}
    for workers in (0, 2):
        data = DataLoader(
            _Synthetic(256 * 64, 256), batch_size=256, num_workers=workers, pin_memory=True,
            persistent_workers=workers > 0,
        )  # fmt: skip
        model = _model(torch)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        started = time.perf_counter()
        for x, y in data:
            x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
        seconds = time.perf_counter() - started
        figures[f"workers_{workers}"] = {
            "batches": len(losses),
            "batches_per_s": round(len(losses) / seconds, 1),
            "loss_fell": losses[-1] < losses[0],
        }
    return figures


@section("checkpoint")
def checkpoint() -> dict[str, Any]:
    import torch

    x, y = _batch(torch)
    model = _model(torch)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def train(model, optimizer, steps):  # type: ignore[no-untyped-def]
        out = []
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            out.append(float(loss))
        return out

    before = train(model, optimizer, 20)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "ckpt.pt"
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, path)
        size = path.stat().st_size
        state = torch.load(path, map_location="cuda", weights_only=True)
    fresh = _model(torch)
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    fresh.load_state_dict(state["model"])
    fresh_optimizer.load_state_dict(state["optimizer"])
    after = train(fresh, fresh_optimizer, 5)
    assert after[0] <= before[-1] * 1.05, f"resumed at {after[0]}, left at {before[-1]}"
    return {"bytes": size, "loss_at_save": before[-1], "loss_resumed": after[:2]}


def _site_libraries(pattern: str) -> list[str]:
    import torch

    site = Path(torch.__file__).resolve().parents[1]
    return sorted(str(path) for path in site.rglob(pattern))


@section("static")
def static() -> dict[str, Any]:
    import cuda_static
    import torch

    figures: dict[str, Any] = {}
    library = str(Path(torch.__file__).parent / "lib" / "libtorch_cuda.so")
    started = time.perf_counter()
    targets = cuda_static.fatbin_targets(library)
    figures["libtorch_cuda"] = {
        "bytes": Path(library).stat().st_size,
        "read_s": round(time.perf_counter() - started, 2),
        "targets": targets.describe() if targets else None,
    }
    listed = torch.cuda.get_arch_list()
    sass = {int(a[3:]) for a in listed if a.startswith("sm_")}
    ptx = {int(a[8:]) for a in listed if a.startswith("compute_")}
    figures["arch_list"] = listed
    figures["arch_list_agrees"] = bool(targets) and sass <= set(targets.sass) and ptx <= set(targets.ptx)  # fmt: skip
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump:
        out = subprocess.run(
            [cuobjdump, "--list-elf", "--list-ptx", library],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        elf = {int(m) for m in re.findall(r"\.sm_(\d+)[a-z]?\.cubin", out.stdout)}
        ptx_listed = {int(m) for m in re.findall(r"\.sm_(\d+)[a-z]?\.ptx", out.stdout)}
        figures["cuobjdump"] = {
            "sass": sorted(elf),
            "ptx": sorted(ptx_listed),
            "agrees": bool(targets) and elf == set(targets.sass) and ptx_listed == set(targets.ptx),
            "exit": out.returncode,
            "stderr": out.stderr[-300:],
        }
    versions: dict[str, Any] = {}
    for pattern, symbol in (
        ("libcudnn.so*", "cudnnGetVersion"),
        ("libnccl.so*", "ncclGetVersion"),
        ("libcudart.so*", "cudaRuntimeGetVersion"),
        ("libcublas.so*", "cublasGetVersion_v2"),
    ):
        found = _site_libraries(pattern)
        if not found:
            versions[symbol] = "no library"
            continue
        try:
            versions[symbol] = {"library": found[0], "version": cuda_static.library_version(found[0], symbol)}  # fmt: skip
        except Exception as exc:
            versions[symbol] = f"{found[0]}: {type(exc).__name__}: {exc}"
    versions["torch_says"] = {
        "cudnn": torch.backends.cudnn.version(),
        "nccl": list(torch.cuda.nccl.version()),
        "cuda": torch.version.cuda,
    }
    figures["versions"] = versions
    others = {}
    for path in _site_libraries("lib*.so*")[:400]:
        try:
            found_targets = cuda_static.fatbin_targets(path)
        except Exception as exc:
            others[Path(path).name] = f"error {exc}"[:200]
            continue
        if found_targets is not None:
            others[Path(path).name] = found_targets.describe()
    figures["libraries_with_gpu_code"] = others
    return figures


SECTIONS = {
    "environment": environment,
    "payload-torch": payload_torch,
    "payload-jax": payload_jax,
    "payload-cuda-static": payload_cuda_static,
    "static": static,
    "compile": compile_step,
    "amp": amp,
    "loader": loader,
    "checkpoint": checkpoint,
    "bench": bench_run,
    "bench-oom": bench_oom,
}


def main() -> None:
    asked = sys.argv[1:] or list(SECTIONS)
    unknown = [name for name in asked if name not in SECTIONS]
    if unknown:
        sys.exit(f"gpu_probe: no section {unknown[0]!r}; sections: {', '.join(SECTIONS)}")
    for name in asked:
        SECTIONS[name]()
    print("sections ok:", {name: result["ok"] for name, result in RESULTS.items()})


if __name__ == "__main__":
    main()
