"""`nccl_allreduce`: all-reduce across all visible GPUs (NCCL), or 2 CPU processes (gloo).

One GPU (or one MIG slice: CUDA gives a process one instance) is a single-rank check: NCCL
starts and sums, and there is no bandwidth to report. With several GPUs the bus bandwidth of
a 64 MiB all-reduce must reach the GPU family's floor, and the transport NCCL chose (read from
its own debug output) is recorded. GPUs that the driver lists but CUDA does not see make the
check `degraded`.
"""

from __future__ import annotations

import glob
import json
import os
import re
import socket
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from smoke import DEGRADED, FAIL, PASS
from smoke.checks.common import (
    gpu_available,
    host,
    result,
    shm_warning,
    stand_in_status,
    summarize,
)

GPU_NUMEL = 16 * 2**20  # 64 MiB of float32: a mid-size message
CPU_NUMEL = 2**20
CPU_WORLD = 2
# /dev/shm NCCL needs per rank for its SHM transport and proxy buffers (Docker's default is
# 64 MB); one node's ranks share it.
SHM_PER_RANK = 512 * 2**20
SHM_FLOOR = 1 << 30
# Bus-bandwidth floors (GB/s) of a 64 MiB all-reduce within one node, first match wins: well
# under what a healthy node of the family reaches, well over what it reaches when its NVLinks
# are down and NCCL falls back to PCIe or shared memory. PCIe cards first ("H100 PCIe").
BUSBW_FLOORS: tuple[tuple[str, float], ...] = (
    ("PCIe", 3.0), ("NVL", 3.0),
    ("GB300", 150.0), ("GB200", 150.0), ("B300", 150.0), ("B200", 150.0),
    ("GH200", 40.0), ("H200", 100.0), ("H100", 100.0), ("H800", 60.0), ("H20", 100.0),
    ("A100-SXM", 60.0), ("A800-SXM", 40.0),
)
DEFAULT_FLOOR = 1.0  # any family: below this something is badly wrong


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def shm_needed(world: int) -> int:
    return max(SHM_FLOOR, world * SHM_PER_RANK)


def shm_problem(ctx: dict[str, Any], world: int) -> str | None:
    """Checked before NCCL starts: too small a /dev/shm makes ranks die with SIGBUS or
    `unhandled system error`, which says nothing about the cause."""
    size = host(ctx).get("shm_bytes")
    if world < 2 or size is None or size >= shm_needed(world):
        return None
    return (
        f"/dev/shm is {size / 2**20:.0f} MiB, NCCL needs {shm_needed(world) / 2**30:.0f} GiB "
        f"for {world} ranks: run the container with --shm-size=8g or --ipc=host (Kubernetes: "
        "an emptyDir with medium Memory on /dev/shm)"
    )


def hidden_gpus(ctx: dict[str, Any], world: int) -> str | None:
    """GPUs the driver lists (or the container was given) that CUDA does not see."""
    gpus = host(ctx).get("gpus") or []
    if any(g.get("mig") for g in gpus):
        return None  # a MIG GPU: one instance per process is all CUDA offers
    present = len(gpus) or len(host(ctx).get("nvidia_devices") or [])
    if present <= world:
        return None
    visible = host(ctx).get("cuda_visible_devices")
    why = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
    return (f"{present} GPUs are on this node but CUDA sees {world}{why}: traffic between "
            "the others was not tested")


def floor_for(name: str) -> float:
    return next((floor for key, floor in BUSBW_FLOORS if key.lower() in name.lower()),
                DEFAULT_FLOOR)


def transports(log_text: str) -> list[str]:
    """The transports NCCL reports in its INFO output: `via P2P/CUMEM/read` → P2P, `via
    NET/IB/0` → NET/IB, `via SHM/direct/direct` → SHM; NVLS (NVLink SHARP) when connected."""
    found = set()
    for match in re.finditer(r"\bvia ([A-Za-z0-9_]+)(?:/([A-Za-z0-9_]+))?", log_text):
        kind, sub = match.groups()
        found.add(f"{kind}/{sub}" if kind == "NET" and sub else kind)
    if re.search(r"Connected NVLS|NVLS comm", log_text):
        found.add("NVLS")
    return sorted(found)


