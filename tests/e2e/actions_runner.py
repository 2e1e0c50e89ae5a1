"""A small GitHub Actions runner for the workflow rehearsal (tests/e2e/test_workflow_rehearsal.py).

It runs a workflow's jobs as GitHub would, in `needs` order: each job (each matrix leg) in its
own fresh clone of an origin repository and its own empty HOME (so its own docker login and
`.state/`), the same `run:` scripts under `bash -e` with GITHUB_OUTPUT, GITHUB_ENV and
GITHUB_STEP_SUMMARY files, job outputs and matrices passed as GitHub passes them (strings,
`fromJSON`), `if:` with GitHub's implicit `success()` (expressions: actions_expressions.py),
secrets and inputs from the caller. The registry (and artifacts, GitHub's own storage) is the
only thing jobs share.

Each job's PATH holds only the tools of GitHub's ubuntu-24.04 image (runner_image.py, from the
committed runner_tools_ubuntu-24.04.txt) and what its own steps install (`sudo apt-get install`),
so a step running a tool no earlier step installed fails as it would on GitHub.
`uses:` steps that only set up tools are stood in for here (STAND_INS names each); any other
`uses:` fails the job. A job with `id-token: write` gets ACTIONS_ID_TOKEN_REQUEST_URL and
ACTIONS_ID_TOKEN_REQUEST_TOKEN from the runner's `oidc` (a stand-in for GitHub's token endpoint
that issues a token for the job's workflow identity), so its keyless signing runs; a step that
runs cosign (tools/sign_keyless.sh) is skipped and logged where cosign is not installed
(sigstore/cosign-installer downloads it from GitHub). A job's `permissions: contents` decides
whether a `git push` to the origin is accepted (its pre-receive hook), as GITHUB_TOKEN's
permission decides on GitHub.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import runner_image
import yaml
from actions_expressions import as_text, condition, substitute

STEP_TIMEOUT = 3600
REPOSITORY, REF = "rehearsal/torch-images", "refs/heads/main"  # what every job runs as

# ---- the runner ---------------------------------------------------------------------------------


@dataclass
class JobRecord:
    name: str
    result: str  # success | failure | skipped
    outputs: dict[str, str] = field(default_factory=dict)
    steps: list[tuple[str, str]] = field(default_factory=list)  # (step, outcome)


@dataclass
class Runner:
    origin: Path  # a bare repository; every job clones it
    root: Path  # jobs' folders and artifacts
    secrets: dict[str, str]
    runner_env: dict[str, str] = field(default_factory=dict)  # the self-hosted runner's .env
    # GitHub's OIDC token endpoint: a job_workflow_ref's ACTIONS_ID_TOKEN_REQUEST_* variables
    oidc: Callable[[str], dict[str, str]] | None = None
    log: list[str] = field(default_factory=list)
    counter: int = 0

    def run(self, workflow: Path, inputs: Mapping[str, Any] | None = None,
            rerun: Mapping[str, JobRecord] | None = None, only: set[str] | None = None,
            prefix: str = "", secrets: Mapping[str, str] | None = None
            ) -> dict[str, JobRecord]:
        """Every job of `workflow` (a path inside a clone of the origin) in `needs` order;
        with `only`, just those jobs, the others' results taken from `rerun` (GitHub's re-run)."""
        wf = yaml.safe_load(workflow.read_text())
        done: dict[str, JobRecord] = dict(rerun or {})
        for name in job_order(wf["jobs"]):
            if only is not None and name not in only:
                continue
            done[name] = self.job(wf, name, done, dict(inputs or {}), secrets or self.secrets,
                                  workflow, prefix)
        return done

    def job(self, wf: dict[str, Any], name: str, done: dict[str, JobRecord],
            inputs: dict[str, Any], secrets: Mapping[str, str], workflow: Path,
            prefix: str) -> JobRecord:
        spec = wf["jobs"][name]
        needs = [spec["needs"]] if isinstance(spec.get("needs"), str) else spec.get("needs", [])
        context = {"needs": {n: {"result": done[n].result, "outputs": done[n].outputs}
                             for n in needs}, "inputs": inputs, "secrets": dict(secrets),
                   "github": {"token": "", "repository": REPOSITORY,
                              "server_url": "file://", "run_id": "1", "ref": REF},
                   "vars": {}, "env": {}}
        results = [done[n].result for n in needs]
        status = {"success": all(r == "success" for r in results), "always": True,
                  "cancelled": False, "failure": any(r == "failure" for r in results)}
        title = f"{prefix}{name}"
        if not condition(spec.get("if"), context, status):
            self.log.append(f"{title}: skipped")
            return JobRecord(title, "skipped")
        if "uses" in spec:  # a reusable workflow of the same repository
            called = workflow.parent / Path(spec["uses"]).name
            passed = {k: as_text(substitute(v, context, status))
                      for k, v in (spec.get("secrets") or {}).items()}
            jobs = self.run(called, prefix=f"{title} / ", secrets=passed)
            result = "failure" if any(j.result == "failure" for j in jobs.values()) else "success"
            return JobRecord(title, result)
        legs = matrix_legs(substitute((spec.get("strategy") or {}).get("matrix"),
                                      context, status))
        records = [self.leg(wf, spec, prefix, {**context, "matrix": leg}, workflow)
                   for leg in legs]
        failed = any(r.result == "failure" for r in records)
        outputs = records[-1].outputs if records else {}
        return JobRecord(title, "failure" if failed else "success", outputs,
                         [s for r in records for s in r.steps])

    def leg(self, wf: dict[str, Any], spec: dict[str, Any], prefix: str,
            context: dict[str, Any], workflow: Path) -> JobRecord:
        self.counter += 1
        home = self.root / f"job{self.counter:02d}"
        work, files = home / "work", home / "runner"
        files.mkdir(parents=True)
        status = {"success": True, "always": True, "cancelled": False, "failure": False}
        name = prefix + as_text(substitute(spec.get("name", ""), context, status))
        perms = spec.get("permissions", wf.get("permissions", {})) or {}
        env = self.base_env(home, work, files, perms)
        env.update(self.id_token(perms, workflow))
        env.update({k: as_text(substitute(v, context, status))
                    for k, v in {**(wf.get("env") or {}), **(spec.get("env") or {})}.items()})
        context["env"] = env
        record, started = JobRecord(name, "success"), time.monotonic()
        steps_ctx: dict[str, Any] = {}
        context["steps"] = steps_ctx
        for step in spec.get("steps", []):
            label = (step.get("name") or step.get("uses", "").split("@")[0]
                     or step.get("run", "").splitlines()[0])
            status["success"] = record.result == "success"
            status["failure"] = record.result == "failure"
            if not condition(step.get("if"), context, status):
                record.steps.append((label, "skipped"))
                continue
            outcome, outputs = self.step(step, label, context, status, env, work, files)
            if step.get("id"):
                steps_ctx[step["id"]] = {"outputs": outputs, "outcome": outcome}
            record.steps.append((label, outcome))
            if outcome == "failure" and not step.get("continue-on-error"):
                record.result = "failure"
        context["steps"] = steps_ctx
        record.outputs = {k: as_text(substitute(v, context, status))
                          for k, v in (spec.get("outputs") or {}).items()}
        self.log.append(f"{name}: {record.result} in {time.monotonic() - started:.0f} s ("
                        + ", ".join(f"{s} {o}" for s, o in record.steps) + ")")
        return record

    def base_env(self, home: Path, work: Path, files: Path, perms: Any) -> dict[str, str]:
        contents = "write" if perms == "write-all" or (
            isinstance(perms, dict) and perms.get("contents") == "write") else "read"
        shims, tools = self.root / "shims", home / "tools"
        tools.mkdir(parents=True, exist_ok=True)
        path = f"{shims}:{tools}:{runner_image.make_runner_bin(self.root)}"
        self.log.append(f"  PATH={path} (the ubuntu-24.04 image's tools and the job's installs)")
        return {"HOME": str(home), "PATH": path, "REHEARSAL_TOOLS": str(tools),
                "CI": "true", "GITHUB_ACTIONS": "true", "GITHUB_WORKSPACE": str(work),
                # what GitHub sets on every runner (tools/trusted_identity.sh reads them)
                "GITHUB_REPOSITORY": REPOSITORY, "GITHUB_REF": REF,
                "RUNNER_TEMP": str(files), "LANG": "C.UTF-8",
                "REHEARSAL_CONTENTS": contents, **self.runner_env, **wheel_mirror()}

    def id_token(self, perms: Any, workflow: Path) -> dict[str, str]:
        """GitHub's OIDC request variables, for a job with `id-token: write` alone (GitHub
        sets them for no other); their token names the job's workflow file on REF."""
        if self.oidc is None or not (perms == "write-all" or (
                isinstance(perms, dict) and perms.get("id-token") == "write")):
            return {}
        self.log.append(f"  id-token: write: OIDC tokens for {workflow.name}@{REF}")
        return self.oidc(f"{REPOSITORY}/.github/workflows/{workflow.name}@{REF}")

    def step(self, step: dict[str, Any], label: str, context: dict[str, Any],
             status: dict[str, bool], env: dict[str, str], work: Path,
             files: Path) -> tuple[str, dict[str, str]]:
        if "sign_keyless.sh" in step.get("run", "") and not shutil.which("cosign",
                                                                         path=env["PATH"]):
            self.log.append(f"  skipped `{label}`: cosign is not installable here "
                            "(sigstore/cosign-installer downloads it from GitHub)")
            return "skipped", {}
        step_env = {**env, **{k: as_text(substitute(v, context, status))
                              for k, v in (step.get("env") or {}).items()}}
        if "uses" in step:
            with_ = {k: as_text(substitute(v, context, status))
                     for k, v in (step.get("with") or {}).items()}
            return self.stand_in(step["uses"], with_, env, work), {}
        outputs_file, env_file = files / f"out{id(step)}", files / f"env{id(step)}"
        outputs_file.touch()
        env_file.touch()
        step_env.update(GITHUB_OUTPUT=str(outputs_file), GITHUB_ENV=str(env_file),
                        GITHUB_STEP_SUMMARY=str(files / "summary.md"))
        script = as_text(substitute(step["run"], context, status))
        result = subprocess.run(["bash", "-e", "-c", script], cwd=work if work.exists() else
                                files, env=step_env, capture_output=True, text=True,
                                timeout=STEP_TIMEOUT, check=False)
        (files / "steps.log").open("a").write(
            f"== {label} (exit {result.returncode})\n{result.stdout}\n{result.stderr}\n")
        env.update(read_key_values(env_file))
        # Workflow commands GitHub shows as annotations on the run.
        self.log += [f"  annotation: {line}" for line in result.stdout.splitlines()
                     if line.startswith(("::warning", "::error"))]
        outcome = "success" if result.returncode == 0 else "failure"
        if outcome == "failure":
            self.log.append(f"  `{label}` exited {result.returncode}: "
                            f"{(result.stderr or result.stdout).strip()[-1500:]}")
        return outcome, read_key_values(outputs_file)

    def stand_in(self, uses: str, with_: dict[str, str], env: dict[str, str],
                 work: Path) -> str:
        action = uses.split("@")[0]
        handler = STAND_INS.get(action)
        if handler is None:
            self.log.append(f"  `{uses}` has no stand-in here")
            return "failure"
        return handler(self, with_, env, work)


