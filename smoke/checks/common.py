"""Helpers shared by the checks (imported only in check subprocesses; torch is imported lazily)."""

from __future__ import annotations

import os
from typing import Any

from smoke import PASS, SUBSTITUTED
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


def no_gpu_reason() -> str:
    """Why CUDA is unusable here, phrased as what the user should do."""
    import torch

    if not torch.version.cuda:
        return f"this torch ({torch.__version__}) was built without CUDA"
    if not any(n[len("/dev/nvidia"):].isdigit() for n in _dev_nvidia()):
        return (
            "no GPU visible: /dev/nvidia* is absent (container started without `--gpus all`, "
            "the NVIDIA Container Toolkit is missing, or this host has no NVIDIA GPU)"
        )
    try:
        torch.cuda.init()
    except Exception as exc:  # the driver's own words are the useful part
        return cuda_init_hint(str(exc))
    return "torch.cuda.is_available() is False although /dev/nvidia* exists"


def cuda_init_hint(error: str) -> str:
    if "803" in error or "804" in error or "forward compat" in error.lower():
        return (
            f"CUDA could not start ({error.strip()}): the driver and this image's CUDA do not "
            "match (errors 803/804 = driver too old / forward-compatibility mismatch); upgrade "
            "the driver or use an image built for an older CUDA"
        )
    return f"CUDA could not start: {error.strip()}"


def _dev_nvidia() -> list[str]:
    try:
        return ["/dev/" + n for n in os.listdir("/dev") if n.startswith("nvidia")]
    except OSError:
        return []


def stand_in_status(ctx: dict[str, Any], what: str) -> tuple[str, str]:
    """CPU runs are the real thing on a cpu image and a stand-in on a CUDA image without GPU."""
    if accelerator(ctx) == "cpu":
        return PASS, what
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
