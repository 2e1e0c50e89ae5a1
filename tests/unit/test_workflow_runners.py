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
    # Publishing waits for every smoke job, but one failed variant does not stop the others':
    # each publish leg is gated by its own variant's signed evidence, not by the other legs.
    assert set(build["publish"]["needs"]) >= {"build", "smoke-gpu", "smoke-cpu"}
    assert ".result" not in build["publish"]["if"] and "!cancelled()" in build["publish"]["if"]
    assert build["publish"]["strategy"]["fail-fast"] is False


def test_only_cuda_rebuilds_wait_for_the_x86_gpu_runner() -> None:
    rebuild = jobs("rebuild.yml")
    runs_on = rebuild["rebuild"]["runs-on"]
    assert "matrix.gpu && fromJSON('[\"self-hosted\", \"Linux\", \"X64\", \"gpu\"]')" \
        in runs_on and "|| 'ubuntu-24.04'" in runs_on
    check = next(s for s in rebuild["check"]["steps"] if s.get("id") == "check")["run"]
    assert 'test("-cuda[0-9]")' in check
    assert rebuild["rebuild"]["strategy"]["fail-fast"] is False


def check_script() -> str:
    """The rebuild workflow's `check` step (rebuild --check and what its exit code decides)."""
    return next(s for s in jobs("rebuild.yml")["check"]["steps"] if s.get("id") == "check")["run"]


def test_a_quiet_day_with_one_unreachable_source_is_a_warning_not_a_failure() -> None:
    script = check_script()
    two = script[script.index("  2) "):script.index("  *) ")]
    assert 'echo "needed=false"' in two and "could check nothing" in two
    assert "::warning title=rebuild source unknown::" in script


def test_tag_drift_alone_is_a_warning_and_rebuilds_nothing() -> None:
    script = check_script()
    one = script[script.index("  1) "):script.index("  2) ")]
    assert 'jq -e "$rebuilds | length > 0"' in one and 'echo "needed=false"' in one
    assert """rebuilds='[.findings[]? | select(.status == "rebuild")]'""" in script
    assert '. == "repair"' in script and "::warning title=tag drift::" in script


def test_the_daily_job_repairs_drifted_tags_with_the_key_on_a_hosted_runner() -> None:
    """Issue 40 item 3: a `tag-drift` finding is not only a warning: a job that holds the
    signing key or its OIDC token runs `builder publish` for each drifted variant that is not rebuilt anyway,
    checks that no drift is left, and a failed repair opens the tracking issue."""
    wf = jobs("rebuild.yml")
    script = check_script()
    assert 'select(.status == "repair")' in script and "repairs=" in script
    assert wf["check"]["outputs"]["repairs"] == "${{ steps.check.outputs.repairs }}"
    repair = wf["repair"]
    assert repair["needs"] == "check" and "needs.check.outputs.drifted == 'true'" in repair["if"]
    assert repair["runs-on"] == "ubuntu-24.04" and repair["environment"] == "publish"
    # moves registry tags, never git; signs a lost signature again as this workflow
    assert repair["permissions"] == {"contents": "read", "id-token": "write"}
    assert repair["strategy"]["matrix"] == "${{ fromJSON(needs.check.outputs.repairs) }}"
    runs = [s.get("run", "") for s in repair["steps"]]
    login = next(i for i, r in enumerate(runs) if "docker login" in r)
    publish = next(i for i, r in enumerate(runs) if "builder publish " in r)
    assert login < publish and 'builder publish --select "id=$VARIANT_ID"' in runs[publish]
    assert "secrets.COSIGN_PRIVATE_KEY" in str(repair["steps"][publish]["env"])
    assert "builder rebuild --check" in runs[publish + 1]
    assert "repair" in wf["report-failure"]["needs"]
    assert "needs.repair.result == 'failure'" in wf["report-failure"]["if"]


def test_the_daily_check_prints_each_vulnerability_with_a_fix_from_the_signed_audit() -> None:
    """Issue 41.7: `rebuild --check --json` reports each image's fresh audit
    (builder.flows.audit_daily); each vulnerability with a fix becomes a warning annotation."""
    script = check_script()
    assert "jq -r '.audits[]? |" in script and ".fixes[]?" in script
    assert "::warning title=vulnerability with a fix::" in script


def test_the_tracking_issue_opens_on_a_failure_or_a_finding_for_a_person_only() -> None:
    """Issue 41.3: a quiet day (an unreachable source included: a warning) opens nothing; a
    failed job or a matrix-change finding (a torch CVE: no job here can rebuild it) does."""
    wf = jobs("rebuild.yml")
    script = check_script()
    assert 'echo "attention=$(jq -c \'[.findings[]? | select(.status == "matrix-change")]' in script
    assert wf["check"]["outputs"]["attention"] == "${{ steps.check.outputs.attention }}"
    condition = " ".join(wf["report-failure"]["if"].split())
    assert condition == ("always() && (needs.check.result == 'failure' || needs.rebuild.result "
                         "== 'failure' || needs.repair.result == 'failure' || "
                         "needs.check.outputs.attention == 'true')")
    assert "unknown" not in condition and "skipped" not in condition


def test_the_daily_check_attaches_each_fresh_audit_with_the_key_it_is_given() -> None:
    """Issue 41.7: the check step signs the fresh audits whose findings changed with the job's
    OIDC identity and the key (when the repository keeps one), and says per image what the
    re-audit did."""
    check = jobs("rebuild.yml")["check"]
    step = next(s for s in check["steps"] if s.get("id") == "check")
    assert step["env"]["COSIGN_PRIVATE_KEY"] == "${{ secrets.COSIGN_PRIVATE_KEY }}"
    assert check["environment"] == "publish"
    assert check["permissions"] == {"contents": "read", "id-token": "write"}  # keyless too
    assert "::notice title=audit \\(.refresh)::" in step["run"]
