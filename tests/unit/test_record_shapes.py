"""Records with more than four fields are made by keyword: `@dataclass(kw_only=True)`.

Five positional arguments, several of one type (two adjacent `Path`s, four strings), can be
swapped without an error; named, they cannot. Checked on every dataclass under builder/, and
against planted classes, so a walk that silently finds nothing cannot pass.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_POSITIONAL = 4
# Not records: state kept per process, made from one name.
EXEMPT = {"builder/core/registry_http.py:Session": "a registry's tokens and challenge, "
          "made as Session(registry)"}


def init_fields(node: ast.ClassDef) -> int:
    """The fields `__init__` takes (ClassVar and field(init=False) are not)."""
    def takes(stmt: ast.AnnAssign) -> bool:
        value = stmt.value
        no_init = isinstance(value, ast.Call) and any(
            k.arg == "init" and isinstance(k.value, ast.Constant) and k.value.value is False
            for k in value.keywords)
        return "ClassVar" not in ast.unparse(stmt.annotation) and not no_init
    return sum(1 for s in node.body if isinstance(s, ast.AnnAssign) and takes(s))


def positional_records(root: Path) -> list[str]:
    """`file:Class` of each dataclass under root/builder with more than four fields that is
    not keyword-only."""
    found = []
    for path in sorted((root / "builder").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            for deco in node.decorator_list:
                call = deco if isinstance(deco, ast.Call) else None
                target = call.func if call else deco
                if getattr(target, "id", getattr(target, "attr", "")) != "dataclass":
                    continue
                kw_only = call is not None and any(
                    k.arg == "kw_only" and isinstance(k.value, ast.Constant) and k.value.value
                    for k in call.keywords)
                if not kw_only and init_fields(node) > MAX_POSITIONAL:
                    found.append(f"{path.relative_to(root).as_posix()}:{node.name}")
    return found


def test_every_record_over_four_fields_is_keyword_only() -> None:
    assert [r for r in positional_records(ROOT) if r not in EXEMPT] == []


def test_every_exemption_is_still_needed() -> None:
    assert sorted(set(EXEMPT) - set(positional_records(ROOT))) == []


def test_the_checker_finds_a_planted_positional_record(tmp_path: Path) -> None:
    planted = Path("builder", "planted.py")
    (tmp_path / "builder").mkdir()
    fields = "".join(f"    f{i}: int\n" for i in range(MAX_POSITIONAL + 1))
    (tmp_path / planted).write_text(
        "from dataclasses import dataclass\n\n"
        f"@dataclass(frozen=True)\nclass Wide:\n{fields}\n"
        f"@dataclass(frozen=True, kw_only=True)\nclass Named:\n{fields}\n"
        "@dataclass\nclass Narrow:\n    a: int\n    b: int\n")
    assert positional_records(tmp_path) == [f"{planted.as_posix()}:Wide"]
