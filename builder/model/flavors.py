"""The flavor table: each flavor is a row, its parent's layers plus its own. Whether a flavor
compiles, runs as root or carries the CUDA toolkit is a column here, never an `if` on its name."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

# The lock's parts every flavor installs in the shared layers, in layer order.
SHARED_PARTS = ("nvidia", "torch", "rest")


# The slim base's own list of what it leaves out (the images' `dropped` label adds to it).
SLIM_DROPPED = ("docs", "man-pages", "locales", "perl")


@dataclass(frozen=True, kw_only=True)
class Flavor:
    """A row of the flavor table: each flavor is its parent's layers plus its own."""

    name: str
    parent: str | None
    # (PRUNED category, lock parts) it copies back over its parent, from the cached wheels
    restores: tuple[tuple[str, tuple[str, ...]], ...] = ()
    adds: tuple[str, ...] = ()  # lock packages only this flavor (and its children) install
    os_restores: tuple[str, ...] = ()  # SLIM_DROPPED items its own apt step brings back
    compiles: bool = False  # carries torch.compile's toolchain (and so do its children)
    root: bool = False  # runs as root (people install system packages there)
    toolkit: bool = False  # CUDA variants get nvcc + headers of torch's CUDA (`toolkits`)


FLAVORS = {f.name: f for f in (
    Flavor(name="slim", parent=None),
    # torch.compile reads torch's headers (C++ codegen); the rest only serve extension builds
    Flavor(name="runtime", parent="slim", restores=(("headers", ("torch",)),),
           adds=("triton",), compiles=True),
    Flavor(name="devel", parent="runtime",
           restores=(("headers", ("nvidia", "rest")),
                     ("static-libraries", ("nvidia", "torch", "rest"))),
           os_restores=("perl",), root=True, toolkit=True),
)}
# What the shared install layers delete, as `find` expressions: no flavor's programs read them;
# the flavors that want them copy them back in a later layer, so nothing is whited out.
PRUNED = {
    "headers": "-type d -name include",
    "static-libraries": "-name '*.a'",
    "tests": "-type d -path '*/numpy/*/tests'",
}
def lineage(flavor: str) -> list[Flavor]:
    """The flavor and its ancestors, oldest first: slim, runtime, devel."""
    row = FLAVORS[flavor]
    return [*lineage(row.parent), row] if row.parent else [row]


def dropped(flavor: str) -> list[str]:
    """What this flavor leaves out: the label `io.torch-images.dropped` and image.json list it.
    A category restored for some parts only reads `headers-except-torch`."""
    rows = lineage(flavor)
    kept = {item for row in rows for item in (*row.adds, *row.os_restores)}
    restored: dict[str, set[str]] = {}
    for row in rows:
        for category, parts in row.restores:
            restored.setdefault(category, set()).update(parts)
    out = ["triton"] if "triton" not in kept else []
    if not any(row.compiles for row in rows):
        out.append("compilers")
    for category in PRUNED:
        parts = restored.get(category, set())
        if not parts.issuperset(SHARED_PARTS):
            out.append(f"{category}-except-{'-'.join(sorted(parts))}" if parts else category)
    return out + [item for item in SLIM_DROPPED if item not in kept]


def prune_expression(categories: Iterable[str]) -> str:
    """One `find` test matching any of the categories (the caller adds -prune and an action)."""
    return "\\( " + " -o ".join(f"\\( {PRUNED[c]} \\)" for c in categories) + " \\)"
