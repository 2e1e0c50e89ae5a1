"""A lock made from other inputs than the matrix's is refused (validate, plan, build) before the
engine is touched; the shipped locks record their inputs."""

from __future__ import annotations

import json

import pytest
from matrix_files import CPU, LOCKS, ROOT, shipped_with, validate_args

from builder.commands import matrix as matrix_cmd
from builder.core.errors import ConfigError
from builder.flows import build as build_flow
from builder.model import lockfile, matrix
from builder.stages import build, plan, render


@pytest.mark.parametrize(("old", "new", "what"), [
    ("packages: [numpy]", "packages: [numpy, requests]", "packages"),
    ('find_links: ["https://download.pytorch.org/whl/cpu/torch/"]}\n  - {torch',
     'find_links: ["https://mirror.example/torch/"]}\n  - {torch', "find_links"),
])
def test_a_lock_made_from_other_inputs_is_refused(tmp_path, capsys, old, new, what):
    m = matrix.load(shipped_with(tmp_path, old, new))
    v = m.variant(CPU)
    message = f"{LOCKS}/{CPU}.txt is out of date ({what} changed): run builder lock"
    assert lockfile.stale_reason(LOCKS, v) == message
    with pytest.raises(ConfigError, match=r"out of date"):  # plan, build and publish plan first
        plan.plan_variant(m, render.render_locked(m, v, LOCKS), None, "smoke")
    assert matrix_cmd.cmd_validate(validate_args(m.path)) == 1
    assert message in capsys.readouterr().out


def test_build_refuses_a_stale_lock_before_touching_the_engine(tmp_path, monkeypatch):
    path = shipped_with(tmp_path, "packages: [numpy]", "packages: [numpy, requests]")
    monkeypatch.setattr(build, "ensure_buildkit", lambda: pytest.fail("reached the engine"))
    m = matrix.load(path)
    stale = [v for v in m.variants if v.id == CPU]
    with pytest.raises(ConfigError, match=r"\(packages changed\): run builder lock"):
        build_flow.build_images(m, stale, build_flow.BuildOptions(locks=LOCKS))


def test_the_shipped_locks_record_their_inputs():
    m = matrix.load(ROOT / "matrix.yaml")
    for v in m.variants:
        assert lockfile.stale_reason(LOCKS, v) is None, v.id
        meta = json.loads(lockfile.lock_paths(LOCKS, v)[1].read_text())
        assert meta["inputs"] == lockfile.lock_inputs(v)
        assert set(meta["inputs"]) == {"torch", "packages", "index_url", "find_links", "python",
                                       "platform", "resolver"}
