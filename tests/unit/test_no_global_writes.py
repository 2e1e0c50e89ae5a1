"""Settings are resolved once (core/settings.py, made by commands/options.resolve and applied by
cli.run): no module under builder/ writes the environment or another module's attributes, and
none uses `global`. Read off the syntax tree of every module, so a comment or a string that
mentions `os.environ[...] = ` is no finding, and an aliased `import os as o` is."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV_MUTATORS = {"update", "setdefault", "pop", "popitem", "clear"}
PROCESS_ENV_CALLS = {"putenv", "unsetenv"}
# (module path, function): the places allowed to change a setting at start-up. None today:
# settings.applied pushes onto its own stack (a method call, not an assignment).
ALLOWED: set[tuple[str, str]] = set()


def _is_module(name: str) -> bool:
    """Whether `name` is a module, found without importing anything (imports run code)."""
    parts = name.split(".")
    if parts[0] in ("builder", "sbom", "smoke"):
        path = ROOT.joinpath(*parts)
        return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()
    parent = ".".join(parts[:-1])
    if name in sys.modules or parent not in sys.modules:
        return name in sys.modules
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _root(node: ast.AST) -> str:
    """`a` of `a.b.c`: the name an attribute chain starts from."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else ""


class _Finder(ast.NodeVisitor):
    """Collects `line: what` for each forbidden write in one module."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.modules: set[str] = set()  # local names bound to modules (`import os as o`)
        self.environ: set[str] = set()  # local names bound to os.environ (`from os import …`)
        self.function = ""
        self.found: list[str] = []

    def report(self, node: ast.AST, what: str) -> None:
        if (self.path, self.function) not in ALLOWED:
            self.found.append(f"{self.path}:{getattr(node, 'lineno', 0)}: {what}")

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.modules.add(alias.asname or alias.name.split(".")[0])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            local = alias.asname or alias.name
            if node.module == "os" and alias.name in ("environ", "putenv", "unsetenv"):
                self.environ.add(local)
            elif node.module and node.level == 0 and _is_module(f"{node.module}.{alias.name}"):
                self.modules.add(local)

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        outer, self.function = self.function, node.name
        self.generic_visit(node)
        self.function = outer

    visit_AsyncFunctionDef = visit_FunctionDef

    def is_environ(self, node: ast.AST) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.environ
        return (isinstance(node, ast.Attribute) and node.attr == "environ"
                and isinstance(node.value, ast.Name) and node.value.id in self.modules)

    def check_target(self, target: ast.AST) -> None:
        if isinstance(target, ast.Subscript) and self.is_environ(target.value):
            self.report(target, "writes os.environ[...]")
        elif isinstance(target, ast.Attribute) and (root := _root(target)) in self.modules:
            self.report(target, f"assigns {root}….{target.attr} (another module's)")
        elif isinstance(target, ast.Tuple | ast.List):
            for element in target.elts:
                self.check_target(element)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self.check_target(target)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign | ast.AnnAssign) -> None:
        self.check_target(node.target)
        self.generic_visit(node)

    visit_AnnAssign = visit_AugAssign

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self.check_target(target)

    def visit_Global(self, node: ast.Global) -> None:
        self.report(node, f"`global {', '.join(node.names)}`")

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Attribute):
            if func.attr in ENV_MUTATORS and self.is_environ(func.value):
                self.report(node, f"os.environ.{func.attr}(…)")
            elif (func.attr in PROCESS_ENV_CALLS and isinstance(func.value, ast.Name)
                  and func.value.id in self.modules):
                self.report(node, f"{func.value.id}.{func.attr}(…)")
        elif isinstance(func, ast.Name):
            if func.id in self.environ and func.id != "environ":
                self.report(node, f"{func.id}(…)")
            elif (func.id == "setattr" and node.args and isinstance(node.args[0], ast.Name)
                  and node.args[0].id in self.modules):
                self.report(node, f"setattr({node.args[0].id}, …) (another module's)")
        self.generic_visit(node)


def violations(source: str, path: str = "<planted>") -> list[str]:
    finder = _Finder(path)
    finder.visit(ast.parse(source))
    return finder.found


def test_no_module_writes_the_environment_or_another_modules_settings() -> None:
    found = [line for file in sorted((ROOT / "builder").rglob("*.py"))
             for line in violations(file.read_text(), str(file.relative_to(ROOT)))]
    assert not found, ("settings are resolved once (builder/core/settings.py); these write "
                       "them afterwards:\n" + "\n".join(found))


@pytest.mark.parametrize("planted", [
    'import os\ndef f():\n    os.environ["BUILDER_CA_BUNDLE"] = "x"\n',
    'import os as o\ndef f():\n    o.environ.update(A="1")\n',
    'import os\nos.environ.setdefault("A", "1")\n',
    'import os\ndef f():\n    os.environ.pop("A")\n',
    'import os\ndef f():\n    del os.environ["A"]\n',
    'import os\nos.putenv("A", "1")\n',
    'from os import environ\nenviron["A"] = "1"\n',
    'from os import putenv\nputenv("A", "1")\n',
    'from builder.core import registry_http\ndef f():\n    registry_http.TIMEOUT = 1\n',
    'from builder.core import oci\noci.DEADLINE_S += 5\n',
    'import builder.core.output\nbuilder.core.output.x = 1\n',  # `builder` is the module name
    'from builder.core import proc\nsetattr(proc, "VERBOSE", True)\n',
    'FLAG = False\ndef f():\n    global FLAG\n    FLAG = True\n',
])
def test_each_kind_of_write_is_found(planted: str) -> None:
    assert violations(planted)


@pytest.mark.parametrize("fine", [
    'import os\nx = os.environ.get("A")\nenv = {**os.environ, "A": "1"}\n',
    'import os\ndef f(env):\n    env["A"] = "1"\n    env.update(B="2")\n',
    '# os.environ["A"] = "1"\ntext = \'os.environ["A"] = "1"\'\n',
    'class C:\n    def f(self):\n        self.x = 1\n',
])
def test_reads_and_local_writes_are_no_finding(fine: str) -> None:
    assert violations(fine) == []


# ---- every process through builder.core.proc --------------------------------------------------

PROCESS_CALLS = {("subprocess", name) for name in
                 ("run", "Popen", "call", "check_call", "check_output", "getoutput",
                  "getstatusoutput")} | {("os", name) for name in
                                         ("system", "popen", "execv", "execvp", "execve",
                                          "execl", "execlp", "spawnv", "spawnl", "posix_spawn",
                                          "fork")}
PROC = "builder/core/proc.py"


def process_calls(source: str, path: str = "<planted>") -> list[str]:
    """`line: module.function` for each call that starts a process without proc."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and (node.func.value.id, node.func.attr) in PROCESS_CALLS):
            found.append(f"{path}:{node.lineno}: {node.func.value.id}.{node.func.attr}(…)")
        elif isinstance(node, ast.ImportFrom) and node.module in ("subprocess", "os"):
            found += [f"{path}:{node.lineno}: from {node.module} import {a.name}"
                      for a in node.names if (node.module, a.name) in PROCESS_CALLS]
    return found


def test_every_process_goes_through_proc() -> None:
    found = [line for file in sorted((ROOT / "builder").rglob("*.py"))
             if str(file.relative_to(ROOT)) != PROC
             for line in process_calls(file.read_text(), str(file.relative_to(ROOT)))]
    assert not found, "start processes with builder.core.proc (run, stream, start_daemon):\n" + \
        "\n".join(found)


@pytest.mark.parametrize("planted", [
    'import subprocess\nsubprocess.run(["git", "status"])\n',
    'import subprocess\nsubprocess.Popen(["registry"])\n',
    'import os\nos.system("git status")\n',
    'from subprocess import check_output\n',
])
def test_a_process_started_around_proc_is_found(planted: str) -> None:
    assert process_calls(planted)
