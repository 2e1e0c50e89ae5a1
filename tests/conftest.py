"""Fixtures for every test; tests/unit and tests/e2e each add their own conftest."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.model import matrix

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def shipped() -> matrix.Matrix:
    """The shipped matrix.yaml (read only)."""
    return matrix.load(ROOT / "matrix.yaml")


@pytest.fixture
def write_matrix(tmp_path: Path):
    """Write a matrix file from text; returns its path."""

    def write(text: str, name: str = "matrix.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text)
        return path

    return write
