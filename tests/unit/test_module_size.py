"""No module over 450 lines: a module a reader cannot hold at once is split along its seams.

Counted for every `.py` file under the packages and tools/ (tests are not counted: a test file
grows with what it proves). The checker is also run against a planted file, so a walk that
silently finds nothing cannot pass.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("builder", "sbom", "smoke", "bench", "tools")
MAX_LINES = 450


def too_long(root: Path, folders: tuple[str, ...] = FOLDERS) -> dict[str, int]:
    """Each module over MAX_LINES lines under `folders` of `root` → its line count."""
    counts = {str(p.relative_to(root)): len(p.read_text(encoding="utf-8").splitlines())
              for folder in folders for p in sorted((root / folder).rglob("*.py"))}
    return {name: n for name, n in counts.items() if n > MAX_LINES}


def test_no_module_is_over_450_lines() -> None:
    assert too_long(ROOT) == {}


def test_the_checker_finds_a_planted_long_module(tmp_path: Path) -> None:
    folder = tmp_path / "builder" / "core"
    folder.mkdir(parents=True)
    (folder / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (folder / "short.py").write_text("x = 1\n" * MAX_LINES)
    assert too_long(tmp_path) == {str(Path("builder", "core", "long.py")): MAX_LINES + 1}