def nccl_log_text() -> str:
    """What NCCL wrote into NCCL_DEBUG_FILE (the runner points it at its own folder)."""
    pattern = os.environ.get("NCCL_DEBUG_FILE", "")
    if not pattern:
        return ""
    texts = []
    for path in sorted(glob.glob(re.sub(r"%[hp]", "*", pattern))):
        try:
            texts.append(Path(path).read_text(errors="replace"))
        except OSError:
            continue
    return "\n".join(texts)


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
        # One rank moves nothing: a "bandwidth" would only time a local copy.
        stats = _bandwidth(dist, torch, world, device, numel) if world > 1 else {}
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"exact": exact, **stats}))


BANDWIDTH_KEYS = ("algbw_gbps", "busbw_gbps", "time_us", "bytes")


def all_reduce(backend: str, world: int, numel: int) -> dict[str, Any]:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="smoke-nccl-") as out_dir:
        mp.spawn(_worker, args=(world, backend, free_port(), out_dir, numel), nprocs=world,
                 join=True)
        ranks = [json.loads(Path(out_dir, f"rank{r}.json").read_text()) for r in range(world)]
    metrics = {"world_size": world, "backend": backend, "exact": all(r["exact"] for r in ranks)}
    if world > 1:
        slowest = min(ranks, key=lambda r: r["algbw_gbps"])
        metrics |= {k: slowest[k] for k in BANDWIDTH_KEYS}
    return metrics


def _summary(metrics: dict[str, Any]) -> str:
    text = (f"{metrics['backend']} all-reduce over {metrics['world_size']} process(es): "
            "sum exact")
    if "busbw_gbps" in metrics:
        text += f", algbw {metrics['algbw_gbps']:.2f} GB/s, busbw {metrics['busbw_gbps']:.2f} GB/s"
    if metrics.get("transports"):
        text += f" via {'+'.join(metrics['transports'])}"
    return text


def gpu_verdict(ctx: dict[str, Any], metrics: dict[str, Any], names: list[str],
                warnings: list[str]) -> dict[str, Any]:
    """The status of an NCCL run over `names` (CUDA's devices) that summed exactly."""
    world = metrics["world_size"]
    hidden = hidden_gpus(ctx, world)
    if hidden:
        return result(DEGRADED, f"{_summary(metrics)}; {hidden}", metrics, warnings)
    if world == 1:
        mig = " (a MIG slice: CUDA gives a process one instance)" if any(
            g.get("mig") for g in host(ctx).get("gpus") or []) else ""
        return result(PASS, f"{_summary(metrics)}; single rank on the one GPU visible{mig}: "
                      "NCCL started, no inter-GPU traffic to measure", metrics, warnings)
    floor = min(floor_for(name) for name in names)
    metrics["busbw_floor_gbps"] = floor
    if metrics["busbw_gbps"] < floor:
        return result(FAIL, f"{_summary(metrics)}: below the {floor:g} GB/s floor of "
                      f"{names[0]} (NVLink down, or P2P disabled? see the transports)",
                      metrics, warnings)
    return result(PASS, f"{_summary(metrics)} (floor {floor:g} GB/s)", metrics, warnings)


def run_gpu(ctx: dict[str, Any], warnings: list[str]) -> dict[str, Any]:
    import torch

    world = torch.cuda.device_count()
    names = [torch.cuda.get_device_name(i) for i in range(world)]
    shm = shm_problem(ctx, world)
    if shm:
        return result(FAIL, shm, {"world_size": world, "shm_bytes": host(ctx).get("shm_bytes"),
                                  "shm_needed_bytes": shm_needed(world)}, warnings)
    try:
        metrics = all_reduce("nccl", world, GPU_NUMEL)
    except Exception as exc:  # a rank died: say why if we can guess, keep the rest in the tail
        hint = "; ".join(w for w in [shm_warning(ctx)] if w) or "see the NCCL_DEBUG output"
        return result(FAIL, f"NCCL all-reduce over {world} GPU(s) failed: {summarize(exc)} "
                      f"({hint})", {"world_size": world}, warnings)
    metrics["transports"] = transports(nccl_log_text())
    if not metrics["exact"]:
        return result(FAIL, "nccl all-reduce returned a wrong sum", metrics, warnings)
    return gpu_verdict(ctx, metrics, names, warnings)


def run(ctx: dict[str, Any]) -> dict[str, Any]:
    warnings = [w for w in [shm_warning(ctx)] if w]
    if gpu_available():
        return run_gpu(ctx, warnings)
    metrics = all_reduce("gloo", CPU_WORLD, CPU_NUMEL)
    if not metrics["exact"]:
        return result(FAIL, "gloo all-reduce returned a wrong sum", metrics, warnings)
    status, message = stand_in_status(ctx, _summary(metrics))
    return result(status, message, metrics, warnings)
