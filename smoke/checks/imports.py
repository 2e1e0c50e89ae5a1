"""`import_all`: every top-level module the image's distributions provide imports."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import sysconfig
from typing import Any

from smoke import FAIL, PASS
from smoke.checks.common import dropped_items, result

TORCH_SUBMODULES = (
    "torch.nn", "torch.optim", "torch.autograd", "torch.distributed", "torch.multiprocessing",
    "torch.utils.data", "torch.amp", "torch.cuda", "torch.fx", "torch.jit",
)
# Packaging tools are not what the image promises its users; `smoke` is this suite.
NOT_PROMISED = frozenset({"pip", "setuptools", "pkg_resources", "wheel", "smoke"})


def site_dirs() -> list[str]:
    paths = sysconfig.get_paths()
    return list(dict.fromkeys([paths["purelib"], paths["platlib"]]))


def top_level_names(dist: importlib.metadata.Distribution) -> set[str]:
    listed = dist.read_text("top_level.txt")
    if listed:
        return set(listed.split())
    return {f.parts[0].removesuffix(".py") for f in dist.files or ()
            if f.parts and not f.parts[0].endswith((".dist-info", ".data")) and f.parts[0] != ".."}


def promised_modules(dropped: list[str]) -> list[str]:
    """Top-level modules of the distributions installed in the environment's site-packages
    (not of whatever folder the suite was started from)."""
    names = set()
    for dist in importlib.metadata.distributions(path=site_dirs()):
        names |= top_level_names(dist)
    names = {n for n in names if n.isidentifier() and not n.startswith("_")}
    return sorted(names - NOT_PROMISED - set(dropped)) + list(TORCH_SUBMODULES)


def try_import(name: str) -> str | None:
    try:
        importlib.import_module(name)
    except BaseException as exc:  # SystemExit or a C-level error class must not end the check
        return f"{name}: {type(exc).__name__}: {exc}"
    return None


def run(ctx: dict[str, Any]) -> dict[str, Any]:
    dropped = dropped_items(ctx)
    modules = promised_modules(dropped)
    failures = [f for f in (try_import(m) for m in modules) if f]
    leftovers = [d for d in dropped if d.isidentifier() and importlib.util.find_spec(d)]
    warnings = [f"`{d}` was dropped from this image but still imports" for d in leftovers]
    metrics = {"modules": len(modules), "failed": len(failures), "imported": modules}
    if failures:
        return result(FAIL, "; ".join(failures), metrics, warnings)
    return result(PASS, f"imported {len(modules)} modules", metrics, warnings)
