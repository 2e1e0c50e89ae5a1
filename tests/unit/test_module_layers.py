"""The layering the code is read by: the in-image suite stands alone, `sbom/` and the core
never reach into command modules, and no module name shadows a package."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What every stage may use: errors, subprocesses, the engine, the registry client, paths,
# labels and output. Nothing here imports a stage or a command.
CORE = {"builder", "builder.errors", "builder.proc", "builder.engine", "builder.oci",
        "builder.state", "builder.labels", "builder.output"}


def imported_builder_modules(package: str) -> dict[str, set[str]]:
    """For each module of `package`, the `builder` modules it imports (at any depth)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
        found[str(path.relative_to(ROOT))] = {
            n for n in names if n == "builder" or n.startswith("builder.")}
    return found


def resolved(names: set[str]) -> set[str]:
    """`from builder import proc` names the module builder.proc; `from builder.errors import X`
    names builder.errors."""
    modules = {p.stem for p in (ROOT / "builder").glob("*.py")}
    out = set()
    for name in names:
        parts = name.split(".")
        out.add(".".join(parts[:2]) if len(parts) > 1 and parts[1] in modules else "builder")
    return out


def test_the_in_image_smoke_suite_imports_nothing_from_builder() -> None:
    assert {m: n for m, n in imported_builder_modules("smoke").items() if n} == {}


def test_sbom_uses_only_the_core() -> None:
    beyond = {m: resolved(n) - CORE for m, n in imported_builder_modules("sbom").items()}
    assert {m: n for m, n in beyond.items() if n} == {}


def test_the_core_imports_only_the_core() -> None:
    core_files = {f"builder/{m.split('.', 1)[1]}.py" for m in CORE if "." in m}
    imports = imported_builder_modules("builder")
    beyond = {m: resolved(imports[m]) - CORE for m in core_files}
    assert {m: n for m, n in beyond.items() if n} == {}


def test_no_module_shadows_a_top_level_package() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in (ROOT / "builder").glob("*.py")}
    assert modules & packages == set()


def test_nothing_imports_upward_into_the_command_layer() -> None:
    """`builder.cli` and the command-only module are leaves: stages take their shared options
    and selection from `builder.options`, never from another command."""
    commands = {"builder.cli", "builder.matrix_cmd"}
    imports = {m: resolved(n) for pkg in ("builder", "sbom", "bench")
               for m, n in imported_builder_modules(pkg).items()}
    upward = {m: n & commands for m, n in imports.items() if n & commands}
    assert upward == {"builder/__main__.py": {"builder.cli"}}  # the entry point itself
