"""The bench's figures: one measured value beside its baseline, as a line and as a Markdown table.

Shared by every bench report (`python -m bench`, `arm64`, `catalog`, `pull`, `reproduce`), so that
a figure reads the same wherever it was measured.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Figure:
    name: str
    value: float | int | str
    unit: str = ""
    baseline: float | int | str | None = None
    ratio: float | None = None
    note: str = ""

    def line(self) -> str:
        value = _fmt(self.value)
        tail = (f" (baseline {_fmt(self.baseline)} {self.unit}".rstrip()
                + (f", {self.ratio:.2f}×" if self.ratio is not None else "") + ")"
                if self.baseline is not None else " (no baseline)")
        note = f"  [{self.note}]" if self.note else ""
        return f"{self.name}: {value} {self.unit}".rstrip() + tail + note


def _fmt(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def _mb(n: int) -> float:
    return round(n / 1e6, 1)


def _ratio(a: float, b: float) -> float | None:
    """a / b to 4 places: tables print 2, and 0.5851 must print 0.59, not 0.585's 0.58."""
    return round(a / b, 4) if b else None


@dataclass
class Results:
    mode: str
    machine: dict[str, Any] = field(default_factory=dict)
    figures: list[Figure] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def add(self, fig: Figure) -> None:
        self.figures.append(fig)
        print(fig.line(), flush=True)


def figure_table(figures: list[Figure], value: Any = str, ratio_digits: int = 2) -> list[str]:
    """The Markdown table of figures every bench report shows (value and baseline in `value`'s
    format, the ratio to `ratio_digits`)."""
    lines = ["| figure | value | baseline | ratio | note |", "|---|---|---|---|---|"]
    for f in figures:
        base = "-" if f.baseline is None else f"{value(f.baseline)} {f.unit}".strip()
        ratio = "-" if f.ratio is None else f"{f.ratio:.{ratio_digits}f}"
        lines.append(f"| {f.name} | {value(f.value)} {f.unit} | {base} | {ratio} | "
                     f"{f.note.replace('|', '/')} |")
    return lines
