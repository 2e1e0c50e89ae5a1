"""The rendered Dockerfiles of the shipped matrix, committed as `rendered/<variant key>/Dockerfile`
and reviewed like code (docker-library's verify-templating): a template or matrix change shows
what it does to every Dockerfile in its own diff.

    python tools/rendered.py           re-render and update rendered/ (`nox -s render`)
    python tools/rendered.py --check   re-render into a temporary folder and fail, naming each
                                       file and showing a short diff, when rendered/ differs
                                       (`nox -s lint`)

Rendering is `builder render` itself (pure and offline), run on the committed matrix.yaml and
templates/ (BUILDER_MATRIX and BUILDER_TEMPLATES are ignored here).
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RENDERED = ROOT / "rendered"
HINT = ("hint: run `nox -s render` (or `python tools/rendered.py`) and commit rendered/: its "
        "files are generated from templates/ and matrix.yaml, never edited by hand")
DIFF_LINES = 20  # per file: enough to see what changed, short enough to read every file's


def render_into(out: Path) -> None:
    """Every variant's build context into `out/<key>/`, by `builder render`."""
    env = {k: v for k, v in os.environ.items() if k not in ("BUILDER_MATRIX", "BUILDER_TEMPLATES")}
    argv = [sys.executable, "-m", "builder", "render", "--out", str(out), "--json"]
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.stderr.write(result.stderr)
        raise SystemExit(f"error: `builder render` exited with {result.returncode}")


def dockerfiles(folder: Path) -> dict[str, str]:
    """`<key>/Dockerfile` → its text, for every variant folder under `folder`."""
    return {f"{p.parent.name}/Dockerfile": p.read_text()
            for p in sorted(folder.glob("*/Dockerfile"))}


def differences(committed: Path, fresh: Path, label: str = "rendered") -> list[str]:
    """One message per Dockerfile that differs between the committed folder and a fresh render
    (changed, not committed, or no longer rendered), each naming the file; a changed file's
    message carries the first DIFF_LINES lines of its unified diff."""
    old, new = dockerfiles(committed), dockerfiles(fresh)
    problems = []
    for rel in sorted(old.keys() | new.keys()):
        name = f"{label}/{rel}"
        if rel not in old:
            problems.append(f"error: {name} is not committed (a new variant?)")
        elif rel not in new:
            problems.append(f"error: {name} is committed but no variant renders it any more")
        elif old[rel] != new[rel]:
            diff = list(difflib.unified_diff(
                old[rel].splitlines(), new[rel].splitlines(),
                f"{name} (committed)", f"{name} (rendered now)", n=1, lineterm=""))
            more = len(diff) - DIFF_LINES
            problems.append("\n".join([
                f"error: {name} differs from what `builder render` makes now",
                *diff[:DIFF_LINES], *([f"… {more} more diff lines"] if more > 0 else [])]))
    return problems


def update(committed: Path, fresh: Path) -> list[str]:
    """Make `committed` hold exactly the fresh Dockerfiles; returns what changed."""
    old, new = dockerfiles(committed), dockerfiles(fresh)
    changed = []
    for rel, text in new.items():
        if old.get(rel) != text:
            (committed / rel).parent.mkdir(parents=True, exist_ok=True)
            (committed / rel).write_text(text)
            changed.append(f"updated {rel}")
    for rel in sorted(old.keys() - new.keys()):
        (committed / rel).unlink()
        changed.append(f"removed {rel}")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="fail when rendered/ differs from a fresh render (changes nothing)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="rendered-") as tmp:
        render_into(Path(tmp))
        if args.check:
            problems = differences(RENDERED, Path(tmp))
            for problem in problems:
                print(problem, file=sys.stderr)
            if problems:
                print(f"\n{HINT}", file=sys.stderr)
                return 1
            print(f"rendered/: {len(dockerfiles(RENDERED))} Dockerfiles, all current")
            return 0
        for line in update(RENDERED, Path(tmp)) or ["rendered/ is current"]:
            print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