def job_order(jobs: Mapping[str, Any]) -> list[str]:
    """Jobs in `needs` order (GitHub's order for independent jobs: as written)."""
    order: list[str] = []
    while len(order) < len(jobs):
        for name, spec in jobs.items():
            needs = spec.get("needs", [])
            needs = [needs] if isinstance(needs, str) else needs
            if name not in order and all(n in order for n in needs):
                order.append(name)
                break
        else:
            raise ValueError("a `needs` cycle")
    return order


def matrix_legs(matrix: Any) -> list[dict[str, Any]]:
    """The legs of `strategy.matrix` (only `include` lists are used by these workflows)."""
    if matrix is None:
        return [{}]
    if not isinstance(matrix, dict) or not matrix.get("include"):
        raise ValueError(f"a matrix without any leg: {matrix!r} (GitHub refuses it)")
    return list(matrix["include"])


def read_key_values(path: Path) -> dict[str, str]:
    """GITHUB_OUTPUT / GITHUB_ENV: `name=value` lines and `name<<DELIM` blocks."""
    out: dict[str, str] = {}
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if "<<" in line and ("=" not in line or line.index("<<") < line.index("=")):
            key, delim = line.split("<<", 1)
            end = lines.index(delim, i + 1)
            out[key] = "\n".join(lines[i + 1:end])
            i = end + 1
            continue
        if "=" in line:
            key, value = line.split("=", 1)
            out[key] = value
        i += 1
    return out


