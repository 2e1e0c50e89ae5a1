"""tests/e2e/PROOFS.md has one row per end-to-end file and no row for a file that is gone: the
table a closing note quotes says what every e2e file proves."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| (test_\w+) \|", re.MULTILINE)


def rows_and_files(e2e: Path) -> tuple[set[str], set[str]]:
    rows = set(ROW.findall((e2e / "PROOFS.md").read_text(encoding="utf-8")))
    return rows, {p.stem for p in e2e.glob("test_*.py")}


def test_every_e2e_file_has_one_row_and_every_row_a_file() -> None:
    rows, files = rows_and_files(ROOT / "tests" / "e2e")
    assert files and files - rows == set() and rows - files == set()


def test_a_file_without_a_row_is_found(tmp_path: Path) -> None:
    (tmp_path / "PROOFS.md").write_text("| test_a | proves a | 1 |\n| test_gone | x | 2 |\n")
    (tmp_path / "test_a.py").write_text("")
    (tmp_path / "test_b.py").write_text("")
    rows, files = rows_and_files(tmp_path)
    assert (files - rows, rows - files) == ({"test_b"}, {"test_gone"})
