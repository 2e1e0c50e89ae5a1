"""Sessions: `nox -s build` (the main job), `tests`, `lint`, `lock`, `render`, `rebuild`, `bench`.

Sessions reuse the current environment's Python packages (`pip install -e .[dev]`), since the
pipeline drives the machine's Docker engine rather than anything inside a virtualenv.
"""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "none"
nox.options.sessions = ["lint", "tests"]

BUILDER = ["python", "-m", "builder"]


@nox.session
def build(session: nox.Session) -> None:
    """Build, smoke-test and SBOM the matrix's default selection (only what changed)."""
    session.run(*BUILDER, "build", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """Run the test suite, end-to-end tests against a real engine and registry included."""
    session.run("python", "-m", "pytest", *(session.posargs or ["-ra"]))


@nox.session
def lint(session: nox.Session) -> None:
    """ruff, the matrix schema, hadolint on every rendered Dockerfile, workflow linters."""
    session.run("ruff", "check", ".")
    session.run(*BUILDER, "validate")
    session.run("check-jsonschema", "--schemafile", "builder/schema/matrix.schema.json",
                "matrix.yaml")
    out = ".state/lint-render"
    session.run(*BUILDER, "render", "--out", out, "--json", silent=True)
    import glob

    dockerfiles = sorted(glob.glob(f"{out}/*/Dockerfile"))
    session.run("hadolint", "--failure-threshold", "info", *dockerfiles)
    session.run("python", "tools/lint_workflows.py")


@nox.session
def lock(session: nox.Session) -> None:
    """Resolve locks for variants whose inputs changed (`-- --upgrade` refreshes all)."""
    session.run(*BUILDER, "lock", *session.posargs)


@nox.session
def render(session: nox.Session) -> None:
    """Render every variant's Dockerfile into out/."""
    session.run(*BUILDER, "render", "--out", "out", *session.posargs)


@nox.session(default=False)
def rebuild(session: nox.Session) -> None:
    """The scheduled security rebuild, against the local registry."""
    session.run(*BUILDER, "registry", "start")
    session.run(*BUILDER, "rebuild", *session.posargs)


@nox.session(default=False)
def bench(session: nox.Session) -> None:
    """Benchmarks against the naive Dockerfile and syft (`-- --quick` for the CPU variant)."""
    session.run("python", "-m", "bench", *session.posargs)
