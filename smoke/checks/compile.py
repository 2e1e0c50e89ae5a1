"""`compile`: a torch.compile'd (inductor) module gives eager mode's output.

Runs on runtime and devel images, which carry the toolchain inductor (C++ on CPU) and triton (a C
launcher on GPU) need; slim images are compiler-free and say so in their `dropped` facts.
"""

from __future__ import annotations

import os
import tempfile
import time
import traceback
from typing import Any

from smoke import FAIL, PASS, SKIP
from smoke.checks.common import (
    dropped_items,
    errors,
    gpu_available,
    result,
    stand_in_status,
    summarize,
)

# Relative to the output's scale: fused kernels reorder float32 sums, nothing more.
TOLERANCE = 1e-4


def skip_reason(ctx: dict[str, Any]) -> str | None:
    missing = [item for item in ("compilers", "triton") if item in dropped_items(ctx)]
    if missing:
        return (f"this slim image is compiler-free ({' and '.join(missing)} dropped): "
                "torch.compile needs the runtime or devel image")
    return None


def _hint(error: str) -> str:
    if "Python.h" in error:
        return "; torch.compile needs the Python headers (libpython3-dev) in the image"
    if "InvalidCxxCompiler" in error or "No working C++ compiler" in error:
        return "; torch.compile needs a C++ compiler (g++) in the image"
    if "cannot find -l" in error or ("No such file or directory" in error and "g++" in error):
        return "; torch.compile needs a working C++ toolchain (g++, libgomp) in the image"
    return ""


def compiled_error(device: str) -> tuple[float, float]:
    """(error of the compiled module relative to eager, seconds for the first compiled call)."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 8),
    ).to(device).eval()
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(0)).to(device)
    compiled = torch.compile(model, backend="inductor", fullgraph=True)
    with torch.no_grad():
        eager = model(x)
        start = time.perf_counter()
        out = compiled(x)
        seconds = time.perf_counter() - start
    return errors(out, eager)[1], seconds


def run(ctx: dict[str, Any]) -> dict[str, Any]:
    reason = skip_reason(ctx)
    if reason:
        return result(SKIP, reason)
    # Fresh caches under /tmp: the image's root may be read-only and HOME someone else's.
    cache = tempfile.mkdtemp(prefix="smoke-compile-")
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(cache, "inductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(cache, "triton"))
    device = "cuda" if gpu_available() else "cpu"
    try:
        rel_err, seconds = compiled_error(device)
    except Exception as exc:  # the image lacks what compile needs: a failure, not a crash
        traceback.print_exc()
        return result(FAIL, summarize(exc) + _hint(str(exc)), {"device": device})
    metrics = {"max_rel_err": rel_err, "compile_s": seconds, "device": device}
    if not rel_err <= TOLERANCE:
        return result(FAIL, f"compiled output differs from eager: {rel_err:.2e} > {TOLERANCE}",
                      metrics)
    message = (f"torch.compile (inductor) on {device} matches eager within {TOLERANCE} "
               f"({seconds:.1f} s to compile)")
    if device == "cuda":
        return result(PASS, message, metrics)
    status, message = stand_in_status(ctx, message)
    return result(status, message, metrics)
