"""Check registry: name → module in this package exposing `run(ctx) -> dict`."""

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
