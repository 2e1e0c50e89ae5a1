"""rebuild.yml's `relock-pr` job run as GitHub would run it (tests/e2e/actions_runner.py: a
fresh clone, the ubuntu-24.04 image's PATH plus what its steps install) against a local bare
repository, given the relock report a rebuild leg uploads (`builder rebuild --relock-report`).
It needs neither the engine nor the registry (the full rehearsal, test_workflow_rehearsal.py,
runs it after a real rebuild that re-locked nothing: python-vuln is unreachable here)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from actions_runner import JobRecord, Runner, make_origin, make_shims

ROOT = Path(__file__).resolve().parents[2]
CPU = "2.13.0-py3.11-cpu-runtime"
BRANCH = "relock/security-rebuild"


def git(folder: Path, *args: str, **env: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True,
                          text=True, env={"PATH": "/usr/bin:/bin", **env}).stdout


def older_lock(text: str) -> str:
    """The shipped lock as an earlier day's: numpy one patch release back (what the relock
    upgrades; its hashes are placeholders, the job never installs it)."""
    return re.sub(r"numpy==(\d+\.\d+)\.(\d+)((?: \\\n    --hash=sha256:[0-9a-f]{64})+)",
                  lambda m: f"numpy=={m[1]}.{int(m[2]) - 1} \\\n    --hash=sha256:{'0' * 64}",
                  text, count=1)


def test_the_relock_pr_job_pushes_exactly_the_relock_and_opens_the_pull_request(
        tmp_path: Path) -> None:
    origin, tree, runs = tmp_path / "origin.git", tmp_path / "tree", tmp_path / "runs"
    make_origin(origin)
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    relocked = {f"locks/{CPU}.{s}": (ROOT / "locks" / f"{CPU}.{s}").read_text()
                for s in ("txt", "json")}
    old = older_lock(relocked[f"locks/{CPU}.txt"])
    assert old != relocked[f"locks/{CPU}.txt"]
    (tree / "locks" / f"{CPU}.txt").write_text(old)
    git(tree, "init", "-q", "-b", "main")
    git(tree, "add", "-A")
    git(tree, "-c", "user.name=m", "-c", "user.email=m@example.org", "commit", "-qm", "base")
    git(tree, "push", "-q", str(origin), "main", REHEARSAL_CONTENTS="write")
    make_shims(runs)
    runner = Runner(origin=origin, root=runs, secrets={})
    report = runs / "artifacts" / f"relock-{CPU}" / "relock.json"
    report.parent.mkdir(parents=True)
    report.write_text(json.dumps({
        "schema_version": 1, "relocked": [CPU], "files": relocked,
        "title": "Relock from the security rebuild: numpy",
        "body": f"### `{CPU}`\n\n- reasons: python-vuln\n- upgraded: numpy\n"}))
    done = runner.run(tree / ".github" / "workflows" / "rebuild.yml",
                      rerun={"rebuild": JobRecord("rebuild", "success")}, only={"relock-pr"})
    print("\n".join(["", "== relock-pr job log", *runner.log]))
    assert done["relock-pr"].result == "success", runner.log
    print(f"== git diff main {BRANCH} -- locks/ (in the bare origin)")
    print(git(origin, "diff", "main", BRANCH, "--", "locks/"))
    assert git(origin, "diff", "--name-only", "main", BRANCH, "--", "locks/").split() == [
        f"locks/{CPU}.txt"]  # the json's inputs are unchanged: exactly the relock
    assert git(origin, "show", f"{BRANCH}:locks/{CPU}.txt") == relocked[f"locks/{CPU}.txt"]
    log = (runs / "pull-requests.log").read_text()
    assert f"gh pr create --head {BRANCH} --base main" in log and f"### `{CPU}`" in log
