"""Every file of this repository that its code, tests and documents name by path exists: a
docstring naming a moved module (`tests/` + `test_e2e.py` for tests/e2e/test_e2e.py) sends a
newcomer to a file that is not there."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("builder", "tests", "tools", "bench", "sbom", "smoke", "docs", "examples", "templates",
           ".github", ".ci")
TEXT = {".py", ".md", ".yml", ".yaml", ".sh", ".toml", ".j2"}
NAMED = re.compile(r"(?<![\w./-])((?:builder|tests|tools|bench|sbom|smoke|docs|examples|templates)"
                   r"/[\w./-]+\.(?:py|md|yaml|yml|json|j2|sh))\b")


def texts() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "noxfile.py", ROOT / "pyproject.toml"]
    for folder in FOLDERS:
        found += [p for p in (ROOT / folder).rglob("*") if p.suffix in TEXT and p.is_file()
                  and "__pycache__" not in p.parts and "node_modules" not in p.parts]
    return found


def test_every_path_a_file_names_exists() -> None:
    named = {(path.relative_to(ROOT).as_posix(), name) for path in texts()
             for name in NAMED.findall(path.read_text(errors="replace"))}
    assert len(named) > 50  # the names were found
    assert sorted(f"{where}: {name}" for where, name in named if not (ROOT / name).exists()) == []
