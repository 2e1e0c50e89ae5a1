"""`nccl_allreduce`: all-reduce across all visible GPUs (NCCL), or 2 CPU processes (gloo)."""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from smoke import DEGRADED, FAIL, PASS
from smoke.checks.common import gpu_available, result, shm_warning, stand_in_status

GPU_NUMEL = 16 * 2**20  # 64 MiB of float32: a mid-size message
CPU_NUMEL = 2**20
CPU_WORLD = 2


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _exact_sum_ok(dist: Any, torch: Any, rank: int, world: int, device: Any) -> bool:
    """Small-integer float32 values: the sum is exact, so compare with ==."""
    base = torch.arange(4096, dtype=torch.float32, device=device) % 97
    tensor = base * (rank + 1)
    dist.all_reduce(tensor)
    return bool(torch.equal(tensor, base * (world * (world + 1) // 2)))


def _bandwidth(dist: Any, torch: Any, world: int, device: Any, numel: int) -> dict[str, float]:
    iters = 20 if device.type == "cuda" else 5
    buf = torch.ones(numel, dtype=torch.float32, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(3):
        dist.all_reduce(buf)
    sync()
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    sync()
    seconds = (time.perf_counter() - start) / iters
    algbw = buf.numel() * buf.element_size() / seconds / 1e9
    return {"algbw_gbps": algbw, "busbw_gbps": algbw * 2 * (world - 1) / world,
            "time_us": seconds * 1e6, "bytes": buf.numel() * buf.element_size()}


def _worker(rank: int, world: int, backend: str, port: int, out_dir: str, numel: int) -> None:
    # Single host: talk over loopback, which exists even with --network none.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if backend == "nccl":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=timedelta(seconds=120))
    try:
        exact = _exact_sum_ok(dist, torch, rank, world, device)
        stats = _bandwidth(dist, torch, world, device, numel)
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"exact": exact, **stats}))


def all_reduce(backend: str, world: int, numel: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="smoke-nccl-") as out_dir:
        mp.spawn(_worker, args=(world, backend, free_port(), out_dir, numel), nprocs=world,
                 join=True)
        ranks = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]
    slowest = min(ranks, key=lambda r: r["algbw_gbps"])
    return {"world_size": world, "backend": backend, "exact": all(r["exact"] for r in ranks),
            **{k: slowest[k] for k in ("algbw_gbps", "busbw_gbps", "time_us", "bytes")}}


def _summary(metrics: dict[str, Any]) -> str:
    return (f"{metrics['backend']} all-reduce over {metrics['world_size']} process(es): sum exact, "
            f"algbw {metrics['algbw_gbps']:.2f} GB/s, busbw {metrics['busbw_gbps']:.2f} GB/s")


def run(ctx: dict[str, Any]) -> dict[str, Any]:
    warnings = [w for w in [shm_warning(ctx)] if w]
    if gpu_available():
        import torch

        world = torch.cuda.device_count()
        metrics = all_reduce("nccl", world, GPU_NUMEL)
    else:
        metrics = all_reduce("gloo", CPU_WORLD, CPU_NUMEL)
    if not metrics["exact"]:
        return result(FAIL, f"{metrics['backend']} all-reduce returned a wrong sum", metrics,
                      warnings)
    if metrics["backend"] == "gloo":
        status, message = stand_in_status(ctx, _summary(metrics))
        return result(status, message, metrics, warnings)
    if metrics["world_size"] == 1:
        return result(DEGRADED, _summary(metrics) + "; only 1 GPU visible, so no inter-GPU "
                      "traffic was tested", metrics, warnings)
    return result(PASS, _summary(metrics), metrics, warnings)
