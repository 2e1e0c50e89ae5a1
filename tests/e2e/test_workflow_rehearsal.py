"""The workflows rehearsed: build.yml and rebuild.yml run as GitHub would run them
(tests/e2e/actions_runner.py), for the CPU runtime only, against a registry with credentials
that is the only thing their jobs share, each job with a PATH of the ubuntu-24.04 runner image's
tools plus what its own steps install (tests/e2e/runner_image.py).

  0. A planted build.yml whose build job does not install mmdebstrap fails there.
  1. build.yml (dispatched with `select: id=<CPU runtime>`): plan → build --stage → smoke →
     publish → catalog, with numpy one patch release older in the lock.
  2. A fresh clone with no published.json and an empty state folder: `rebuild --check` names
     the variant, `catalog` lists it, a second `publish` says "already published as …".
  3. A planted `contents: read` publish job that commits its record is refused (re-run).
  4. numpy bumped in the lock (the shipped lock): a planted rebuild.yml that logs in after the
     rebuild fails; the shipped one runs check → rebuild (publishes `-YYYYMMDD.1`) → catalog.
  5. `builder verify --key cosign.pub` of the new dated tag, from a fresh clone.
The relock-pr job runs after the rebuild (no relock here: python-vuln is unreachable); given
a relock report it is rehearsed alone by test_relock_pr_job.py.

Secrets come from a throw-away `builder keygen`. The vulnerability feed this machine cannot
reach (python-vuln) is named in the runner's environment (REBUILD_SKIP_SOURCES) and reported as
skipped; keyless signing steps are skipped and logged (no GitHub OIDC here).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from actions_runner import JobRecord, Runner, make_origin, make_shims
from helpers import free_port, missing, remove_images_of

from builder.core import clock, oci

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
CPU = "2.13.0-py3.11-cpu-runtime"
USER, PASSWORD = "ci", "rehearsal-" + uuid.uuid4().hex[:12]
OLD_NUMPY = "numpy==2.4.5"
# The jobs' one clock (builder/core/clock.py), fixed for the whole rehearsal: a run that crosses
# midnight UTC expects one day in every job's dated tags.
NOW = clock.start().strftime("%Y-%m-%dT%H:%M:%SZ")


def git(folder: Path, *args: str, **env: str) -> str:
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True,
                          text=True, env={**os.environ, **env}).stdout


def rehearsal_matrix(addr: str, repository: str, packages: list[str]) -> str:
    """The shipped matrix cut to the CPU runtime, in the rehearsal's registry."""
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    cpu = next(e for e in data["include"] if e.get("accelerator") == "cpu"
               and e.get("flavor") == "runtime")
    data.update(registry=addr, repository=repository, packages=packages, include=[cpu],
                axes={"torch": [cpu["torch"]], "python": [cpu["python"]],
                      "accelerator": ["cpu"], "flavor": ["runtime"]},
                aliases=[], default=[{"torch": cpu["torch"], "flavor": "runtime"}])
    return yaml.safe_dump(data, sort_keys=False)


