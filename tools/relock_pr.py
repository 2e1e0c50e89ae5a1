"""The relock pull-request job's one step of Python (rebuild.yml, job `relock-pr`): merge the
rebuild legs' `builder rebuild --relock-report` files, write their new lock files into the
checkout, and the pull request's title and body beside them.

    python tools/relock_pr.py REPORTS_DIR OUT_DIR

Exit 0 with OUT_DIR/title.txt and OUT_DIR/body.md when something was relocked; exit 3 when no
report names a relock (nothing to send back to git).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTHING = 3


def main(reports_dir: Path, out: Path) -> int:
    sys.path.insert(0, str(ROOT))
    from builder.flows.relock_report import merge

    reports = [json.loads(p.read_text()) for p in sorted(reports_dir.rglob("*.json"))]
    merged = merge(reports)
    if not merged["relocked"]:
        print("no rebuild re-locked anything: no pull request")
        return NOTHING
    for name, text in merged["files"].items():
        if not name.startswith("locks/") or ".." in Path(name).parts:
            raise SystemExit(f"error: a relock report names `{name}`, outside locks/")
        (ROOT / name).write_text(text)
    out.mkdir(parents=True, exist_ok=True)
    (out / "title.txt").write_text(merged["title"] + "\n")
    (out / "body.md").write_text(merged["body"] + "\n")
    print(f"relocked: {', '.join(merged['relocked'])}; files: {', '.join(merged['files'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
