"""`amp_train`: a few mixed-precision training steps learn (fp16 + GradScaler, bf16)."""

from __future__ import annotations

import math
from typing import Any

from smoke import FAIL, PASS
from smoke.checks.common import gpu_available, native_bf16, result, stand_in_status

STEPS = 15


def train(device: str, dtype_name: str, use_scaler: bool) -> dict[str, Any]:
    """Fixed seed and data; returns losses, whether parameters changed and the scaler's scale."""
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 32, generator=gen).to(device)
    y = x @ torch.randn(32, 1, generator=gen).to(device)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)
    ).to(device)
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(device) if use_scaler else None
    dtype = getattr(torch, dtype_name)
    losses, autocast_dtype = [], None
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=dtype):
            out = model(x)
            autocast_dtype = str(out.dtype).removeprefix("torch.")
            loss = F.mse_loss(out.float(), y)
        if scaler is not None:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        else:
            loss.backward()
            opt.step()
        losses.append(loss.item())
    changed = any(not torch.equal(b, p.detach()) for b, p in zip(before, model.parameters(),
                                                                  strict=True))
    return {"dtype": dtype_name, "losses": losses, "params_changed": changed,
            "autocast_dtype": autocast_dtype,
            "scaler_scale": scaler.get_scale() if scaler is not None else None}


def problems(run: dict[str, Any]) -> list[str]:
    losses, name = run["losses"], run["dtype"]
    found = []
    if not all(math.isfinite(v) for v in losses):
        found.append(f"{name}: loss not finite ({losses})")
    elif losses[-1] >= losses[0]:
        found.append(f"{name}: loss did not decrease ({losses[0]:.4g} → {losses[-1]:.4g})")
    if not run["params_changed"]:
        found.append(f"{name}: parameters did not change")
    if run["autocast_dtype"] != name:
        found.append(f"{name}: autocast produced {run['autocast_dtype']}")
    if run["scaler_scale"] is not None and not math.isfinite(run["scaler_scale"]):
        found.append(f"{name}: GradScaler scale is {run['scaler_scale']}")
    return found


def _describe(run: dict[str, Any]) -> str:
    return f"{run['dtype']} loss {run['losses'][0]:.4g} → {run['losses'][-1]:.4g}"


def run(ctx: dict[str, Any]) -> dict[str, Any]:
    if gpu_available():
        runs = [train("cuda", "float16", use_scaler=True)]
        if native_bf16():
            runs.append(train("cuda", "bfloat16", use_scaler=False))
    else:
        runs = [train("cpu", "bfloat16", use_scaler=False)]
    main = runs[0]
    metrics = {"losses": main["losses"], "steps": STEPS, "dtype": main["dtype"],
               "params_changed": main["params_changed"], "scaler_scale": main["scaler_scale"],
               "runs": runs}
    found = [p for r in runs for p in problems(r)]
    if found:
        return result(FAIL, "; ".join(found), metrics)
    summary = f"{STEPS} autocast steps: " + ", ".join(_describe(r) for r in runs)
    if runs[0]["scaler_scale"] is not None:
        summary += f" (GradScaler scale {runs[0]['scaler_scale']:g})"
    if gpu_available():
        return result(PASS, summary, metrics)
    status, message = stand_in_status(ctx, summary)
    return result(status, message, metrics)