def start_registry(folder: Path) -> tuple[str, subprocess.Popen[bytes]]:
    """docker-registry on a free port with htpasswd credentials (plain HTTP on loopback)."""
    binary = shutil.which("docker-registry") or missing("no docker-registry (tools/setup.sh)")
    htpasswd = shutil.which("htpasswd") or missing("no htpasswd (tools/setup.sh)")
    subprocess.run([htpasswd, "-Bbc", str(folder / "htpasswd"), USER, PASSWORD], check=True,
                   capture_output=True)
    addr = f"127.0.0.1:{free_port()}"
    (folder / "config.json").write_text(json.dumps({
        "version": "0.1", "log": {"level": "warn"}, "http": {"addr": addr},
        "auth": {"htpasswd": {"realm": "rehearsal", "path": str(folder / "htpasswd")}},
        "storage": {"filesystem": {"rootdirectory": str(folder / "storage")},
                    "delete": {"enabled": True}}}))
    log = (folder / "registry.log").open("w")
    child = subprocess.Popen([binary, "serve", str(folder / "config.json")], stdout=log,
                             stderr=log)
    for _ in range(100):
        if subprocess.run(["curl", "-s", "-o", "/dev/null", f"http://{addr}/v2/"],
                          check=False).returncode == 0:
            break
        time.sleep(0.1)
    return addr, child


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Registry, origin repository (phase 1: numpy one patch older), keys, runner."""
    tmp = tmp_path_factory.mktemp("rehearsal")
    (tmp / "registry").mkdir()
    addr, registry = start_registry(tmp / "registry")
    repository = f"rehearsal-{uuid.uuid4().hex[:8]}-torch"
    keys = tmp / "keys"
    keys.mkdir()
    subprocess.run([sys.executable, "-m", "builder", "keygen", "--out", str(keys)], check=True,
                   capture_output=True, env={**os.environ, "COSIGN_PASSWORD": PASSWORD})
    origin, tree = tmp / "origin.git", tmp / "maintainer"
    make_origin(origin)
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others",
                            "--exclude-standard"], check=True, capture_output=True,
                           text=True).stdout.split("\0")
    for name in filter(None, files):
        if (ROOT / name).is_file() and not (ROOT / name).is_symlink():
            (tree / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, tree / name)
    (tree / "matrix.yaml").write_text(rehearsal_matrix(addr, repository, [OLD_NUMPY]))
    lock = subprocess.run([sys.executable, "-m", "builder", "lock", "--select", f"id={CPU}"],
                          cwd=tree, capture_output=True, text=True, check=False)
    if lock.returncode != 0:
        missing(f"cannot lock {OLD_NUMPY} (PyPI?): {lock.stderr[-1500:]}")
    git(tree, "init", "-q", "-b", "main")
    git(tree, "add", "-A")
    git(tree, "-c", "user.name=maintainer", "-c", "user.email=m@example.org", "commit", "-qm",
        f"rehearsal: the CPU runtime with {OLD_NUMPY}")
    git(tree, "push", "-q", str(origin), "main", REHEARSAL_CONTENTS="write")
    make_shims(tmp / "runs")
    runner = Runner(origin=origin, root=tmp / "runs", secrets={
        "REGISTRY_USERNAME": USER, "REGISTRY_PASSWORD": PASSWORD,
        "COSIGN_PRIVATE_KEY": (keys / "cosign.key").read_text(), "COSIGN_PASSWORD": PASSWORD,
        "COSIGN_PUBLIC_KEY": (keys / "cosign.pub").read_text()},
        runner_env={"REBUILD_SKIP_SOURCES": "python-vuln", clock.ENV: NOW})
    yield {"tmp": tmp, "addr": addr, "repository": repository, "keys": keys, "tree": tree,
           "origin": origin, "runner": runner}
    print("\n".join(["", "== rehearsal job log", *runner.log]))
    registry.terminate()
    registry.wait(timeout=10)
    remove_images_of(tree / "matrix.yaml")


def workflow(stage: dict[str, Any], name: str, plant: Any = None) -> Path:
    """The workflow as the origin's main holds it (or with `plant` applied), in a checkout."""
    checkout = stage["tmp"] / f"wf-{uuid.uuid4().hex[:6]}"
    subprocess.run(["git", "clone", "-q", str(stage["origin"]), str(checkout)], check=True)
    path = checkout / ".github" / "workflows" / name
    if plant is not None:
        doc = yaml.safe_load(path.read_text())
        plant(doc)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def results(done: dict[str, JobRecord]) -> dict[str, str]:
    return {name: job.result for name, job in done.items()}


def tags(stage: dict[str, Any]) -> list[str]:
    reg = oci.Registry(stage["addr"])
    os.environ["REGISTRY_USERNAME"], os.environ["REGISTRY_PASSWORD"] = USER, PASSWORD
    try:
        return reg.tags(stage["repository"])
    finally:
        del os.environ["REGISTRY_USERNAME"], os.environ["REGISTRY_PASSWORD"]


def in_fresh_clone(stage: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    """`builder ARGS` in a fresh clone of the origin with an empty state folder."""
    clone = stage["tmp"] / f"clone-{uuid.uuid4().hex[:6]}"
    subprocess.run(["git", "clone", "-q", str(stage["origin"]), str(clone)], check=True)
    env = {**os.environ, "REGISTRY_USERNAME": USER, "REGISTRY_PASSWORD": PASSWORD,
           "COSIGN_PASSWORD": PASSWORD, "BUILDER_STATE": str(clone / ".state"),
           "PYTHONPATH": str(clone), clock.ENV: NOW}
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=3600, check=False)


def plant_commit(doc: dict[str, Any]) -> None:
    """A publish job (contents: read) that commits its report to the repository."""
    doc["jobs"]["publish"]["steps"].append({
        "name": "Record the publication in git",
        "run": "date -u > publication-record.txt\n"
               "git add publication-record.txt\n"
               "git -c user.name=ci -c user.email=ci@example.org commit -qm record\n"
               "git push origin HEAD:main"})


def plant_login_after_rebuild(doc: dict[str, Any]) -> None:
    steps = doc["jobs"]["rebuild"]["steps"]
    login = next(i for i, s in enumerate(steps) if s.get("name") == "Log in to the registry")
    rebuild = next(i for i, s in enumerate(steps) if "builder rebuild" in s.get("run", ""))
    steps.insert(rebuild, steps.pop(login))


def plant_no_mmdebstrap(doc: dict[str, Any]) -> None:
    """The build job without the step that installs mmdebstrap (not on the runner image), and
    a step that runs it. (Its `builder build` alone would not show it here: the jobs share this
    machine's engine, which holds today's bootstrapped base, where a fresh runner has none.)"""
    steps = doc["jobs"]["build"]["steps"]
    at = next(i for i, s in enumerate(steps) if "mmdebstrap" in s.get("run", ""))
    steps[at] = {"name": "Bootstrap tool", "run": "mmdebstrap --version"}


