"""`compile`: torch.compile (inductor) of a tiny function matches eager mode."""

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
    facts,
    gpu_available,
    result,
    stand_in_status,
    summarize,
)

TOLERANCE = 1e-5


def skip_reason(ctx: dict[str, Any]) -> str | None:
    if "triton" in dropped_items(ctx):
        return "triton was dropped from this slim image: torch.compile is not available"
    flavor = facts(ctx).get("flavor")
    if flavor and flavor != "devel":
        # Only devel images promise the compiler and headers that inductor needs.
        return f"{flavor} image: torch.compile is checked on devel images"
    return None


def _hint(error: str) -> str:
    if "Python.h" in error:
        return "; torch.compile needs the Python headers: install python3-dev in the devel image"
    if "cannot find -l" in error or ("No such file or directory" in error and "g++" in error):
        return "; torch.compile needs a working C++ toolchain (g++, libgomp) in the image"
    return ""


def compiled_error(device: str) -> tuple[float, float]:
    """(relative error, seconds for the first compiled call)."""
    import torch

    def fn(x: Any) -> Any:
        return torch.sin(x) * 2 + torch.cos(x) ** 2

    compiled = torch.compile(fn, backend="inductor", fullgraph=True)
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)).to(device)
    start = time.perf_counter()
    out = compiled(x)
    seconds = time.perf_counter() - start
    return errors(out, fn(x.double()))[1], seconds


def run(ctx: dict[str, Any]) -> dict[str, Any]:
    reason = skip_reason(ctx)
    if reason:
        return result(SKIP, reason)
    # Fresh caches under /tmp: the image's root is read-only and HOME may not exist.
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
        return result(FAIL, f"compiled result differs from eager: {rel_err:.2e}", metrics)
    message = f"torch.compile (inductor) on {device} matches eager ({seconds:.1f} s to compile)"
    if device == "cuda":
        return result(PASS, message, metrics)
    status, message = stand_in_status(ctx, message)
    return result(status, message, metrics)
