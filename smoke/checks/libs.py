"""`cuda_libs`: the CUDA libraries in the image are the ones torch was built and locked with.

cuDNN's runtime version equals the version torch was compiled against; cuDNN's and NCCL's runtime
versions (NCCL's asked from the loaded libnccl) are their wheels' (as PyTorch's release smoke
test compares them); every installed
nvidia-* wheel is the version the lock pins. Needs no GPU: only the libraries are loaded.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
from pathlib import Path
from typing import Any

from smoke import FAIL, PASS, SKIP
from smoke.checks.common import facts, result
from smoke.versions import (
    cudnn_version_str,
    dist_name,
    nccl_version_str,
    runtime_matches_wheel,
    wheel_mismatches,
)


def installed_nvidia() -> dict[str, str]:
    found = {}
    for dist in importlib.metadata.distributions():
        name = dist_name(dist.metadata["Name"] or "")
        if name.startswith("nvidia-"):
            found[name] = dist.version
    return found


def wheel_of(installed: dict[str, str], prefix: str) -> str | None:
    """The version of `nvidia-cudnn-cu13`, `nvidia-nccl-cu12` … for prefix `nvidia-cudnn`."""
    return next((v for k, v in sorted(installed.items()) if k.startswith(prefix)), None)


def loaded_path(maps: str, soname: str) -> str | None:
    """The file a library is mapped from in /proc/self/maps (`libnccl.so.2` → its path)."""
    for line in maps.splitlines():
        path = line.split()[-1] if line.split() else ""
        if path.rsplit("/", 1)[-1].startswith(soname):
            return path
    return None


def loaded_nccl() -> tuple[str | None, str | None]:
    """(version, path) of the libnccl this process loaded, asked through ncclGetVersion:
    torch.cuda.nccl.version() is the version torch was compiled against, so a different
    libnccl.so.2 on LD_LIBRARY_PATH would go unnoticed there."""
    try:
        path = loaded_path(Path("/proc/self/maps").read_text(), "libnccl.so")
        lib = ctypes.CDLL(path or "libnccl.so.2")
    except OSError:
        return None, None
    value = ctypes.c_int()
    if lib.ncclGetVersion(ctypes.byref(value)) != 0:
        return None, path
    return nccl_version_str(value.value), path


def library_versions() -> dict[str, str | None]:
    import torch

    compiled = torch._C._cudnn.getCompileVersion() if hasattr(torch._C, "_cudnn") else None
    nccl, nccl_path = loaded_nccl()
    return {
        "cudnn_compiled": ".".join(str(p) for p in compiled) if compiled else None,
        "cudnn_runtime": cudnn_version_str(torch.backends.cudnn.version()),
        "nccl_compiled": nccl_version_str(torch.cuda.nccl.version()),
        "nccl_runtime": nccl,
        "nccl_path": nccl_path,
    }


def library_problems(versions: dict[str, str | None], installed: dict[str, str]) -> list[str]:
    problems = []
    if versions["cudnn_runtime"] != versions["cudnn_compiled"]:
        problems.append(f"cuDNN: torch was compiled against {versions['cudnn_compiled']}, "
                        f"loads {versions['cudnn_runtime']}")
    for lib, prefix in (("cudnn", "nvidia-cudnn"), ("nccl", "nvidia-nccl")):
        runtime, wheel = versions[f"{lib}_runtime"], wheel_of(installed, prefix)
        if not runtime_matches_wheel(runtime, wheel):
            problems.append(f"{lib}: torch loads {runtime}, the {prefix} wheel is {wheel}")
    return problems


def run(ctx: dict[str, Any]) -> dict[str, Any]:
    if facts(ctx).get("accelerator") == "cpu":  # decided without the slow torch import
        return result(SKIP, "cpu image: no CUDA libraries to compare")
    import torch

    if not torch.version.cuda:
        return result(SKIP, f"this torch ({torch.__version__}) is a CPU build: no CUDA libraries")
    installed = installed_nvidia()
    versions = library_versions()
    warnings = []
    if versions["nccl_runtime"] is None:
        warnings.append("could not ask the loaded libnccl its version: compared torch's "
                        "compile-time NCCL version instead")
        versions["nccl_runtime"] = versions["nccl_compiled"]
    metrics = {**versions, "wheels": installed}
    problems = library_problems(versions, installed)
    promised = facts(ctx).get("wheels")
    if promised is None:
        warnings.append("the facts list no wheels: nvidia-* versions not compared with the lock")
    else:
        problems += wheel_mismatches(promised, installed)
    if problems:
        return result(FAIL, "; ".join(problems), metrics, warnings)
    compared = "" if promised is None else f", {len(installed)} nvidia-* wheels as locked"
    return result(PASS, f"cuDNN {versions['cudnn_runtime']} as compiled, NCCL "
                  f"{versions['nccl_runtime']} as its wheel{compared}", metrics, warnings)
