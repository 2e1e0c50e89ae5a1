"""`cuda`: every visible GPU runs torch's own kernels and a cuBLAS matmul.

Its `devices` metric (what CUDA used: name, compute capability, memory, MIG) is what the report's
`host.cuda_devices` records; nvidia-smi's list may order or count GPUs differently.
"""

from __future__ import annotations

import os
from typing import Any

from smoke import FAIL, PASS, SKIP
from smoke.checks.common import (
    accelerator,
    cuda_cannot_start,
    errors,
    gpu_available,
    no_gpu_reason,
    result,
)
from smoke.versions import arch_supported

MATMUL_TOL = 1e-4  # fp32 with TF32 off, relative to the reference's scale


def no_kernel_message(name: str, cap: tuple[int, int], arch_list: list[str]) -> str:
    return (
        f"no kernel image for {name} (sm_{cap[0]}{cap[1]}): this torch was built for "
        f"{', '.join(arch_list) or 'no architectures'}; use a torch build that includes it"
    )


def matmul_error(device: int) -> float:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(512, 512, generator=gen)
    ref = a.double() @ a.double()
    on_gpu = a.to(f"cuda:{device}")
    out = on_gpu @ on_gpu
    torch.cuda.synchronize(device)
    return errors(out, ref)[1]


def kernel_ok(device: int) -> bool:
    """torch's own compiled kernels (arange, mul, add, a reduction), exact in int64: a GPU
    that torch has no kernel image for fails here even where cuBLAS would run."""
    import torch

    n = 1 << 20
    x = torch.arange(n, device=f"cuda:{device}", dtype=torch.int64)
    return int((x * 3 + 1).sum().item()) == 3 * n * (n - 1) // 2 + n


def device_info(index: int) -> dict[str, Any]:
    """What CUDA uses as device `index`; a MIG slice's name says `MIG 1g.10gb`."""
    import torch

    props = torch.cuda.get_device_properties(index)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    return {"index": index, "name": props.name, "capability": f"{props.major}.{props.minor}",
            "memory": int(props.total_memory) // 2**20,
            "mig": " MIG " in f" {props.name} " or visible.startswith("MIG-")}


def probe_device(index: int, arch_list: list[str]) -> tuple[dict[str, Any], str | None]:
    info = device_info(index)
    name, cap = info["name"], tuple(int(p) for p in info["capability"].split("."))
    if not arch_supported((cap[0], cap[1]), arch_list):
        return info, no_kernel_message(name, (cap[0], cap[1]), arch_list)
    try:
        if not kernel_ok(index):
            return info, f"{name}: a torch kernel returned a wrong sum"
        info["matmul_rel_err"] = matmul_error(index)
    except RuntimeError as exc:
        if "no kernel image" in str(exc):
            return info, no_kernel_message(name, cap, arch_list)
        return info, f"{name}: {exc}"
    if info["matmul_rel_err"] > MATMUL_TOL:
        return info, f"{name}: matmul error {info['matmul_rel_err']:.2e} > {MATMUL_TOL:g}"
    return info, None


def run(ctx: dict[str, Any]) -> dict[str, Any]:
    if accelerator(ctx) == "cpu":
        return result(SKIP, "cpu image: no CUDA to check")
    if not gpu_available():
        broken = cuda_cannot_start(ctx)
        if broken:
            return result(FAIL, f"GPUs present but unusable: {broken}", {"device_count": 0})
        return result(SKIP, no_gpu_reason(), {"device_count": 0})
    import torch

    arch_list = torch.cuda.get_arch_list()
    probes = [probe_device(i, arch_list) for i in range(torch.cuda.device_count())]
    devices = [info for info, _ in probes]
    problems = [p for _, p in probes if p]
    metrics = {"device_count": len(devices), "devices": devices, "arch_list": arch_list}
    if problems:
        return result(FAIL, "; ".join(problems), metrics)
    names = ", ".join(f"{d['name']} (sm {d['capability']})" for d in devices)
    return result(PASS, f"{len(devices)} GPU(s) ran torch kernels and a matmul: {names}", metrics)
