"""The shipped matrix and locks, and matrix files made from it with one edit, for the tests of
what matrix.yaml, the locks and --select refuse."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from builder.core.errors import BuilderError
from builder.model import matrix
from builder.model.matrix_yaml import MatrixError

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "locks"
SHIPPED = (ROOT / "matrix.yaml").read_text()
CPU = "2.13.0-py3.11-cpu-runtime"
SLIM_TAG = "2.15.0-py3.11-cuda13.2-cudnn9-slim"  # the floating tag of 2.15.0-py3.11-cuda-slim


def shipped_with(tmp_path: Path, old: str, new: str) -> Path:
    """The shipped matrix with its first `old` replaced by `new`, written under tmp_path."""
    assert old in SHIPPED
    path = tmp_path / "matrix.yaml"
    path.write_text(SHIPPED.replace(old, new, 1))
    return path


def validate_args(path: Path, **extra: object) -> argparse.Namespace:
    return argparse.Namespace(**{"matrix": str(path), "select": [], "json": False,
                                 "offline": True, "locks": LOCKS, **extra})


def load_problems(path: Path) -> str:
    """The matrix problems `path` is refused for (a MatrixError)."""
    with pytest.raises(MatrixError) as exc:
        matrix.load(path)
    return str(exc.value)


def load_error(path: Path) -> str:
    """The error `path` is refused with (any BuilderError: a size cap is not a matrix problem)."""
    with pytest.raises(BuilderError) as exc:
        matrix.load(path)
    return str(exc.value)
