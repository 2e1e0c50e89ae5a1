"""What changed between two SBOMs: components added, removed, and changed in version."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from packageurl import PackageURL
from packaging.version import InvalidVersion, Version

from sbom.dpkg import compare_versions


def iter_components(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Every component, nested ones included (bundled native libraries)."""
    stack = list(doc.get("components") or [])
    while stack:
        comp = stack.pop()
        yield comp
        stack.extend(comp.get("components") or [])


# What every count of an SBOM's components means (build table, verify, catalog): the one rule.
COUNTED = "components, nested ones (libraries bundled in a wheel) included"


def component_total(doc: dict[str, Any]) -> int:
    """The number of components every report prints (`COUNTED`): build's table, `builder
    sbom`, verify and the catalog all print this one."""
    return sum(1 for _ in iter_components(doc))


def component_counts(doc: dict[str, Any]) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """(components per purl type, sorted by type; the components): every report counts the
    same set, `iter_components` (nested ones included), so their numbers agree."""
    counts: dict[str, int] = {}
    found = list(iter_components(doc))
    for comp in found:
        kind = (comp.get("purl") or "pkg:other/").split("/")[0].removeprefix("pkg:")
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items())), found


def count_line(counts: dict[str, int]) -> str:
    """`195 components (150 deb, 45 pypi)`: the total first, as every report prints it."""
    parts = ", ".join(f"{n} {kind}" for kind, n in counts.items())
    return f"{sum(counts.values())} components" + (f" ({parts})" if parts else "")


def identity(comp: dict[str, Any]) -> tuple[str, str, str]:
    """(type, namespace, name) from the purl when there is one, qualifiers and version ignored."""
    purl = comp.get("purl")
    if purl:
        try:
            p = PackageURL.from_string(purl)
            return p.type, p.namespace or "", p.name
        except ValueError:
            pass
    return comp.get("type", ""), comp.get("group", ""), comp.get("name", "")


def _index(doc: dict[str, Any]) -> dict[tuple[str, str, str], dict[str, Any]]:
    """identity → {"name", "type", "versions": sorted set}; one name may be installed twice."""
    index: dict[tuple[str, str, str], dict[str, Any]] = {}
    for comp in iter_components(doc):
        key = identity(comp)
        entry = index.setdefault(key, {"name": comp.get("name", ""), "type": key[0],
                                       "namespace": key[1], "versions": set()})
        entry["versions"].add(comp.get("version") or "")
    return index


def _label(version_set: set[str]) -> str:
    return ", ".join(sorted(version_set))


def diff_sboms(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """{"added": [...], "removed": [...], "changed": [...], "unchanged": n} between two documents.

    Components match on purl type, namespace and name; entries are sorted by (type, name).
    """
    a, b = _index(old), _index(new)

    def entry(e: dict[str, Any], **extra: str) -> dict[str, Any]:
        return {"type": e["type"], "namespace": e["namespace"], "name": e["name"], **extra}

    added = [entry(b[k], version=_label(b[k]["versions"])) for k in sorted(b.keys() - a.keys())]
    removed = [entry(a[k], version=_label(a[k]["versions"])) for k in sorted(a.keys() - b.keys())]
    changed = [
        entry(b[k], old=_label(a[k]["versions"]), new=_label(b[k]["versions"]),
              direction=direction(k[0], a[k]["versions"], b[k]["versions"]))
        for k in sorted(a.keys() & b.keys())
        if a[k]["versions"] != b[k]["versions"]
    ]
    return {
        "old": _subject(old),
        "new": _subject(new),
        "added": added,
        "removed": removed,
        "changed": changed,
        "unchanged": len(a.keys() & b.keys()) - len(changed),
    }


def direction(kind: str, old: set[str], new: set[str]) -> str:
    """`upgrade` or `downgrade` by the ordering of the package's own type (dpkg's for deb,
    PEP 440 for pypi), else `change` (several versions, another type, an unparsable version):
    a rollback must never read as an upgrade."""
    if len(old) != 1 or len(new) != 1:
        return "change"
    (before,), (after,) = old, new
    if kind == "deb":
        order = compare_versions(after, before)
    elif kind == "pypi":
        try:
            order = (Version(after) > Version(before)) - (Version(after) < Version(before))
        except InvalidVersion:
            return "change"
    else:
        return "change"
    return "upgrade" if order > 0 else "downgrade" if order < 0 else "change"


def change_line(result: dict[str, Any]) -> str:
    """`0 added, 0 removed, 1 upgraded, 1 downgraded`: what every changelog prints of a
    `diff_sboms` result (changes of unknown order as `n changed`)."""
    moves = [c.get("direction", "change") for c in result["changed"]]
    parts = [f"{len(result['added'])} added", f"{len(result['removed'])} removed",
             f"{moves.count('upgrade')} upgraded"]
    parts += [f"{n} {word}" for n, word in ((moves.count("downgrade"), "downgraded"),
                                            (moves.count("change"), "changed")) if n]
    return ", ".join(parts)


def _subject(doc: dict[str, Any]) -> str:
    comp = (doc.get("metadata") or {}).get("component") or {}
    return f"{comp.get('name', '?')}:{comp.get('version', '?')}"


def format_diff(result: dict[str, Any]) -> str:
    """Human-readable text of a `diff_sboms` result."""
    lines = [f"{result['old']} → {result['new']}"]
    for item in result["added"]:
        lines.append(f"  + {item['type']}/{item['name']} {item['version']}")
    for item in result["removed"]:
        lines.append(f"  - {item['type']}/{item['name']} {item['version']}")
    for item in result["changed"]:
        lines.append(f"  ~ {item['type']}/{item['name']} {item['old']} → {item['new']}"
                     + (" (downgrade)" if item.get("direction") == "downgrade" else ""))
    lines.append(f"{change_line(result)}, {result['unchanged']} unchanged")
    return "\n".join(lines)
