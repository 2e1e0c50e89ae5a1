"""A real resolution against PyPI and hadolint over every shipped Dockerfile."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from builder.model import lockfile, matrix
from builder.stages import locks, render

ROOT = Path(__file__).resolve().parents[2]
LOCKS = ROOT / "locks"



def test_rendered_dockerfiles_pass_hadolint(shipped, tmp_path):
    for v in shipped.variants:
        render.write(render.render_locked(shipped, v, LOCKS), tmp_path)
    files = sorted(str(p) for p in tmp_path.glob("*/Dockerfile"))
    result = subprocess.run(["hadolint", "--no-color", "--failure-threshold", "info", *files],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout


@pytest.mark.network
def test_lock_resolves_for_the_target_python_not_the_host(tmp_path, write_matrix):
    path = write_matrix("""\
registry: 127.0.0.1:5000
repository: torch
bases:
  "3.12": {image: "python:3.12-slim-bookworm", python_from: image}
axes:
  torch: ["2.9.1"]
  python: ["3.12"]
  accelerator: [cuda]
  flavor: [runtime]
packages: []
""")
    m = matrix.load(path)
    (v,) = m.variants
    results = locks.lock_all(m, [v], tmp_path / "locks", progress=lambda _: None)
    assert results[0][1] is True
    assert lockfile.require_lock(tmp_path / "locks", v).facts["cuda"] == "12.8"
    again = locks.lock_all(m, [v], tmp_path / "locks", progress=lambda _: None)
    assert again[0][1] is False  # unchanged inputs are not resolved again
