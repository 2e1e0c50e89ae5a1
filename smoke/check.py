"""Child entry point: `python -m smoke.check NAME` runs one check and writes its result JSON.

Context comes from $SMOKE_CONTEXT (JSON), the result goes to $SMOKE_RESULT (stdout if unset).
A check that raises is reported as `error` with its traceback in the output tail.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from smoke import ERROR
from smoke.checks import CHECKS
from smoke.checks.common import summarize


def _hooked(var: str, name: str) -> bool:
    return name in os.environ.get(var, "").split(",")


def test_hooks(name: str) -> None:
    """SMOKE_TEST_HANG / SMOKE_TEST_CRASH let tests prove timeout and crash handling."""
    if _hooked("SMOKE_TEST_HANG", name):
        print(f"SMOKE_TEST_HANG: {name} hangs now (with a grandchild)", flush=True)
        # A grandchild in the same process group, like spawn workers: the timeout must kill it too.
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)",
                          "smoke-test-hang-grandchild"])
        while True:
            time.sleep(60)
    if _hooked("SMOKE_TEST_CRASH", name):
        print(f"SMOKE_TEST_CRASH: {name} aborts now", flush=True)
        os.abort()


def run_check(name: str, ctx: dict[str, Any]) -> dict[str, Any]:
    module = importlib.import_module(f"smoke.checks.{CHECKS[name]}")
    try:
        return module.run(ctx)
    except Exception as exc:  # an import failure or a bug is this check's error, not a lost report
        traceback.print_exc()
        return {"status": ERROR, "message": summarize(exc), "metrics": {}}


def write(result: dict[str, Any]) -> None:
    target = os.environ.get("SMOKE_RESULT")
    text = json.dumps(result, default=str)
    if not target:
        print(text)
        return
    tmp = Path(target + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, target)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in CHECKS:
        print(f"usage: python -m smoke.check {{{','.join(CHECKS)}}}", file=sys.stderr)
        return 2
    name = args[0]
    test_hooks(name)
    ctx = json.loads(os.environ.get("SMOKE_CONTEXT") or "{}")
    write(run_check(name, ctx))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