def test_the_workflows_rehearsed(stage: dict[str, Any]) -> None:
    runner: Runner = stage["runner"]
    today = NOW[:10].replace("-", "")  # every job's day: the one clock, fixed for the run
    # 0. planted: a job that runs a tool no step installed fails on the runner image's PATH
    runner.log.append("== planted build.yml: the build job does not install mmdebstrap")
    planted = runner.run(workflow(stage, "build.yml", plant_no_mmdebstrap),
                         inputs={"select": f"id={CPU}", "arm64_emulated": False},
                         only={"plan", "build"})
    assert (planted["plan"].result, planted["build"].result) == ("success", "failure")
    assert any("mmdebstrap: command not found" in line for line in runner.log), runner.log
    assert not (runner.root / "runner-bin" / "mmdebstrap").exists()
    assert tags(stage) == []
    # 1. build.yml
    runner.log.append("== build.yml (workflow_dispatch, select: id=" + CPU + ")")
    built = runner.run(workflow(stage, "build.yml"),
                       inputs={"select": f"id={CPU}", "arm64_emulated": False})
    assert results(built) == {"plan": "success", "build": "success", "smoke-gpu": "skipped",
                              "smoke-cpu": "success", "publish": "success",
                              "catalog": "success"}, runner.log
    assert f"{CPU}-{today}" in tags(stage)

    # 2. a fresh clone: the registry is the record
    runner.log.append("== fresh clone, no published.json, empty state")
    check = in_fresh_clone(stage, "rebuild", "--check", "--json", "--trust-key",
                           str(stage["keys"] / "cosign.pub"), "--skip-source", "python-vuln")
    runner.log.append(f"rebuild --check --json --trust-key cosign.pub: exit {check.returncode}")
    assert check.returncode in (0, 1), check.stderr[-3000:]
    assert json.loads(check.stdout)["checked"] == [CPU]
    site = stage["tmp"] / "site"
    catalog = in_fresh_clone(stage, "catalog", "--out", str(site), "--json")
    listed = (site / "catalog.json").read_text() if catalog.returncode == 0 else ""
    runner.log.append(f"catalog: exit {catalog.returncode}, lists {CPU}: {CPU in listed}")
    assert catalog.returncode == 0 and CPU in listed, catalog.stderr[-3000:]
    again = in_fresh_clone(stage, "publish", "--key", str(stage["keys"] / "cosign.key"))
    runner.log.append(f"publish (same content): exit {again.returncode}: "
                      + " ".join(re.findall(r"already published as \S+ \(dated \S+\)",
                                            again.stdout + again.stderr)[:1]))
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"already published as {stage['addr']}/{stage['repository']}@sha256:" in (
        again.stdout + again.stderr) and f"(dated {CPU}-{today})" in again.stdout + again.stderr

    # 3. planted: a contents: read publish job that commits (GitHub's re-run of that job)
    runner.log.append("== planted build.yml: publish (contents: read) commits its record")
    planted = runner.run(workflow(stage, "build.yml", plant_commit),
                         inputs={"select": f"id={CPU}"}, rerun=built, only={"publish"})
    assert planted["publish"].result == "failure"
    assert ("Record the publication in git", "failure") in planted["publish"].steps
    assert any("Permission to rehearsal/torch-images denied" in line for line in runner.log)

    # 4. numpy bumped in the lock (the shipped lock)
    tree = stage["tree"]
    (tree / "matrix.yaml").write_text(rehearsal_matrix(stage["addr"], stage["repository"],
                                                       ["numpy"]))
    for suffix in ("txt", "json"):
        shutil.copy2(ROOT / "locks" / f"{CPU}.{suffix}", tree / "locks" / f"{CPU}.{suffix}")
    git(tree, "-c", "user.name=maintainer", "-c", "user.email=m@example.org", "commit", "-qam",
        "lock: numpy bumped")
    git(tree, "push", "-q", str(stage["origin"]), "main", REHEARSAL_CONTENTS="write")
    before = tags(stage)
    runner.log.append("== planted rebuild.yml: log in after the rebuild")
    planted = runner.run(workflow(stage, "rebuild.yml", plant_login_after_rebuild))
    assert planted["check"].result == "success" and planted["rebuild"].result == "failure"
    assert tags(stage) == before
    runner.log.append("== rebuild.yml (schedule)")
    rebuilt = runner.run(workflow(stage, "rebuild.yml"))
    assert results(rebuilt) == {"check": "success", "rebuild": "success", "repair": "skipped",
                                "relock-pr": "success", "catalog": "success",
                                "report-failure": "skipped"}, runner.log
    dated = f"{CPU}-{today}.1"
    assert dated in tags(stage)

    # 5. the new dated tag verifies with the key
    verify = in_fresh_clone(stage, "verify", "--key", str(stage["keys"] / "cosign.pub"),
                            f"{stage['addr']}/{stage['repository']}:{dated}")
    runner.log.append(f"== builder verify --key cosign.pub {dated}: exit {verify.returncode}")
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]

