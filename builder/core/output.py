"""Terminal output: tables with rich on a TTY, plain aligned text otherwise (logs, CI, pipes)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any


def emit_json(data: Any) -> None:
    """The command's one JSON document on stdout (an error after it says `printed=True`)."""
    json.dump(data, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None) -> None:
    if sys.stdout.isatty() and not os.environ.get("NO_COLOR"):
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        for h in headers:
            t.add_column(h)
        for row in rows:
            t.add_row(*(str(c) for c in row))
        Console().print(t)
        return
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    if title:
        print(title)
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def step(message: str) -> None:
    """Progress goes to stderr so stdout stays machine-readable."""
    print(message, file=sys.stderr, flush=True)


def human_bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} GB"
