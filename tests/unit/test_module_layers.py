"""The layering the code is read by, enforced on every `import` (top level and inside functions):

    builder.core  ←  builder.model  ←  builder.stages  ←  builder.flows  ←  builder.commands  ←  builder.cli
    sbom/ uses only builder.core; smoke/ (runs inside the image) imports nothing from builder.

A step (`builder.stages.X`) imports no other step: what two steps share is a table or a record
in builder.model, and steps are composed only in builder.flows and builder.commands.

and no import cycle anywhere. Each rule is also run against a planted violation, so a checker
that silently finds nothing cannot pass.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("builder", "sbom", "smoke", "bench")
# layer → the layers it may import (itself included)
ALLOWED = {
    "builder.core": {"builder.core"},
    # tables and models: read by every layer, so they read only core (and smoke's version parsing,
    # the SBOM library's document reading: both import no builder layer above core)
    "builder.model": {"builder.core", "builder.model", "sbom", "smoke"},
    # one step each, none importing another; sbom/ is the SBOM library the steps call, smoke/ lends
    # its report schema and version parsing
    "builder.stages": {"builder.core", "builder.model", "sbom", "smoke"},
    "builder.flows": {"builder.core", "builder.model", "builder.stages", "builder.flows", "sbom", "smoke"},
    "builder.commands": {"builder.core", "builder.model", "builder.stages", "builder.flows", "builder.commands",
                         "sbom", "smoke"},
    "builder.cli": {"builder.core", "builder.model", "builder.commands"},
    "sbom": {"builder.core", "sbom"},
    "smoke": {"smoke"},
    "bench": {"builder.core", "builder.model", "builder.stages", "builder.flows", "sbom", "bench"},
}

# Step-to-step imports excused until they are moved out (composition into builder/flows/, shared
# records into builder/model/); empty since issue 31. Exact: an entry that is no longer imported
# fails test_every_pending_exception_is_still_imported, so this list only shrinks.
PENDING: dict[str, set[str]] = {}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    return {module_name(p, root): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str], *, runtime: bool = False) -> set[str]:
    """The known modules `name` imports, at any depth: `from a.b import c` names `a.b.c` when that
    is a module, else `a.b`; relative imports are resolved against the package. `runtime`: not
    those under `if TYPE_CHECKING:` (only a type checker follows them)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree) if runtime else ():
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                      for a in node.names}
    return {n for n in found if n in known and n != name}


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES, *,
                 runtime: bool = False) -> dict[str, set[str]]:
    mods = modules_of(root, packages)
    # a package's __init__ is not a dependency of its modules' importers: only real modules count
    known = {m for m, p in mods.items() if p.name != "__init__.py"} | {"builder"}
    return {m: imports_of(m, p, known, runtime=runtime) for m, p in mods.items()}


@functools.cache
def checkout_graph(*, runtime: bool = False) -> dict[str, set[str]]:
    """The checkout's import graph, parsed once for the tests that read it (none changes it)."""
    return import_graph(runtime=runtime)


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for dep in graph.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def layer(module: str) -> str:
    for candidate in sorted(ALLOWED, key=len, reverse=True):
        if module == candidate or module.startswith(candidate + "."):
            return candidate
    return module  # `builder` itself (its __version__) and `builder.__main__`


def layer_violations(graph: dict[str, set[str]],
                     pending: dict[str, set[str]] = PENDING) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, deps in graph.items():
        allowed = ALLOWED.get(layer(module))
        if allowed is None:
            continue
        bad = {d for d in deps if d != "builder" and layer(d) not in allowed
               and d not in pending.get(module, set())}
        if bad:
            out[module] = bad
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    assert cycles(checkout_graph()) == []


def test_every_module_keeps_to_its_layer() -> None:
    assert layer_violations(checkout_graph()) == {}


# What drives the engine, runs processes or talks to a registry.
ONLINE = {"builder.core.engine", "builder.core.proc", "builder.core.oci", "builder.core.oci_blobs",
          "builder.core.registry_http", "builder.core.registry_transport",
          "builder.core.registry_auth", "builder.core.registry"}


def test_render_is_pure_and_offline() -> None:
    """`builder render` (README: pure and offline) imports nothing that reaches the engine, a
    process or a registry, through any module it imports at run time."""
    assert reachable(checkout_graph(runtime=True), "builder.stages.render") & ONLINE == set()


