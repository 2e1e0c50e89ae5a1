"""The workflows rehearsed: build.yml and rebuild.yml run as GitHub would run them
(tests/e2e/actions_runner.py), for the CPU runtime only, against a registry with credentials
that is the only thing their jobs share, each job with a PATH of the ubuntu-24.04 runner image's
tools plus what its own steps install (tests/e2e/runner_image.py).

  0. A planted build.yml whose build job does not install mmdebstrap fails there (after the
     shipped plan job, which the plant leaves as it is).
  1. build.yml (dispatched with `select: id=<CPU runtime>`): plan → build --stage → smoke →
     publish → catalog, with numpy one patch release older in the lock, keyless: the smoke job
     attests the staged evidence and publish signs with the job's OIDC token, trusting the
     workflows' identity (tools/trusted_identity.sh). Then, from a fresh clone, `builder verify
     --certificate-identity …/build.yml@refs/heads/main --certificate-oidc-issuer …` is ok on
     the published tag, and one trusting a pull-request ref identity is refused in one line.
  2. The registry is the record: the catalog job (a fresh clone with no published.json and an
     empty state folder, as every job) lists the variant.
  3. A planted `contents: read` publish job that commits its record is refused (re-run); its
     `builder publish` says "already published as …".
  4. numpy bumped in the lock (the shipped lock): rebuild.yml's check job names the variant; a
     planted rebuild.yml that logs in after the rebuild fails (after that check job); the
     shipped one runs check → rebuild (publishes `-YYYYMMDD.1`) → catalog.
  5. `builder verify --certificate-identity …/rebuild.yml@refs/heads/main` of the new dated
     tag, from a fresh clone.
A job is run once per phase: a planted workflow runs the job it changes after the shipped
workflow's earlier jobs, whose records it is given as GitHub's re-run gives a finished job's.
The relock-pr job runs after the rebuild (no relock here: python-vuln is unreachable); given
a relock report it is rehearsed alone by test_relock_pr_job.py.

No COSIGN_PRIVATE_KEY, COSIGN_PASSWORD or COSIGN_PUBLIC_KEY secret is set: everything signs
keylessly. `@sigstore/mock`'s Fulcio and Rekor (keyless_mock.py) stand in for the public good,
named in the runner's environment (BUILDER_SIGSTORE_CONFIG, BUILDER_TRUSTED_ROOT: GitHub's
runners set neither), and a loopback stand-in for GitHub's OIDC token endpoint gives each job
with `id-token: write` a token for its workflow file on refs/heads/main. cosign itself is not
installable here: the step that runs it (tools/sign_keyless.sh) is skipped and logged. The key
path stays proven by the `--key` e2e modules. The vulnerability feed this machine cannot reach
(python-vuln) is named in the runner's environment (REBUILD_SKIP_SOURCES) and reported as
skipped.
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
from actions_runner import REPOSITORY, JobRecord, Runner, make_origin, make_shims
from helpers import free_port, missing, remove_images_of
from keyless_mock import by, oidc_endpoint

from builder.commands.options import SIGSTORE_CONFIG_ENV, TRUSTED_ROOT_ENV
from builder.core import clock, oci, twin_cache

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
CPU = "2.13.0-py3.11-cpu-runtime"
USER, PASSWORD = "ci", "rehearsal-" + uuid.uuid4().hex[:12]
OLD_NUMPY = "numpy==2.4.5"
# The jobs' one clock (builder/core/clock.py), fixed for the whole rehearsal: a run that crosses
# midnight UTC expects one day in every job's dated tags.
NOW = clock.start().strftime("%Y-%m-%dT%H:%M:%SZ")
WORKFLOWS = f"https://github.com/{REPOSITORY}/.github/workflows"
BUILD, REBUILD = f"{WORKFLOWS}/build.yml@refs/heads/main", f"{WORKFLOWS}/rebuild.yml@refs/heads/main"
PULL = f"{WORKFLOWS}/build.yml@refs/pull/7/merge"


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


def trusted_identity() -> str:
    """tools/trusted_identity.sh as the jobs run it: the regexp their tokens must match."""
    return subprocess.run(["bash", str(ROOT / "tools" / "trusted_identity.sh")], check=True,
                          capture_output=True, text=True,
                          env={**os.environ, "GITHUB_REPOSITORY": REPOSITORY}).stdout.strip()


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory, mock: Path) -> Iterator[dict[str, Any]]:
    """Registry, origin repository (phase 1: numpy one patch older), the mock sigstore
    services and GitHub OIDC endpoint, runner (no signing key anywhere)."""
    tmp = tmp_path_factory.mktemp("rehearsal")
    (tmp / "registry").mkdir()
    addr, registry = start_registry(tmp / "registry")
    repository = f"rehearsal-{uuid.uuid4().hex[:8]}-torch"
    sigstore = {SIGSTORE_CONFIG_ENV: str(mock / "trust_config.json"),
                TRUSTED_ROOT_ENV: str(mock / "trusted_root.json")}
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
    # The machine's zstd twin cache (conftest's, one for the run), kept between jobs as a
    # self-hosted runner keeps its ~/.cache: a publish twins only layers no job twinned before.
    twins = {twin_cache.ENV: os.environ[twin_cache.ENV]} if twin_cache.ENV in os.environ else {}
    with oidc_endpoint() as oidc:
        runner = Runner(origin=origin, root=tmp / "runs", secrets={
            "REGISTRY_USERNAME": USER, "REGISTRY_PASSWORD": PASSWORD},
            runner_env={"REBUILD_SKIP_SOURCES": "python-vuln", clock.ENV: NOW, **sigstore,
                        **twins},
            oidc=oidc.grant)
        yield {"tmp": tmp, "addr": addr, "repository": repository, "tree": tree,
               "origin": origin, "runner": runner, "sigstore": sigstore}
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


def jobs_after(path: Path) -> set[str]:
    """The jobs of the workflow at `path` but its first (run once, its record passed on as
    GitHub's re-run passes a finished job's)."""
    return set(list(yaml.safe_load(path.read_text())["jobs"])[1:])


def printed(runner: Runner, text: str) -> str:
    """The last line a job's steps printed that holds `text` ("" when none did)."""
    found = [line for log in sorted(runner.root.glob("job*/runner/steps.log"))
             for line in log.read_text().splitlines() if text in line]
    return found[-1] if found else ""


