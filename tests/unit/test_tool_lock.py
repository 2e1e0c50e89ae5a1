"""The tool is installed from its own hash-pinned lock (requirements.lock) everywhere, `nox -s
lint` fails when pyproject.toml changed without re-locking, and the publish workflow signs
keyless with a SHA-pinned cosign."""

from __future__ import annotations

import importlib.util
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((ROOT / ".github" / "workflows").glob("*.yml"))


def lock_tools(root: Path):
    spec = importlib.util.spec_from_file_location("lock_tools", ROOT / "tools" / "lock_tools.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.ROOT, module.LOCK = root, root / "requirements.lock"
    module.BUILD_REQUIREMENTS = root / "tools" / "build-requirements.in"
    return module


def test_the_shipped_lock_is_current_and_hashed() -> None:
    tool = lock_tools(ROOT)
    assert tool.recorded() == tool.inputs_sha256()
    text = (ROOT / "requirements.lock").read_text()
    pins = re.findall(r"^([a-z0-9][a-z0-9._-]*)==\S+ \\$", text, flags=re.M)
    assert {"cryptography", "pynacl", "securesystemslib", "setuptools", "ruff"} <= set(pins)
    assert text.count("--hash=sha256:") >= len(pins)


def test_a_range_changed_without_relocking_fails_the_check(tmp_path: Path, monkeypatch,
                                                            capsys) -> None:
    (tmp_path / "tools").mkdir()
    for name in ("pyproject.toml", "requirements.lock", "tools/build-requirements.in"):
        shutil.copy(ROOT / name, tmp_path / name)
    tool = lock_tools(tmp_path)
    monkeypatch.setattr(sys, "argv", ["lock_tools.py", "--check"])
    assert tool.main() == 0
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"jinja2>=3.1"', '"jinja2>=3.0"'))
    assert tool.main() == 1
    assert "requirements.lock is stale" in capsys.readouterr().err


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda p: p.name)
def test_workflows_install_the_tool_from_the_lock(path: Path) -> None:
    for job in yaml.safe_load(path.read_text())["jobs"].values():
        for run in (s.get("run", "") for s in job.get("steps", [])):
            for line in run.splitlines():
                if "pip install" not in line or ".venv-smoke" in line:
                    continue
                assert "--require-hashes -r requirements.lock" in line or (
                    "--no-deps" in line), f"{path.name}: `{line.strip()}`"


def test_setup_installs_from_the_lock() -> None:
    text = (ROOT / "tools" / "setup.sh").read_text()
    assert "--require-hashes" in text and "-r requirements.lock" in text
    assert "-e '.[dev]'" not in text


def test_publish_signs_keyless_with_a_pinned_cosign() -> None:
    build = yaml.safe_load((ROOT / ".github" / "workflows" / "build.yml").read_text())
    job = build["jobs"]["publish"]
    assert job["permissions"]["id-token"] == "write"
    uses = [s["uses"] for s in job["steps"] if "uses" in s]
    cosign = [u for u in uses if u.startswith("sigstore/cosign-installer@")]
    assert cosign and re.fullmatch(r"sigstore/cosign-installer@[0-9a-f]{40}", cosign[0])
    runs = "\n".join(s.get("run", "") for s in job["steps"])
    assert "tools/sign_keyless.sh" in runs and 'builder verify "${key[@]}"' in runs
    keyless = (ROOT / "tools" / "sign_keyless.sh").read_text()
    assert "cosign sign --yes --recursive" in keyless and "cosign attest" in keyless
    publish = next(s for s in job["steps"] if "builder publish" in s.get("run", ""))
    assert "${{ secrets.COSIGN_PRIVATE_KEY }}" in publish["env"]["COSIGN_PRIVATE_KEY"]
