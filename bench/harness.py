"""How the bench drives the pipeline: the builder CLI as a user runs it, the engine's build cache,
image facts, the machine's own facts. Docker only via builder.core.engine.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from builder.core import engine
from builder.core.output import human_bytes
from builder.model import matrix, platforms
from builder.stages import render

ROOT = Path(__file__).resolve().parent.parent
WHEEL_CACHE = render.MOUNTS["cache"]


def log(msg: str) -> None:
    print(f"# {msg}", file=sys.stderr, flush=True)


def builder_cli(*args: str, env: dict[str, str] | None = None,
                timeout: float = 4 * 3600) -> tuple[float, Any, str]:
    """Run `python -m builder ARGS --json`; returns (seconds, parsed stdout, stderr)."""
    argv = [sys.executable, "-m", "builder", *args, "--json"]
    log("$ " + " ".join(argv[1:]) + (f"  (env {env})" if env else ""))
    start = time.monotonic()
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                            env={**os.environ, "PATH": path, **(env or {})}, check=False)
    seconds = time.monotonic() - start
    if result.returncode != 0:
        raise RuntimeError(f"`builder {' '.join(args)}` exited {result.returncode}:\n"
                           + (result.stderr + result.stdout)[-3000:])
    try:
        data = json.loads(result.stdout) if result.stdout.strip() else None
    except json.JSONDecodeError:
        data = None
    return seconds, data, result.stderr


def build(select: list[str], *extra: str, env: dict[str, str] | None = None
          ) -> tuple[float, list[dict[str, Any]]]:
    # linux/amd64 unless a platform is named: the emulated arm64 build is `python -m bench arm64`.
    if not any(s.startswith("platform=") for s in select):
        select = [*select, f"platform={platforms.DEFAULT}"]
    sel = [a for s in select for a in ("--select", s)]
    seconds, data, stderr = builder_cli("build", *sel, "--no-smoke", "--no-sbom", *extra, env=env)
    _LAST["waited"] = "waiting for it to finish" in stderr
    if _LAST["waited"]:
        log("that build waited for another `builder build` (shared build lock)")
    return seconds, data or []


_LAST = {"waited": False}


def wait_note() -> str:
    """Said of a timing that includes waiting for another session's build lock."""
    return "; INCLUDES waiting for another build's lock" if _LAST["waited"] else ""


def prune_builder_cache(keep_wheels: bool = False) -> None:
    """Empty BuildKit's cache; `keep_wheels` keeps only the wheel cache mount (uv's), the state
    after a first build: every layer and the apt caches are gone, the wheels are on the host."""
    if not keep_wheels:
        log("docker builder prune -af")
        engine.docker("builder", "prune", "-af", timeout=1800)
        return
    log(f"docker builder prune -af, except the wheel cache mount ({WHEEL_CACHE})")
    for kind in ("regular", "source.local", "internal", "frontend", "source.git.checkout"):
        engine.docker("builder", "prune", "-af", "--filter", f"type={kind}", timeout=1800)
    for record in cache_mounts():
        if WHEEL_CACHE not in str(record.get("Description", "")):
            engine.docker("builder", "prune", "-af", "--filter",
                          f"id={str(record.get('ID', '')).rstrip('*')}", check=False, timeout=600)


def cache_mounts() -> list[dict[str, Any]]:
    out = engine.docker("system", "df", "-v", "--format", "{{json .BuildCache}}", timeout=600)
    return [r for r in json.loads(out.stdout or "[]") or []
            if r.get("CacheType") == "exec.cachemount"]


def wheel_cache_kept() -> bool:
    return any(WHEEL_CACHE in str(r.get("Description", "")) for r in cache_mounts())


def image_ref(m: matrix.Matrix, variant_id: str) -> str:
    _, data, _ = builder_cli("plan", "--offline", "--select", f"id={variant_id}")
    return data["include"][0]["image"]


def image_size(ref: str) -> int:
    return int((engine.inspect_image(ref) or {}).get("Size", 0))


def image_id(ref: str) -> str:
    return str((engine.inspect_image(ref) or {}).get("Id", ""))


def du_top(ref: str, n: int = 12, paths: tuple[str, ...] = ("/opt", "/usr")
           ) -> list[tuple[int, str]]:
    """Largest directories (KiB) under /opt and /usr (and `paths`) inside the image."""
    out = engine.docker("run", "--rm", "--entrypoint", "du", ref, "-x", "-d", "3", *paths,
                        check=False, timeout=600)
    rows = []
    for line in out.stdout.splitlines():
        parts = line.split("\t", 1)
        if len(parts) == 2 and parts[0].isdigit():
            rows.append((int(parts[0]), parts[1]))
    if not rows:
        log(f"du in {ref} gave nothing (exit {out.returncode}): {out.stderr.strip()[-300:]}")
    return sorted(rows)[-n:]


def machine_facts() -> dict[str, Any]:
    info = engine.ensure_engine()
    mem = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cores": os.cpu_count(),
        "memory": human_bytes(mem) if mem else "?",
        "docker": str(info.get("ServerVersion", "?")),
        "storage_driver": str(info.get("Driver", "?")),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "disk_free": human_bytes(shutil.disk_usage("/").free),
        "gpu": "none" if not shutil.which("nvidia-smi") else "nvidia-smi present",
    }
