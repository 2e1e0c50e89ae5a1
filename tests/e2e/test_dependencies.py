"""Every import is declared: deptry passes on the project, and catches an undeclared one."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import ROOT

DEPTRY = str(Path(sys.executable).with_name("deptry"))


def deptry(folder: Path) -> tuple[int, str]:
    """(exit code, output without colours: deptry colours even into a pipe)."""
    result = subprocess.run([DEPTRY, "."], cwd=folder, capture_output=True, text=True,
                            check=False, timeout=300)
    return result.returncode, re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr)


def test_the_project_declares_every_import() -> None:
    code, output = deptry(ROOT)
    assert code == 0, output


def test_an_undeclared_import_fails(tmp_path: Path) -> None:
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    (tmp_path / "builder").mkdir()
    (tmp_path / "builder" / "__init__.py").write_text("import oras_not_declared  # in no dependency\n")
    code, output = deptry(tmp_path)
    assert code == 1 and "DEP001 'oras_not_declared' imported but missing" in output
