"""Shared fixtures. Docker tests are marked `docker` and skip when no engine answers."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def engine_up() -> bool:
    docker = shutil.which("/usr/bin/docker") or shutil.which("docker")
    if not docker:
        return False
    return subprocess.run([docker, "info"], capture_output=True, check=False).returncode == 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if engine_up():
        return
    skip = pytest.mark.skip(reason="no Docker engine (start dockerd: tools/setup.sh)")
    for item in items:
        if "docker" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def write_matrix(tmp_path: Path):
    """Write a matrix file from text; returns its path."""

    def write(text: str, name: str = "matrix.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write
