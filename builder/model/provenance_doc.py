"""Reading a SLSA provenance statement that the pipeline wrote: what the catalog shows and
`reproduce` rebuilds from. A table of roles, no I/O, so every layer may read it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def dependencies_by_role(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A statement's resolved dependencies by role (`source`, `lock`, `base`): its
    `annotations.role`, or, in statements written before dependencies were URIs, a lock's
    `locks/…` uri and the base in third place. A dependency's `name` is the path or image name
    (`locks/<id>.txt`, `mmdebstrap:bookworm`)."""
    definition = ((doc.get("predicate") or {}).get("buildDefinition") or {})
    deps = [d for d in definition.get("resolvedDependencies") or [] if isinstance(d, dict)]
    found = {role: d for d in deps if (role := (d.get("annotations") or {}).get("role"))}
    if found:
        return found
    old = {"lock": next((d for d in deps if str(d.get("uri", "")).startswith("locks/")), None),
           "base": deps[2] if len(deps) > 2 else None}
    return {role: {**d, "name": d.get("uri", "")} for role, d in old.items() if d}
