"""`cuda`: every visible GPU runs a kernel this torch was built for."""

from __future__ import annotations

from typing import Any

from smoke import FAIL, PASS, SKIP
from smoke.checks.common import accelerator, errors, gpu_available, no_gpu_reason, result
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


def probe_device(index: int, arch_list: list[str]) -> tuple[dict[str, Any], str | None]:
    import torch

    name = torch.cuda.get_device_name(index)
    cap = torch.cuda.get_device_capability(index)
    info: dict[str, Any] = {"index": index, "name": name, "capability": f"{cap[0]}.{cap[1]}"}
    if not arch_supported(cap, arch_list):
        return info, no_kernel_message(name, cap, arch_list)
    try:
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
    return result(PASS, f"{len(devices)} GPU(s) ran a matmul: {names}", metrics)