def results(done: dict[str, JobRecord]) -> dict[str, str]:
    return {name: job.result for name, job in done.items()}


def tags(stage: dict[str, Any]) -> list[str]:
    reg = oci.Registry(stage["addr"])
    os.environ["REGISTRY_USERNAME"], os.environ["REGISTRY_PASSWORD"] = USER, PASSWORD
    try:
        return reg.tags(stage["repository"])
    finally:
        del os.environ["REGISTRY_USERNAME"], os.environ["REGISTRY_PASSWORD"]


def in_fresh_clone(stage: dict[str, Any], *args: str, **extra: str
                   ) -> subprocess.CompletedProcess[str]:
    """`builder ARGS` in a fresh clone of the origin with an empty state folder, no key, the
    mock sigstore instance (and `extra` in the environment)."""
    clone = stage["tmp"] / f"clone-{uuid.uuid4().hex[:6]}"
    subprocess.run(["git", "clone", "-q", str(stage["origin"]), str(clone)], check=True)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith(("COSIGN_", "SIGSTORE_"))},
           "REGISTRY_USERNAME": USER, "REGISTRY_PASSWORD": PASSWORD,
           "BUILDER_STATE": str(clone / ".state"), "PYTHONPATH": str(clone), clock.ENV: NOW,
           **stage["sigstore"], **extra}
    return subprocess.run([sys.executable, "-m", "builder", *args], cwd=clone, env=env,
                          capture_output=True, text=True, timeout=3600, check=False)


def keyless_lines(runner: Runner) -> list[str]:
    """What the jobs' steps printed about their workflow identity (attest, publish, verify),
    from each job's steps.log: the keyless part of the run's log."""
    found = []
    for log in sorted(runner.root.glob("job*/runner/steps.log")):
        label = ""
        for line in log.read_text().splitlines():
            label = line[3:].rpartition(" (exit")[0] if line.startswith("== ") else label
            if f"{REPOSITORY}/.github/workflows" in line and not line.startswith("== "):
                found.append(f"  {log.parts[-3]} `{label}`: {line.strip()}")
    return found


