"""The GPU side of `builder smoke`: which GPUs the engine can give a container, and what the
NVIDIA container runtime's refusal to start an image means on this node.

The engine is asked (`docker info`), not the client: with DOCKER_HOST pointing at a GPU
machine, the machine running `builder` may have no GPU at all.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from builder.core import engine, labels, proc
from builder.core.errors import BuilderError
from smoke.versions import driver_cuda, numeric

REQUIREMENT_ERROR = re.compile(r"unsatisfied condition: ([^,\s]+)")


def engine_is_local() -> bool:
    return engine.engine_address().startswith("unix://")


def local_driver() -> str | None:
    """This machine's NVIDIA driver (nvidia-smi, bounded), or None."""
    try:
        result = proc.run(["nvidia-smi", "--query-gpu=driver_version",
                           "--format=csv,noheader"], check=False, timeout=30)
    except BuilderError:  # not installed, or hung
        return None
    first = (result.stdout or "").strip().splitlines()
    return first[0].strip() if result.returncode == 0 and first else None


def local_gpu() -> bool:
    """An NVIDIA GPU on this machine: a device node, or a driver that answers."""
    return Path("/dev/nvidia0").exists() or local_driver() is not None


def engine_gpu_flags(info: Mapping[str, Any], local: Callable[[], bool] = local_gpu
                     ) -> tuple[list[str], str]:
    """(`docker run` flags giving the container every GPU, where that was learned).

    The nvidia runtime registered with the engine means the NVIDIA Container Toolkit: `--gpus
    all`; GPUs the engine discovered through CDI (Docker 28+): `--device nvidia.com/gpu=all`;
    a local engine on a machine with GPUs (the toolkit's hook, not shown in `docker info`):
    `--gpus all`. Otherwise none.
    """
    if "nvidia" in (info.get("Runtimes") or {}):
        return ["--gpus", "all"], "the engine has the nvidia runtime"
    devices = info.get("DiscoveredDevices") or []
    if any(str(d.get("ID", "")).startswith("nvidia.com/gpu") for d in devices
           if isinstance(d, Mapping)):
        return ["--device", "nvidia.com/gpu=all"], "the engine lists CDI devices nvidia.com/gpu"
    if engine_is_local() and local():
        return ["--gpus", "all"], "this machine has NVIDIA GPUs"
    where = "" if engine_is_local() else f" at {engine.engine_address()}"
    return [], (f"the engine{where} reports no nvidia runtime and no CDI GPU devices "
                "(pass --gpus to override)")


def requirement_error(output: str, image_labels: Mapping[str, str],
                      node_driver: str | None) -> str | None:
    """The NVIDIA container runtime refusing the image's NVIDIA_REQUIRE_CUDA, said plainly:
    which driver the node has and which the image needs."""
    match = REQUIREMENT_ERROR.search(output)
    if not match:
        return None
    needs = image_labels.get(labels.MIN_DRIVER) or "?"
    if node_driver:
        has = f"driver {node_driver} (CUDA {driver_cuda(node_driver) or '?'})"
    else:
        has = "a driver this machine cannot see (run nvidia-smi on the node)"
    if node_driver and needs != "?" and numeric(node_driver) >= numeric(needs):
        advice = ("the driver meets the image's min-driver, so its NVIDIA_REQUIRE_CUDA is "
                  "stricter than its label (built before the two were derived from one fact): "
                  "rebuild the image, or start it with NVIDIA_DISABLE_REQUIRE=1")
    else:
        advice = f"upgrade the driver to at least {needs}, or use an image for an older CUDA"
    return (f"the NVIDIA container runtime refused to start the image: the node has {has}, "
            f"the image requires {match.group(1)} (NVIDIA_REQUIRE_CUDA) and declares "
            f"min-driver {needs}; {advice}")
