"""Host facts without torch and without the hostname: kernel, CPUs, GPUs, driver, /dev/shm."""

from __future__ import annotations

import ctypes
import glob
import os
import platform
import subprocess
from typing import Any

_QUERY = "--format=csv,noheader,nounits"


def shm_bytes() -> int | None:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def nvidia_device_nodes() -> list[str]:
    return sorted(glob.glob("/dev/nvidia[0-9]*"))


def _nvidia_smi(fields: str) -> list[list[str]] | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={fields}", _QUERY],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def _gpus_from_smi() -> tuple[list[dict[str, Any]], str | None]:
    # compute_cap is unknown to old drivers; retry without it.
    rows = _nvidia_smi("index,name,compute_cap,memory.total,driver_version")
    with_cap = rows is not None
    if rows is None:
        rows = _nvidia_smi("index,name,memory.total,driver_version")
    if not rows:
        return [], None
    gpus = []
    for row in rows:
        if with_cap:
            index, name, cap, memory, _driver = (row + [""] * 5)[:5]
        else:
            index, name, memory, _driver = (row + [""] * 4)[:4]
            cap = None
        gpus.append({
            "index": int(index) if index.isdigit() else None,
            "name": name,
            "capability": cap or None,
            "memory": int(float(memory)) if memory.replace(".", "", 1).isdigit() else None,
        })
    return gpus, rows[0][-1] or None


def nvml_driver() -> str | None:
    """Driver version through NVML, for containers that have libnvidia-ml but no nvidia-smi."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    init = getattr(nvml, "nvmlInit_v2", None) or nvml.nvmlInit
    if init() != 0:
        return None
    try:
        buf = ctypes.create_string_buffer(96)
        if nvml.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(96)) != 0:
            return None
        return buf.value.decode() or None
    finally:
        nvml.nvmlShutdown()


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def host_facts() -> dict[str, Any]:
    gpus, driver = _gpus_from_smi()
    return {
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_count": cpu_count(),
        "gpus": gpus,
        "driver": driver or nvml_driver(),
        "shm_bytes": shm_bytes(),
        "nvidia_devices": nvidia_device_nodes(),
    }
