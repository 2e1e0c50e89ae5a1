"""`python -m smoke.nvml`: what NVML says about the driver and the GPUs, as one JSON line.

Run by `smoke.host` in its own process with a timeout: a sick GPU can hang any call into the
driver, and a hang here must cost the suite seconds, not its report. Stdlib only (ctypes).
"""

from __future__ import annotations

import ctypes
import json
import sys
from typing import Any


class _Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong),
                ("used", ctypes.c_ulonglong)]


def cuda_version_str(value: int) -> str:
    """NVML's CUDA driver version integer (13000) as `13.0`."""
    return f"{value // 1000}.{value % 1000 // 10}"


def _device(nvml: Any, index: int) -> dict[str, Any]:
    handle = ctypes.c_void_p()
    if nvml.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(index), ctypes.byref(handle)) != 0:
        return {"index": index, "name": "?", "capability": None, "memory": None, "mig": None}
    name = ctypes.create_string_buffer(96)
    nvml.nvmlDeviceGetName(handle, name, ctypes.c_uint(96))
    memory, major, minor = _Memory(), ctypes.c_int(), ctypes.c_int()
    current, pending = ctypes.c_uint(), ctypes.c_uint()
    has_memory = nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory)) == 0
    has_cap = nvml.nvmlDeviceGetCudaComputeCapability(
        handle, ctypes.byref(major), ctypes.byref(minor)) == 0
    # NOT_SUPPORTED on GPUs without MIG: that is "no MIG", not unknown.
    has_mig = nvml.nvmlDeviceGetMigMode(handle, ctypes.byref(current), ctypes.byref(pending)) == 0
    return {
        "index": index, "name": name.value.decode(errors="replace") or "?",
        "capability": f"{major.value}.{minor.value}" if has_cap else None,
        "memory": memory.total // 2**20 if has_memory else None,
        "mig": bool(current.value) if has_mig else False,
    }


def probe() -> dict[str, Any]:
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    init = getattr(nvml, "nvmlInit_v2", None) or nvml.nvmlInit
    status = init()
    if status != 0:
        return {"error": f"nvmlInit failed with NVML error {status}"}
    try:
        buf, cuda, count = ctypes.create_string_buffer(96), ctypes.c_int(), ctypes.c_uint()
        driver = buf.value.decode() if nvml.nvmlSystemGetDriverVersion(
            buf, ctypes.c_uint(96)) == 0 else None
        get_cuda = getattr(nvml, "nvmlSystemGetCudaDriverVersion_v2", None) or \
            nvml.nvmlSystemGetCudaDriverVersion
        driver_cuda = cuda_version_str(cuda.value) if get_cuda(ctypes.byref(cuda)) == 0 else None
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
            count.value = 0
        devices = [_device(nvml, i) for i in range(count.value)]
    finally:
        nvml.nvmlShutdown()
    return {"driver": driver or None, "driver_cuda": driver_cuda, "gpus": devices}


def main() -> int:
    try:
        out = probe()
    except (OSError, AttributeError) as exc:  # no libnvidia-ml (CPU host), or a very old one
        out = {"error": f"no NVML: {exc}"}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
