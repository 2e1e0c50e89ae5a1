"""Host facts without torch and without the hostname: kernel, CPUs, GPUs, driver, /dev/shm.

Every call into the driver is bounded: `nvidia-smi` and the NVML probe (`smoke.nvml`) run in
their own processes with a timeout, and what timed out is recorded in `probe_problems` instead
of hanging the suite (a GPU that fell off the bus hangs NVML).
"""

from __future__ import annotations

import glob
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

_QUERY = "--format=csv,noheader,nounits"
PROBE_TIMEOUT_S = 30.0
PACKAGE_PARENT = Path(__file__).resolve().parent.parent
# nvidia-smi fields, newest first: compute_cap needs R510+, mig.mode.current R450+.
SMI_FIELDS = (
    ("index", "name", "compute_cap", "memory.total", "driver_version", "mig.mode.current"),
    ("index", "name", "memory.total", "driver_version"),
)


class TimedOut(Exception):
    pass


def run_bounded(cmd: list[str], timeout: float = PROBE_TIMEOUT_S) -> tuple[int, str]:
    """(exit status, stdout); TimedOut when it hung (the process is killed), OSError when
    it cannot start. The one place this module starts a process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_PARENT), env.get("PYTHONPATH")]))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False,
                              env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise TimedOut(f"`{' '.join(cmd)}` did not answer within {timeout:.0f} s "
                       "(a GPU or the driver hangs)") from None
    return done.returncode, done.stdout


def shm_bytes() -> int | None:
    try:
        st = os.statvfs("/dev/shm")
    except OSError:
        return None
    return st.f_frsize * st.f_blocks


def nvidia_device_nodes() -> list[str]:
    return sorted(glob.glob("/dev/nvidia[0-9]*"))


def _int(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def parse_smi(fields: tuple[str, ...], text: str) -> tuple[list[dict[str, Any]], str | None]:
    """nvidia-smi's CSV (no header, no units) as (gpus, driver version)."""
    gpus, driver = [], None
    for line in text.splitlines():
        if not line.strip():
            continue
        row = dict(zip(fields, [c.strip() for c in line.split(",")], strict=False))
        cap = row.get("compute_cap", "")
        gpus.append({
            "index": _int(row.get("index", "")),
            "name": row.get("name") or "?",
            "capability": cap if cap[:1].isdigit() else None,
            "memory": _int(row.get("memory.total", "")),
            "mig": row.get("mig.mode.current", "").lower() == "enabled",
        })
        driver = driver or row.get("driver_version") or None
    return gpus, driver


def smi_gpus(problems: list[str]) -> tuple[list[dict[str, Any]], str | None]:
    for fields in SMI_FIELDS:
        try:
            rc, out = run_bounded(["nvidia-smi", f"--query-gpu={','.join(fields)}", _QUERY])
        except OSError:  # no nvidia-smi in this container
            return [], None
        except TimedOut as exc:
            problems.append(str(exc))
            return [], None  # it would hang again without the newer fields
        if rc == 0:
            return parse_smi(fields, out)
    return [], None


def nvml_facts(problems: list[str]) -> dict[str, Any]:
    """What `python -m smoke.nvml` says: driver, driver_cuda, gpus (or {} without NVML)."""
    try:
        _rc, out = run_bounded([sys.executable, "-m", "smoke.nvml"])
    except (OSError, TimedOut) as exc:
        problems.append(f"NVML: {exc}")
        return {}
    try:
        data = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict) or "error" in data:
        return {}
    return data


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def gpu_facts() -> dict[str, Any]:
    """GPUs as the driver lists them (nvidia-smi, else NVML), the driver and its CUDA version."""
    problems: list[str] = []
    gpus, driver = smi_gpus(problems)
    nvml = nvml_facts(problems)
    return {
        "gpus": gpus or nvml.get("gpus") or [],
        "driver": driver or nvml.get("driver"),
        "driver_cuda": nvml.get("driver_cuda"),
        "probe_problems": problems,
    }


def host_facts() -> dict[str, Any]:
    return {
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpu_count": cpu_count(),
        **gpu_facts(),
        "shm_bytes": shm_bytes(),
        "nvidia_devices": nvidia_device_nodes(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }


def _devices_text(devices: list[dict[str, Any]]) -> str:
    groups: dict[str, int] = {}
    for d in devices:
        memory = f", {d['memory'] / 1024:.0f} GiB" if d.get("memory") else ""
        cap = f"sm {d['capability']}" if d.get("capability") else "sm ?"
        kind = "MIG slice " if d.get("mig") else ""
        key = f"{kind}{d.get('name', '?')} ({cap}{memory})"
        groups[key] = groups.get(key, 0) + 1
    return ", ".join(f"{n} × {key}" for key, n in groups.items())


def host_summary(host: dict[str, Any]) -> str:
    """One line for `verify` and the catalog: the devices CUDA used (or why none), the driver
    and its CUDA version. Reads reports from before `cuda_devices` existed too."""
    driver = host.get("driver")
    driver_text = f"driver {driver}" + (f" (CUDA {host['driver_cuda']})"
                                        if host.get("driver_cuda") else "") if driver else ""
    used = host.get("cuda_devices")
    listed = host.get("gpus") or []
    if used:
        text = f"CUDA used {_devices_text(used)}"
    elif used is None and listed:  # an older report: what nvidia-smi listed
        text = f"{_devices_text(listed)} listed by the driver"
    elif listed:
        text = f"no GPU used by CUDA although the driver lists {_devices_text(listed)}"
    else:
        text = "no GPU used (no NVIDIA GPU visible)"
    return ", ".join(t for t in (text, driver_text) if t)
