"""Helpers the end-to-end tests share (imported as `helpers`: pytest puts tests/e2e on sys.path)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def missing(reason: str) -> None:
    """Fail under CI, skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: required)", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_builder(env: dict[str, str], *args: str, cwd: Path = ROOT,
                check: bool = True) -> subprocess.CompletedProcess[str]:
    """`python -m builder ARGS` as a user runs it; on an unexpected exit, show its output."""
    result = subprocess.run([sys.executable, "-m", "builder", *args], cwd=cwd, env=env,
                            capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        pytest.fail(f"builder {' '.join(args)} exited {result.returncode}:\n"
                    f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}", pytrace=False)
    return result
