"""What `up-to-date` means to the plan: an image under the configured registry and repository;
an engine that does not answer is a warning, not a silent `build`."""

from __future__ import annotations

import pytest
from matrix_files import CPU, LOCKS, ROOT, shipped_with

from builder.model import matrix
from builder.stages import plan, render


@pytest.mark.parametrize(("old", "new", "state"), [
    ("registry: 127.0.0.1:5000", "registry: 127.0.0.1:5000", "up-to-date"),
    ("registry: 127.0.0.1:5000", "registry: registry.example:5000", "build"),
    ("repository: torch", "repository: team/torch", "build"),
])
def test_up_to_date_means_under_the_configured_name(tmp_path, monkeypatch, old, new, state):
    shipped = matrix.load(ROOT / "matrix.yaml")
    v = shipped.variant(CPU)
    local: dict[str, set[str]] = {}  # the engine's images by content hash, filled below
    monkeypatch.setattr(plan, "engine_available", lambda engine: True)
    monkeypatch.setattr(plan, "local_content_hashes", lambda engine: local)
    before = plan.make_plan(shipped, [render.render_locked(shipped, v, LOCKS)], {}, check_registry=False)[0]
    local[before.content_hash] = {f"127.0.0.1:5000/torch:{before.floating_tag}"}
    m = matrix.load(shipped_with(tmp_path, old, new))
    [p] = plan.make_plan(m, [render.render_locked(m, m.variant(CPU), LOCKS)], {}, check_registry=False)
    assert p.state == state


def test_plan_warns_when_the_engine_does_not_answer(monkeypatch, capsys):
    m = matrix.load(ROOT / "matrix.yaml")
    monkeypatch.setattr(plan, "engine_available", lambda engine: False)
    plan.make_plan(m, [render.render_locked(m, m.variant(CPU), LOCKS)], {}, check_registry=False)
    assert "warning: the Docker engine does not answer" in capsys.readouterr().err
