"""Check registry: name → module in this package exposing `run(ctx) -> dict`.

Also the one rule for "a GPU check fully ran", shared by the suite (`--require-gpu`), the host
side (`builder smoke`) and the publish gate: stdlib only, so the image's Python can import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

CHECKS: dict[str, str] = {
    "env": "env",
    "cuda": "cuda",
    "cudnn_conv": "conv",
    "nccl_allreduce": "nccl",
    "amp_train": "amp",
    "cuda_libs": "libs",
    "import_all": "imports",
    "compile": "compile",
}
# Checks whose skip/substituted/degraded means "no (full) GPU": --require-gpu fails them.
GPU_CHECKS = frozenset({"cuda", "cudnn_conv", "nccl_allreduce", "amp_train"})
# Per-check timeouts in seconds, sized for a 2-core CPU box; scaled by --timeout-scale.
TIMEOUTS: dict[str, float] = {"env": 120.0}
DEFAULT_TIMEOUT = 300.0


def timeout_for(name: str, scale: float) -> float:
    return TIMEOUTS.get(name, DEFAULT_TIMEOUT) * scale


def ran_fully_on_gpu(check: Mapping[str, Any]) -> bool:
    """Whether a GPU check fully ran on a GPU: its status is `pass`.

    A node with one GPU or one MIG slice passes `nccl_allreduce` as a single-rank check (with a
    note); `degraded` means GPUs are present but hidden from CUDA, `skip`/`substituted` that no
    GPU ran it. A check that is not a GPU check is not asked.
    """
    return check.get("name") not in GPU_CHECKS or check.get("status") == "pass"


def gpu_checks_not_run(checks: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of the GPU checks of a report that did not fully run on a GPU."""
    return [str(c.get("name")) for c in checks if not ran_fully_on_gpu(c)]
