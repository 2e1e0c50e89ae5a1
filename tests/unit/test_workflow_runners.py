"""GPU jobs land on a GPU runner of the image's architecture, and only CUDA variants go there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

WORKFLOWS = Path(__file__).resolve().parents[2] / ".github" / "workflows"


def jobs(name: str) -> dict[str, Any]:
    return yaml.safe_load((WORKFLOWS / name).read_text())["jobs"]


def test_gpu_smoke_picks_the_runner_by_architecture_and_only_for_cuda() -> None:
    build = jobs("build.yml")
    gpu, cpu = build["smoke-gpu"], build["smoke-cpu"]
    assert "'[\"self-hosted\", \"Linux\", \"ARM64\", \"gpu\"]'" in gpu["runs-on"]
    assert "'[\"self-hosted\", \"Linux\", \"X64\", \"gpu\"]'" in gpu["runs-on"]
    assert gpu["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.gpu_matrix) }}"
    assert cpu["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.cpu_matrix) }}"
    assert "self-hosted" not in cpu["runs-on"] and "gpu" not in cpu["runs-on"]
    plan_step = next(s for s in build["plan"]["steps"] if s.get("id") == "plan")["run"]
    assert 'select(.accelerator == "cuda")' in plan_step
    assert 'select(.accelerator != "cuda")' in plan_step
    # Every smoke job gates publishing; one with nothing to do must not skip it.
    assert set(build["publish"]["needs"]) >= {"build", "smoke-gpu", "smoke-cpu"}
    assert "skipped" in build["publish"]["if"]


def test_the_rebuild_runs_on_an_x86_gpu_runner() -> None:
    assert jobs("rebuild.yml")["rebuild"]["runs-on"] == ["self-hosted", "Linux", "X64", "gpu"]
