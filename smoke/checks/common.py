"""Helpers shared by the checks (imported only in check subprocesses; torch is imported lazily)."""

from __future__ import annotations

import os
from typing import Any

from smoke import FAIL, PASS, SUBSTITUTED
from smoke.facts import dropped

SHM_MIN_BYTES = 1 << 30


def result(
    status: str, message: str, metrics: dict[str, Any] | None = None,
    warnings: list[str] | None = None,
) -> dict[str, Any]:
    return {
        "status": status, "message": message, "metrics": metrics or {},
        "warnings": warnings or [],
    }


def facts(ctx: dict[str, Any]) -> dict[str, Any]:
    return ctx.get("facts") or {}


def host(ctx: dict[str, Any]) -> dict[str, Any]:
    return ctx.get("host") or {}


def dropped_items(ctx: dict[str, Any]) -> list[str]:
    return dropped(ctx.get("facts"))


def accelerator(ctx: dict[str, Any]) -> str:
    """What the image promises; without facts, what its torch was built for."""
    promised = facts(ctx).get("accelerator")
    if promised:
        return str(promised)
    import torch

    return "cuda" if torch.version.cuda else "cpu"


def gpu_available() -> bool:
    import torch

    return bool(torch.version.cuda) and torch.cuda.is_available() and torch.cuda.device_count() > 0


def gpu_device_nodes() -> list[str]:
    """`/dev/nvidia0`, `/dev/nvidia1` …: GPUs the container was given (not nvidiactl/uvm)."""
    return sorted(n for n in _dev_nvidia() if n[len("/dev/nvidia"):].isdigit())


def native_bf16() -> bool:
    """bf16 in hardware (sm_80+): `is_bf16_supported()` alone also counts emulation (sm_75)."""
    import torch

    try:
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    except TypeError:  # torch before 2.3 has no such argument and counts no emulation
        return bool(torch.cuda.is_bf16_supported())


def no_gpu_reason() -> str:
    """Why CUDA is unusable here, phrased as what the user should do."""
    import torch

    if not torch.version.cuda:
        return f"this torch ({torch.__version__}) was built without CUDA"
    if not gpu_device_nodes():
        return (
            "no GPU visible: /dev/nvidia* is absent (container started without `--gpus all`, "
            "the NVIDIA Container Toolkit is missing, or this host has no NVIDIA GPU)"
        )
    try:
        torch.cuda.init()
    except Exception as exc:  # the driver's own words are the useful part
        return cuda_init_hint(str(exc))
    return cuda_init_hint("torch.cuda.is_available() is False although /dev/nvidia* exists")


def cuda_init_hint(error: str, visible: str | None = None) -> str:
    """CUDA's start-up error with what to do about it (the usual causes on a GPU node)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    text, low = error.strip(), error.lower()
    if "803" in text or "804" in text or "forward compat" in low:
        return (
            f"CUDA could not start ({text}): the driver and this image's CUDA do not "
            "match (errors 803/804 = driver too old / forward-compatibility mismatch); upgrade "
            "the driver or use an image built for an older CUDA"
        )
    if "802" in text or "not yet initialized" in low:
        return (
            f"CUDA could not start ({text}): error 802 on an NVSwitch system (HGX/DGX) means "
            "the fabric manager is not running: start `nvidia-fabricmanager` (the same version "
            "as the driver) on the host"
        )
    if visible is not None and visible.strip() in ("", "-1", "none", "void"):
        return (
            f"CUDA could not start ({text}): CUDA_VISIBLE_DEVICES={visible!r} hides every GPU; "
            "unset it or name GPUs by index or UUID (`nvidia-smi -L`)"
        )
    if visible is not None:
        return (
            f"CUDA could not start ({text}): check CUDA_VISIBLE_DEVICES={visible!r} (indexes or "
            "UUIDs from `nvidia-smi -L`), then the driver (`nvidia-smi`, Xid errors in dmesg)"
        )
    return (
        f"CUDA could not start ({text}): check the driver on the host (`nvidia-smi`, Xid errors "
        "in dmesg) and that it is at least the image's io.torch-images.min-driver"
    )


def cuda_cannot_start(ctx: dict[str, Any]) -> str | None:
    """Why CUDA failed although this CUDA image was given GPUs (/dev/nvidiaN), or None.

    That is a broken node, not a CPU host: the GPU checks fail instead of standing in.
    """
    if accelerator(ctx) != "cuda" or not gpu_device_nodes() or gpu_available():
        return None
    import torch

    if not torch.version.cuda:
        return None
    return no_gpu_reason()


def _dev_nvidia() -> list[str]:
    try:
        return ["/dev/" + n for n in os.listdir("/dev") if n.startswith("nvidia")]
    except OSError:
        return []


def stand_in_status(ctx: dict[str, Any], what: str) -> tuple[str, str]:
    """CPU runs are the real thing on a cpu image and a stand-in on a CUDA image without GPU;
    on a CUDA image whose GPUs are there but CUDA cannot start, they fail."""
    if accelerator(ctx) == "cpu":
        return PASS, what
    broken = cuda_cannot_start(ctx)
    if broken:
        return FAIL, f"GPUs present but unusable: {broken}"
    return SUBSTITUTED, f"{what} (CPU stand-in: {no_gpu_reason()})"


def errors(actual: Any, reference: Any) -> tuple[float, float]:
    """(max abs error, max abs error relative to the reference's scale) against a float64 ref."""
    diff = (actual.detach().double().cpu() - reference.detach().double().cpu()).abs().max().item()
    scale = max(reference.detach().double().abs().max().item(), 1e-12)
    return diff, diff / scale


def shm_warning(ctx: dict[str, Any]) -> str | None:
    size = host(ctx).get("shm_bytes")
    if size is None or size >= SHM_MIN_BYTES:
        return None
    return (
        f"/dev/shm is only {size / 2**20:.0f} MiB: NCCL and DataLoader workers fail with "
        "Docker's 64 MB default; run the container with --shm-size=8g or --ipc=host"
    )


def summarize(exc: BaseException, limit: int = 400) -> str:
    """One line for the report: the exception's first line plus its first `error:` line, if any.

    Compiler and CUDA errors are long; the full text stays in the check's output tail.
    """
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    parts = [f"{type(exc).__name__}: {lines[0] if lines else ''}"]
    detail = next((line for line in lines[1:] if "error:" in line.lower()), None)
    if detail:
        parts.append(detail)
    return " — ".join(parts)[:limit]
