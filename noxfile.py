"""Sessions: `nox -s build` (the main job), `tests`, `lint`, `lock`, `lock_tools`, `render`,
`rebuild`, `bench`, `catalog`.

`tools/setup.sh` installs the project and these tools into `.venv` (no system site-packages);
run nox from there (`.venv/bin/nox`). Sessions reuse that environment rather than making their
own, since the pipeline drives the machine's Docker engine, not anything inside a virtualenv.
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "tests"]

# The interpreter running nox and the tools beside it (ruff, hadolint, deptry …) come first.
BIN = Path(sys.executable).parent
os.environ["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
PYTHON = sys.executable
BUILDER = [PYTHON, "-m", "builder"]


@nox.session
def build(session: nox.Session) -> None:
    """Build, smoke-test and SBOM the matrix's default selection (only what changed; its
    platforms of another architecture are named and left to a runner of theirs)."""
    session.run(*BUILDER, "build", *session.posargs)


# Three workers, each running whole modules (module fixtures are built once), the slowest
# modules handed out first (tests/conftest.py orders them; xdist would reorder by test count).
# The e2e suite is sequential work (one gzip, one hash, one smoke at a time) that also waits on
# the engine and registries: on 2 cores two workers left the machine 12% idle (1326 s), three
# kept it 95% busy (1264 s, same suite). `nox -s tests -- -n 0 tests/e2e/test_signing.py` runs
# one module alone.
XDIST = ("-n", "3", "--dist", "loadfile", "--no-loadscope-reorder")


@nox.session
def tests(session: nox.Session) -> None:
    """Unit tests (seconds) and end-to-end tests against a real engine and registry, on three
    xdist workers. `nox -s tests -- tests/unit` runs only the unit tests. The slowest 15 are
    listed with their times (where an e2e's time goes is part of the record)."""
    session.run(PYTHON, "-m", "pytest", "-ra", "--durations=15", *XDIST,
                *(session.posargs or ["tests"]))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, deptry, the tool lock is current, every image lock matches the index (`builder lock
    --check`), the matrix schema, the committed rendered/ Dockerfiles are current, hadolint on
    each of them, workflow linters."""
    session.run("ruff", "check", ".")
    session.run("deptry", ".")
    session.run(PYTHON, "tools/lock_tools.py", "--check")
    session.run(*BUILDER, "validate")
    session.run(*BUILDER, "lock", "--check")  # every lock against the index (network)
    session.run("check-jsonschema", "--schemafile", "builder/schema/matrix.schema.json",
                "matrix.yaml")
    session.run(PYTHON, "tools/rendered.py", "--check")
    dockerfiles = sorted(glob.glob("rendered/*/Dockerfile"))
    session.run("hadolint", "--failure-threshold", "info", *dockerfiles)
    session.run(PYTHON, "tools/lint_workflows.py")


@nox.session
def lock(session: nox.Session) -> None:
    """Resolve locks for variants whose inputs changed (`-- --upgrade` refreshes all)."""
    session.run(*BUILDER, "lock", *session.posargs)


@nox.session(default=False)
def lock_tools(session: nox.Session) -> None:
    """Re-lock the project's own dependencies with hashes into requirements.lock."""
    session.run(PYTHON, "tools/lock_tools.py")


@nox.session
def render(session: nox.Session) -> None:
    """Re-render the committed Dockerfiles in rendered/ (commit what changes)."""
    session.run(PYTHON, "tools/rendered.py", *session.posargs)


@nox.session(default=False)
def rebuild(session: nox.Session) -> None:
    """The scheduled security rebuild, against the local registry."""
    session.run(*BUILDER, "registry", "start")
    session.run(*BUILDER, "rebuild", *session.posargs)


@nox.session(default=False)
def catalog(session: nox.Session) -> None:
    """The catalog site of the matrix's repository in the local registry, into site/
    (`-- REGISTRY/REPOSITORY` for another one, `-- --key cosign.pub` to verify signatures)."""
    session.run(*BUILDER, "registry", "start")
    session.run(*BUILDER, "catalog", "--out", "site", *session.posargs)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks against the naive Dockerfile and syft (`-- --quick` for the CPU variant,
    `-- catalog` for the catalog on a 200-tag registry, `-- arm64`, `-- siblings REGISTRY/REPO`
    for the bytes a node holding one image pulls for each sibling)."""
    session.run(PYTHON, "-m", "bench", *session.posargs)