def verify_by(stage: dict[str, Any], image: str, identity: str
              ) -> subprocess.CompletedProcess[str]:
    """`builder verify IMAGE --certificate-identity IDENTITY --certificate-oidc-issuer …` from
    a fresh clone (the mock's trusted root), logged with its output."""
    done = in_fresh_clone(stage, "verify", image, *by(identity))
    stage["runner"].log += [f"== builder verify {image.rpartition(':')[2]} "
                            f"{' '.join(by(identity))}: exit {done.returncode}",
                            *done.stdout.splitlines(), *done.stderr.splitlines()]
    return done


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
    build_yml = workflow(stage, "build.yml")
    inputs = {"select": f"id={CPU}", "arm64_emulated": False}
    runner.log.append("== build.yml (workflow_dispatch, select: id=" + CPU + "): plan")
    planned = runner.run(build_yml, inputs=inputs, only={"plan"})
    # 0. planted: a job that runs a tool no step installed fails on the runner image's PATH
    # (after the same plan job: the plant changes the build job alone)
    runner.log.append("== planted build.yml: the build job does not install mmdebstrap")
    planted = runner.run(workflow(stage, "build.yml", plant_no_mmdebstrap), inputs=inputs,
                         rerun=planned, only={"build"})
    assert (planted["plan"].result, planted["build"].result) == ("success", "failure")
    assert any("mmdebstrap: command not found" in line for line in runner.log), runner.log
    assert not (runner.root / "runner-bin" / "mmdebstrap").exists()
    assert tags(stage) == []
    # 1. build.yml: the jobs after its plan
    runner.log.append("== build.yml: the jobs after the plan")
    built = runner.run(build_yml, inputs=inputs, rerun=planned, only=jobs_after(build_yml))
    assert results(built) == {"plan": "success", "build": "success", "smoke-gpu": "skipped",
                              "smoke-cpu": "success", "publish": "success",
                              "catalog": "success"}, runner.log
    assert f"{CPU}-{today}" in tags(stage)
    # … keylessly: the staged evidence attested and the publication signed by the job's token,
    # only the cosign step skipped (no cosign here)
    assert ("builder attest the staged evidence (keyless, GitHub OIDC)", "success") in \
        built["smoke-cpu"].steps
    assert ("cosign sign and attest (keyless, GitHub OIDC)", "skipped") in built["publish"].steps
    assert re.fullmatch(trusted_identity(), BUILD) and not re.fullmatch(trusted_identity(), PULL)
    runner.log += ["== the keyless steps' output", *keyless_lines(runner)]
    image = f"{stage['addr']}/{stage['repository']}:{CPU}-{today}"
    ok = verify_by(stage, image, BUILD)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    assert f"`{CPU}-{today}` is among the tags signed" in ok.stdout, ok.stdout
    refused = verify_by(stage, image, PULL)
    errors = [x for x in refused.stderr.splitlines() if x.startswith("error:")]
    assert refused.returncode == 1 and len(errors) == 1, refused.stdout + refused.stderr
    assert f"another identity: signed by {BUILD}" in errors[0], errors
    # 2. the registry is the record: the catalog job (a fresh clone, no published.json, an
    # empty state) listed it from the registry alone
    site = runner.root / "artifacts" / "github-pages" / "site" / "catalog.json"
    assert CPU in site.read_text(), site

    # 3. planted: a contents: read publish job that commits (GitHub's re-run of that job); its
    # `builder publish`, in a fresh clone with an empty state, finds the content published
    runner.log.append("== planted build.yml: publish (contents: read) commits its record")
    planted = runner.run(workflow(stage, "build.yml", plant_commit),
                         inputs={"select": f"id={CPU}"}, rerun=built, only={"publish"})
    assert planted["publish"].result == "failure"
    assert ("Record the publication in git", "failure") in planted["publish"].steps
    assert any("Permission to rehearsal/torch-images denied" in line for line in runner.log)
    again = printed(runner, "already published as ")
    assert f"already published as {stage['addr']}/{stage['repository']}@sha256:" in again \
        and f"(dated {CPU}-{today})" in again, again

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
    rebuild_yml = workflow(stage, "rebuild.yml")
    runner.log.append("== rebuild.yml (schedule): check")
    checked = runner.run(rebuild_yml, only={"check"})
    report = runner.root / "artifacts" / "rebuild-check" / "rebuild-check.json"
    assert json.loads(report.read_text())["checked"] == [CPU], report.read_text()[-3000:]
    # (after the same check job: the plant changes the rebuild job alone)
    runner.log.append("== planted rebuild.yml: log in after the rebuild")
    planted = runner.run(workflow(stage, "rebuild.yml", plant_login_after_rebuild),
                         rerun=checked, only={"rebuild"})
    assert planted["check"].result == "success" and planted["rebuild"].result == "failure"
    assert tags(stage) == before
    runner.log.append("== rebuild.yml: the jobs after the check")
    rebuilt = runner.run(rebuild_yml, rerun=checked, only=jobs_after(rebuild_yml))
    assert results(rebuilt) == {"check": "success", "rebuild": "success", "repair": "skipped",
                                "relock-pr": "success", "catalog": "success",
                                "report-failure": "skipped"}, runner.log
    dated = f"{CPU}-{today}.1"
    assert dated in tags(stage)
    assert ("builder rebuild (rebuilds, smokes and publishes)", "success") in \
        rebuilt["rebuild"].steps
    runner.log += ["== the keyless steps' output since", *[
        x for x in keyless_lines(runner) if x not in runner.log]]

    # 5. the new dated tag verifies by rebuild.yml's identity
    verify = verify_by(stage, f"{stage['addr']}/{stage['repository']}:{dated}", REBUILD)
    assert verify.returncode == 0, verify.stdout[-3000:] + verify.stderr[-3000:]
