"""`cudnn_conv`: Conv2d forward+backward against a float64 CPU reference; on GPU, via cuDNN."""

from __future__ import annotations

from typing import Any

from smoke import FAIL, PASS
from smoke.checks.common import errors, gpu_available, native_bf16, result, stand_in_status

# Relative to the reference's scale (design notes). fp32 (TF32 off) leaves room for the FFT and
# Winograd algorithms cudnn.benchmark may pick (~1e-5) and still catches TF32 (~5e-4).
TOLERANCE = {"float32": 5e-5, "float16": 5e-3, "bfloat16": 3e-2}


def conv_errors(device: str, dtype_name: str) -> dict[str, float]:
    """Max abs/rel error of output, input grad and weight grad against float64 on CPU.

    The reference uses the same quantized inputs, so only the computation's error is measured.
    """
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, 16, 16, generator=gen).to(dtype)
    w = (torch.randn(32, 16, 3, 3, generator=gen) / 12).to(dtype)
    grad = torch.randn(4, 32, 16, 16, generator=gen).to(dtype)

    def forward_backward(dev: str, dt: Any) -> tuple[Any, Any, Any]:
        xi = x.to(dev, dt).requires_grad_()
        wi = w.to(dev, dt).requires_grad_()
        out = F.conv2d(xi, wi, padding=1)
        out.backward(grad.to(dev, dt))
        return out, xi.grad, wi.grad

    ref = forward_backward("cpu", torch.float64)
    got = forward_backward(device, dtype)
    pairs = [errors(g, r) for g, r in zip(got, ref, strict=True)]
    return {"max_abs_err": max(p[0] for p in pairs), "max_rel_err": max(p[1] for p in pairs)}


def conv_backend(device: str) -> str | None:
    """The backend torch picks for this conv (`Cudnn`, `Mkldnn`, …), when that API exists."""
    import torch

    try:
        x = torch.zeros(4, 16, 16, 16, device=device)
        w = torch.zeros(32, 16, 3, 3, device=device)
        backend = torch._C._select_conv_backend(
            x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1, None
        )
    except Exception:  # private API: absence is not a failure
        return None
    return str(backend).rsplit(".", 1)[-1]


def profiled_cudnn_ops() -> list[str]:
    """Names of profiled ops/kernels mentioning cuDNN while a conv runs on the GPU."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(4, 16, 16, 16, device="cuda", requires_grad=True)
    w = torch.randn(32, 16, 3, 3, device="cuda", requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        F.conv2d(x, w, padding=1).sum().backward()
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages() if "cudnn" in e.key.lower()})[:10]


def check_dtypes(device: str, dtypes: list[str]) -> tuple[dict[str, Any], list[str]]:
    by_dtype, problems = {}, []
    for name in dtypes:
        errs = conv_errors(device, name)
        by_dtype[name] = {**errs, "tolerance": TOLERANCE[name]}
        if not errs["max_rel_err"] <= TOLERANCE[name]:  # also catches NaN
            problems.append(f"{name} error {errs['max_rel_err']:.2e} > {TOLERANCE[name]:g}")
    return by_dtype, problems


def run_gpu() -> dict[str, Any]:
    import torch

    if not torch.backends.cudnn.is_available():
        return result(FAIL, "cuDNN is not available to torch: libcudnn failed to load")
    torch.backends.cudnn.enabled = True
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False  # fp32 must be real fp32 for its tolerance
    dtypes = ["float32", "float16"] + (["bfloat16"] if native_bf16() else [])
    by_dtype, problems = check_dtypes("cuda", dtypes)
    backend = conv_backend("cuda")
    try:
        evidence = profiled_cudnn_ops()
    except Exception as exc:  # CUPTI may be missing; the backend choice is the main proof
        evidence, problems_note = [], f"profiler unavailable: {exc}"
    else:
        problems_note = None
    metrics = {**by_dtype["float32"], "by_dtype": by_dtype, "backend": backend,
               "cudnn_ops": evidence}
    if backend not in (None, "Cudnn") or (backend is None and not evidence):
        problems.append(f"conv did not run on cuDNN (backend {backend}, profiled ops {evidence})")
    if problems:
        return result(FAIL, "; ".join(problems), metrics)
    return result(PASS, f"cuDNN conv fwd+bwd within tolerance for {', '.join(dtypes)}", metrics,
                  [problems_note] if problems_note else [])


def run(ctx: dict[str, Any]) -> dict[str, Any]:
    if gpu_available():
        return run_gpu()
    by_dtype, problems = check_dtypes("cpu", ["float32"])
    metrics = {**by_dtype["float32"], "by_dtype": by_dtype, "backend": conv_backend("cpu")}
    if problems:
        return result(FAIL, "CPU conv: " + "; ".join(problems), metrics)
    status, message = stand_in_status(
        ctx, f"CPU conv2d fwd+bwd fp32 within {TOLERANCE['float32']:g} of float64"
    )
    return result(status, message, metrics)
