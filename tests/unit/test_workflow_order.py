"""The workflows as shipped: rebuild.yml logs in before it touches the registry, rebuilds and
publishes with one command and signs as build.yml does; secrets reach only the steps that use
them; the check runs daily and names its matrix from the findings it prints."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

WORKFLOWS = Path(__file__).resolve().parents[2] / ".github" / "workflows"
SECRET = re.compile(r"\$\{\{\s*secrets\.([A-Z_]+)\s*\}\}")
# What `builder` itself reads from its environment (cosign's and the registry's names).
BUILDER_READS = {"COSIGN_PRIVATE_KEY", "COSIGN_PASSWORD", "REGISTRY_USERNAME", "REGISTRY_PASSWORD"}


def uses_variable(script: str, var: str) -> bool:
    return f"${var}" in script or "${" + var in script or (
        var in BUILDER_READS and re.search(r"(^|\s)builder ", script) is not None)


def workflow(name: str) -> dict[Any, Any]:
    return yaml.safe_load((WORKFLOWS / name).read_text())


def step_index(steps: list[dict[str, Any]], needle: str) -> int:
    return next(i for i, s in enumerate(steps) if needle in s.get("run", ""))


def test_rebuild_logs_in_first_and_publishes_with_one_command() -> None:
    steps = workflow("rebuild.yml")["jobs"]["rebuild"]["steps"]
    login = step_index(steps, "docker login")
    rebuild = step_index(steps, "builder rebuild ")
    assert login < rebuild
    assert not any("builder publish" in s.get("run", "") for s in steps)
    assert "--check" not in steps[rebuild]["run"]


def test_rebuild_signs_keyless_as_build_does() -> None:
    for name, job in (("build.yml", "publish"), ("rebuild.yml", "rebuild")):
        spec = workflow(name)["jobs"][job]
        assert spec["permissions"].get("id-token") == "write", name
        runs = [s.get("run", "") for s in spec["steps"]]
        assert any(r.startswith("tools/sign_keyless.sh ") for r in runs), name
        assert any(s.get("uses", "").startswith("sigstore/cosign-installer@")
                   for s in spec["steps"]), name


def test_the_check_runs_daily_and_its_matrix_comes_from_the_findings() -> None:
    wf = workflow("rebuild.yml")
    (cron,) = [entry["cron"] for entry in wf[True]["schedule"]]  # YAML 1.1 reads `on` as True
    assert cron.split()[2:] == ["*", "*", "*"], cron
    check = next(s for s in wf["jobs"]["check"]["steps"] if s.get("id") == "check")["run"]
    assert '.findings[]? | select(.status == "rebuild")' in check
    assert "::warning" in check and 'select(.status == "unknown")' in check


def test_secrets_reach_only_the_steps_that_use_them() -> None:
    """No job-level secret: each one is in the env of the step whose script reads it."""
    for name in ("build.yml", "rebuild.yml"):
        for job_name, job in workflow(name)["jobs"].items():
            job_env = " ".join(str(v) for v in (job.get("env") or {}).values())
            assert not SECRET.search(job_env), f"{name}: job `{job_name}` env holds a secret"
            for step in job.get("steps", []):
                env = step.get("env") or {}
                for var, value in env.items():
                    if SECRET.search(str(value)):
                        assert uses_variable(step["run"], var), (
                            f"{name}: `{job_name}` step `{step.get('name')}` gets {var} unused")


def test_no_registry_writing_job_may_write_contents() -> None:
    """Only the relock pull-request job writes to the repository, and it never logs in to the
    registry (nor holds its secrets or the signing key)."""
    for name in ("build.yml", "rebuild.yml"):
        for job_name, job in workflow(name)["jobs"].items():
            perms = job.get("permissions") or {}
            if (name, job_name) == ("rebuild.yml", "relock-pr"):
                assert perms == {"contents": "write", "pull-requests": "write"}
                assert "docker login" not in str(job) and "secrets." not in str(job)
                continue
            assert perms.get("contents") in (None, "read"), f"{name}: `{job_name}`"


def test_ci_signs_without_a_key_and_trusts_the_workflow_identity() -> None:
    """No step needs COSIGN_PRIVATE_KEY: whatever signs (the kept base, staged evidence,
    publish, rebuild, the repair's re-signing of a lost signature) signs with the job's OIDC token (`id-token: write`; builder asks for it when it signs,
    so no step fetches one that could expire before a long build signs),
    whatever reads signatures back trusts the workflows' identity (tools/trusted_identity.sh),
    and a public key is used only when the secret holds one."""
    signing = {("build.yml", "build"): "builder build ",
               ("build.yml", "smoke-gpu"): "builder attest ",
               ("build.yml", "smoke-cpu"): "builder attest ",
               ("build.yml", "publish"): "builder publish ",
               ("rebuild.yml", "rebuild"): "builder rebuild ",
               ("rebuild.yml", "repair"): "builder publish "}
    for (name, job_name), command in signing.items():
        job = workflow(name)["jobs"][job_name]
        assert job["permissions"].get("id-token") == "write", (name, job_name)
        script = job["steps"][step_index(job["steps"], command)]["run"]
        assert "SIGSTORE_ID_TOKEN" not in script, (name, job_name)
    for name in ("build.yml", "rebuild.yml"):
        for job in workflow(name)["jobs"].values():
            for step in job.get("steps", []):
                script = step.get("run", "")
                if re.search(r"^\s*builder (build|publish|verify|rebuild) ", script, re.M):
                    assert '--certificate-identity-regexp "$(tools/trusted_identity.sh)"' in \
                        script or "${args[@]}" in script, (name, step.get("name"))
                if "> cosign.pub" in script:
                    assert 'if [ -n "${COSIGN_PUBLIC_KEY:-}" ]' in script, step.get("name")


def test_build_yml_still_signs_with_the_key_when_the_secret_is_set() -> None:
    """The workflow rehearsal runs build.yml with no COSIGN_* secret (keyless alone); a
    repository that keeps the key still signs with it: each step whose `builder` command signs
    (the kept base, the smoke report, the publication) gets COSIGN_PRIVATE_KEY and
    COSIGN_PASSWORD from the secrets (builder reads them: keypair.signing_key), and the verify
    step passes the secret public key as --key when there is one."""
    jobs = workflow("build.yml")["jobs"]
    for job_name, command in (("build", "builder build "), ("smoke-gpu", "builder smoke "),
                              ("smoke-cpu", "builder smoke "), ("publish", "builder publish ")):
        steps = jobs[job_name]["steps"]
        env = steps[step_index(steps, command)]["env"]
        assert env["COSIGN_PRIVATE_KEY"] == "${{ secrets.COSIGN_PRIVATE_KEY }}", job_name
        assert env["COSIGN_PASSWORD"] == "${{ secrets.COSIGN_PASSWORD }}", job_name
    steps = jobs["publish"]["steps"]
    verify = steps[step_index(steps, "builder verify ")]
    assert verify["env"]["COSIGN_PUBLIC_KEY"] == "${{ secrets.COSIGN_PUBLIC_KEY }}"
    assert "key=(--key cosign.pub)" in verify["run"] and '"${key[@]}"' in verify["run"]


def test_the_catalog_trusts_the_workflows_identity() -> None:
    """The published catalog marks the workflows' identity as the trusted signer (and takes the
    dated tags it signed as the history): the same identity every other reader trusts."""
    steps = workflow("catalog.yml")["jobs"]["site"]["steps"]
    script = steps[step_index(steps, "builder catalog ")]["run"]
    assert '--certificate-identity-regexp "$(tools/trusted_identity.sh)"' in script
    assert "--certificate-oidc-issuer https://token.actions.githubusercontent.com" in script
