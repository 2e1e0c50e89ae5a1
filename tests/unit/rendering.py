"""What unit tests render from the shipped matrix and locks (imported as `rendering`)."""

from __future__ import annotations

from pathlib import Path

from builder.model import lockfile, matrix
from builder.model.rendered import Rendered
from builder.stages import render

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "locks"


def rendered(m: matrix.Matrix, vid: str) -> Rendered:
    """The variant's Dockerfile and files, from its committed lock."""
    v = m.variant(vid)
    return render.render(m, v, lockfile.require_lock(LOCKS, v), lockfile.read_base_lock(LOCKS, v))