def test_a_type_checking_import_is_not_a_runtime_one(planted: Path) -> None:
    (planted / "builder/stages/render.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from builder.core import proc\n")
    assert "builder.core.proc" in import_graph(planted, ("builder",))["builder.stages.render"]
    assert import_graph(planted, ("builder",), runtime=True)["builder.stages.render"] == set()


def test_every_pending_exception_is_still_imported() -> None:
    graph = checkout_graph()
    assert {m: deps - graph.get(m, set()) for m, deps in PENDING.items()
            if deps - graph.get(m, set())} == {}


def test_only_the_entry_point_imports_the_cli() -> None:
    importers = {m for m, deps in checkout_graph().items() if "builder.cli" in deps}
    assert importers == {"builder.__main__"}


def test_no_module_shadows_a_top_level_package() -> None:
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in (ROOT / "builder").glob("*.py")}  # builder.X next to top-level X
    assert modules & packages == set()


# ---- the checkers find planted violations ------------------------------------------------------


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    files = {
        "builder/__init__.py": "",
        "builder/core/__init__.py": "",
        "builder/core/errors.py": "class E(Exception): ...\n",
        "builder/core/proc.py": "def run():\n    from builder.stages import build  # upward\n",
        "builder/stages/__init__.py": "",
        "builder/stages/build.py": "from builder.core import proc\nfrom . import plan\n",
        "builder/stages/plan.py": "def f():\n    from builder.stages.build import x\n",
        "smoke/__init__.py": "",
        "smoke/runner.py": "from builder.core.errors import E\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_planted_cycle_is_found_through_function_level_imports(planted: Path) -> None:
    graph = import_graph(planted, ("builder", "smoke"))
    assert cycles(graph) == [["builder.core.proc", "builder.stages.build", "builder.stages.plan"]]


def test_a_planted_upward_import_is_a_violation(planted: Path) -> None:
    graph = import_graph(planted, ("builder", "smoke"))
    violations = layer_violations(graph)
    assert violations["builder.core.proc"] == {"builder.stages.build"}
    assert violations["smoke.runner"] == {"builder.core.errors"}


def test_a_planted_step_importing_another_step_is_a_violation(planted: Path) -> None:
    """`build` imports `plan` (top level, relative) and `plan` imports `build` (in a function):
    both are violations unless listed as pending, and only the listed import is excused."""
    graph = import_graph(planted, ("builder", "smoke"))
    steps = {m: v for m, v in layer_violations(graph, pending={}).items()
             if m.startswith("builder.stages.")}
    assert steps == {"builder.stages.build": {"builder.stages.plan"},
                     "builder.stages.plan": {"builder.stages.build"}}
    excused = layer_violations(graph, pending={"builder.stages.build": {"builder.stages.plan"}})
    assert "builder.stages.build" not in excused
    assert excused["builder.stages.plan"] == {"builder.stages.build"}


def tree_paths(text: str) -> set[str]:
    """The paths drawn by a `tree`-style block (`├── name  comment`, 4 columns a level)."""
    paths: set[str] = set()
    stack: list[str] = []
    for line in text.splitlines():
        marker = max(line.find("├── "), line.find("└── "))
        if marker < 0:
            stack = [line.split()[0].rstrip("/")] if line.strip() else []
            continue
        depth = marker // 4 + 1
        stack = [*stack[:depth], line[marker + 4:].split()[0].rstrip("/")]
        paths.add("/".join(stack))
    return paths


def test_the_readme_tree_lists_every_module() -> None:
    """The README's layout section is the tree itself: a module missing from it, or a line for
    a module that is gone, fails here."""
    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("```text\nbuilder/") + len("```text\n"):]
    drawn = {p for p in tree_paths(block[:block.index("```")]) if p.endswith(".py")}
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "builder").rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py")}
    assert drawn == modules


def test_test_modules_have_unique_names() -> None:
    """pytest imports test files by their base name (rootdir-relative folders have no
    __init__.py), so two `test_x.py` anywhere under tests/ fail the whole collection."""
    names = [p.name for p in (ROOT / "tests").rglob("*.py")]
    assert sorted({n for n in names if names.count(n) > 1 and n != "conftest.py"}) == []