# ---- the stand-ins for `uses:` steps that only set up tools -------------------------------------


def checkout(runner: Runner, _with: dict[str, str], _env: dict[str, str], work: Path) -> str:
    """actions/checkout: a fresh clone of the origin (the commit under test)."""
    subprocess.run(["git", "clone", "-q", str(runner.origin), str(work)], check=True)
    return "success"


def setup_python(runner: Runner, _with: dict[str, str], env: dict[str, str], work: Path) -> str:
    """actions/setup-python: a fresh virtual environment of Python 3.11, on PATH. Its
    site-packages sees the test's own tool environment (a .pth), so the job's
    `pip install --require-hashes -r requirements.lock` finds the locked packages installed
    instead of downloading them, and installs the job's clone (`-e .`) into it."""
    venv = work.parent / "python"
    subprocess.run([base_python(), "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    (site / "runner-tools.pth").write_text(tool_site_packages() + "\n")
    install_locked_scripts(venv / "bin", work / "requirements.lock")
    env["PATH"] = f"{venv / 'bin'}:{env['PATH']}"  # never the test's own .venv/bin
    return "success"


def install_locked_scripts(bin_dir: Path, lock: Path) -> list[str]:
    """The commands the packages of requirements.lock install (pip-audit, syft, uv, nox, …),
    into the job's virtual environment as its `pip install -r requirements.lock` would put
    them there (that install finds the packages present through the .pth, so it writes none):
    a Python script runs on the job's interpreter, a binary is linked. Nothing else of the
    test's own environment is on the job's PATH."""
    from importlib import metadata

    text = lock.read_text() if lock.is_file() else ""  # checked out before setup-python
    locked = {canonical(m[1]) for m in re.finditer(r"^([A-Za-z0-9][\w.-]*)==", text, re.M)}
    ours = os.path.normpath(Path(sys.executable).parent)
    made = []
    for dist in metadata.distributions():
        if canonical(dist.metadata["Name"]) not in locked:
            continue
        for file in dist.files or ():
            found = Path(os.path.normpath(dist.locate_file(file)))
            if str(found.parent) != ours or (bin_dir / found.name).exists():
                continue
            copy_script(found, bin_dir / found.name)
            made.append(found.name)
    return sorted(made)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def copy_script(found: Path, target: Path) -> None:
    """A `#!…python` script with the job's interpreter in its first line; else a link."""
    data = found.read_bytes()
    if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
        target.write_bytes(b"#!" + str(target.parent / "python").encode() + b"\n"
                           + data.split(b"\n", 1)[1])
        target.chmod(0o755)
    else:
        target.symlink_to(found)


def upload_artifact(runner: Runner, with_: dict[str, str], _env: dict[str, str],
                    work: Path) -> str:
    """actions/upload-artifact: the files into the run's artifact storage, by name (Pages'
    artifact is `github-pages`)."""
    store = runner.root / "artifacts" / with_.get("name", "github-pages")
    store.mkdir(parents=True, exist_ok=True)
    for pattern in with_.get("path", "").split():
        for found in work.glob(pattern.rstrip("/")):
            target = store / found.relative_to(work)
            target.parent.mkdir(parents=True, exist_ok=True)
            if found.is_dir():
                shutil.copytree(found, target, dirs_exist_ok=True)
            else:
                shutil.copy2(found, target)
    return "success"


def download_artifact(runner: Runner, with_: dict[str, str], _env: dict[str, str],
                      work: Path) -> str:
    """actions/download-artifact: the named artifact's files into `path`; with `pattern`,
    each matching artifact into `path/<name>/` (none matching is no failure)."""
    if "pattern" in with_:
        for store in sorted((runner.root / "artifacts").glob(with_["pattern"])):
            download_artifact(runner, {"name": store.name,
                                       "path": f"{with_.get('path', '.')}/{store.name}"},
                              _env, work)
        return "success"
    store = runner.root / "artifacts" / with_["name"]
    if not store.is_dir():
        return "failure"
    target = work / with_.get("path", ".")
    for found in store.rglob("*"):
        if found.is_file():
            dest = target / found.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(found, dest)
    return "success"


def nothing(_runner: Runner, _with: dict[str, str], _env: dict[str, str], _work: Path) -> str:
    return "success"


# What stands in for each `uses:` the workflows have (nothing else is allowed to run):
STAND_INS: dict[str, Callable[[Runner, dict[str, str], dict[str, str], Path], str]] = {
    "actions/checkout": checkout,
    "actions/setup-python": setup_python,
    "actions/upload-artifact": upload_artifact,
    "actions/download-artifact": download_artifact,
    # installs cosign, which only tools/sign_keyless.sh calls (its step is skipped here)
    "sigstore/cosign-installer": nothing,
    # a cache miss: the catalog is made from the registry alone
    "actions/cache": nothing,
    "actions/upload-pages-artifact": upload_artifact,
    # GitHub Pages deployment: outside what can run here
    "actions/deploy-pages": nothing,
}


def base_python() -> str:
    """The interpreter the test's tool environment was made from (setup-python's 3.11)."""
    return str(Path(sys.base_prefix) / "bin" / "python3")


def tool_site_packages() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def make_shims(root: Path) -> None:
    """`sudo` as a hosted runner has it (passwordless; the tests run as root already)."""
    shims = root / "shims"
    shims.mkdir(parents=True, exist_ok=True)
    sudo = shims / "sudo"
    sudo.write_text('#!/bin/sh\nwhile [ "${1#-}" != "$1" ]; do shift; done\nexec env "$@"\n')
    sudo.chmod(0o755)
    runner_image.make_apt_get_shim(shims)
    runner_image.make_gh_shim(shims, root / "pull-requests.log")


def make_origin(origin: Path) -> None:
    """A bare repository whose pre-receive hook accepts a push only from a job whose
    `permissions: contents` is `write` (GITHUB_TOKEN's rule)."""
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(origin)], check=True)
    hook = origin / "hooks" / "pre-receive"
    hook.write_text('#!/bin/sh\nif [ "$REHEARSAL_CONTENTS" != write ]; then\n'
                    '  echo "remote: Permission to rehearsal/torch-images denied: the job has '
                    'contents: ${REHEARSAL_CONTENTS:-none}" >&2\n  exit 1\nfi\n')
    hook.chmod(0o755)


def wheel_mirror() -> dict[str, str]:
    """This machine's wheel mirror (it cannot reach the PyTorch CPU index): what a runner
    prepared by hand would set; a hosted runner sets none and fetches from the page."""
    from builder.core import settings

    mirror = settings.Settings.from_env().wheel_mirror
    return {settings.WHEEL_MIRROR_ENV: ":".join(mirror)} if mirror else {}
