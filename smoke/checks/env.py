"""`env`: the running image is what its facts say (versions, driver, library shadowing)."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path
from typing import Any

from smoke import FAIL, PASS, SKIP
from smoke.checks.common import facts, host, result, shm_warning
from smoke.versions import (
    cudnn_version_str,
    driver_problem,
    minimum_driver,
    nccl_version_str,
    same_prefix,
    torch_matches,
)


def actual_versions() -> dict[str, Any]:
    import torch

    return {
        "torch": torch.__version__,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "cuda": torch.version.cuda,
        "cudnn": _quiet(lambda: cudnn_version_str(torch.backends.cudnn.version())),
        "nccl": _quiet(lambda: nccl_version_str(torch.cuda.nccl.version())),
        "triton": _dist_version("triton"),
        # The GPU architectures the wheel has kernels for (sm_XY, compute_XY for PTX), read
        # without a GPU: what the catalog's chooser matches a GPU against.
        "cuda_arch_flags": _quiet(lambda: torch._C._cuda_getArchFlags().split() or None)
        if torch.version.cuda else None,
    }


def _quiet(fn: Any) -> Any:
    try:
        return fn()
    except Exception:  # CPU builds lack cuDNN/NCCL entirely
        return None


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def mismatches(promised: dict[str, Any], actual: dict[str, Any]) -> list[str]:
    """One message per promised key that differs. A missing key is not checked; null = absent."""
    problems = []
    rules = {"python": 2, "cuda": 2, "cudnn": 2, "nccl": 3, "triton": 3}
    for key in ("torch", *rules):
        if key not in promised:
            continue
        want, got = promised[key], actual.get(key)
        if key == "triton" and "triton" in (promised.get("dropped") or []):
            continue
        if want is None:
            ok = got is None
        elif key == "torch":
            ok = got is not None and torch_matches(str(want), str(got))
        else:
            ok = same_prefix(str(want), None if got is None else str(got), rules[key])
        if not ok:
            problems.append(f"{key}: image promises {want or 'none'}, found {got or 'none'}")
    return problems


def shadowing() -> list[str]:
    """cuDNN/NCCL loaded from outside the wheels (site-packages/nvidia), e.g. LD_LIBRARY_PATH."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    paths = {line.split()[-1] for line in maps.splitlines() if "/lib" in line}
    warnings = []
    for path in sorted(paths):
        base = path.rsplit("/", 1)[-1]
        if base.startswith(("libcudnn", "libnccl")) and "-packages/nvidia/" not in path:
            warnings.append(
                f"{base} is loaded from {path}, not from the image's nvidia wheels: a system copy "
                "shadows it (check LD_LIBRARY_PATH)"
            )
    return warnings


def driver_check(ctx: dict[str, Any], promised: dict[str, Any]) -> str | None:
    driver = host(ctx).get("driver")
    if not driver or not promised.get("cuda"):
        return None
    min_driver = promised.get("min_driver") or minimum_driver(promised.get("cuda"))
    return driver_problem(driver, min_driver, promised.get("cuda"))


def run(ctx: dict[str, Any]) -> dict[str, Any]:
    promised = facts(ctx)
    actual = actual_versions()
    warnings = shadowing() + [w for w in [shm_warning(ctx)] if w]
    metrics = {"actual": actual, "driver": host(ctx).get("driver")}
    if not promised:
        message = "no facts file: versions not compared (pass --facts)"
        return result(SKIP, message, metrics, warnings)
    problems = mismatches(promised, actual)
    driver = driver_check(ctx, promised)
    if driver:
        problems.append(driver)
    if problems:
        return result(FAIL, "; ".join(problems), metrics, warnings)
    checked = [k for k in ("torch", "python", "cuda", "cudnn", "nccl", "triton") if k in promised]
    summary = ", ".join(f"{k} {actual.get(k) or 'none'}" for k in checked)
    if host(ctx).get("driver"):
        summary += f", driver {host(ctx)['driver']}"
    return result(PASS, f"matches the facts: {summary}", metrics, warnings)
