"""Debian package database: status stanzas, dependency fields, copyright licenses, version order."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

_SOURCE_RE = re.compile(r"^(?P<name>\S+)(?:\s+\((?P<version>[^)]+)\))?$")
_DEP_NAME_RE = re.compile(r"^\s*(?P<name>[a-z0-9][a-z0-9+.-]*)(?::\S+)?")


@dataclass
class DebPackage:
    name: str
    version: str
    architecture: str
    source: str = ""  # source package name, when it differs from `name`
    source_version: str = ""  # source version, when it differs from `version`
    maintainer: str = ""
    description: str = ""
    depends: list[list[str]] = field(default_factory=list)  # groups of alternatives
    provides: list[str] = field(default_factory=list)


def parse_stanzas(text: str) -> Iterable[dict[str, str]]:
    """RFC 822-style stanzas; continuation lines are joined with newlines."""
    fields: dict[str, str] = {}
    key = ""
    for line in text.splitlines():
        if not line.strip():
            if fields:
                yield fields
            fields, key = {}, ""
        elif line[0] in " \t" and key:
            fields[key] += "\n" + line.strip()
        else:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    if fields:
        yield fields


def parse_status(texts: Iterable[str]) -> list[DebPackage]:
    """Installed packages from dpkg status files (status-field state `installed` only)."""
    packages: dict[tuple[str, str], DebPackage] = {}
    for text in texts:
        for st in parse_stanzas(text):
            status = st.get("Status", "install ok installed").split()
            if not st.get("Package") or not st.get("Version") or status[-1:] != ["installed"]:
                continue
            pkg = _package(st)
            packages[(pkg.name, pkg.architecture)] = pkg
    return sorted(packages.values(), key=lambda p: (p.name, p.architecture))


def _package(st: dict[str, str]) -> DebPackage:
    name, version = st["Package"], st["Version"]
    src, src_version = name, version
    if m := _SOURCE_RE.match(st.get("Source", "")):
        src, src_version = m["name"], m["version"] or version
    depends = parse_depends(st.get("Pre-Depends", "")) + parse_depends(st.get("Depends", ""))
    return DebPackage(
        name=name,
        version=version,
        architecture=st.get("Architecture", ""),
        source=src if src != name else "",
        source_version=src_version if src_version != version else "",
        maintainer=st.get("Maintainer", ""),
        description=st.get("Description", "").split("\n", 1)[0],
        depends=depends,
        provides=[g[0] for g in parse_depends(st.get("Provides", ""))],
    )


def parse_depends(value: str) -> list[list[str]]:
    """`a (>= 1) | b, c:any` → [["a", "b"], ["c"]] (names only; versions and arch dropped)."""
    groups = []
    for group in value.split(","):
        names = [m["name"] for alt in group.split("|") if (m := _DEP_NAME_RE.match(alt))]
        if names:
            groups.append(names)
    return groups


def resolve_depends(packages: list[DebPackage]) -> dict[str, list[str]]:
    """Package name → names of installed packages it depends on (first present alternative)."""
    installed = {p.name for p in packages}
    provided: dict[str, str] = {}
    for p in packages:
        for virtual in p.provides:
            provided.setdefault(virtual, p.name)
    graph: dict[str, list[str]] = {}
    for p in packages:
        deps: list[str] = []
        for group in p.depends:
            hit = next((a for a in group if a in installed), None)
            hit = hit or next((provided[a] for a in group if a in provided), None)
            if hit and hit != p.name and hit not in deps:
                deps.append(hit)
        graph[p.name] = deps
    return graph


def copyright_licenses(text: str, limit: int = 12) -> list[str]:
    """License short names from a DEP-5 copyright file, in order, deduplicated."""
    found: list[str] = []
    for line in text.splitlines():
        if line.startswith("License:"):
            value = line[len("License:"):].strip()
            if value and value not in found:
                found.append(value)
    return found[:limit]


# dpkg's version ordering (deb-version(7)), so no `dpkg` binary is needed.
def _order(c: str) -> int:
    if c.isdigit():
        return 0
    if c.isalpha():
        return ord(c)
    if c == "~":
        return -1
    return ord(c) + 256


def _verrevcmp(a: str, b: str) -> int:
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ac = _order(a[i]) if i < len(a) else 0
            bc = _order(b[j]) if j < len(b) else 0
            if ac != bc:
                return ac - bc
            i, j = i + 1, j + 1
        while i < len(a) and a[i] == "0":
            i += 1
        while j < len(b) and b[j] == "0":
            j += 1
        first_diff = 0
        while i < len(a) and a[i].isdigit() and j < len(b) and b[j].isdigit():
            first_diff = first_diff or ord(a[i]) - ord(b[j])
            i, j = i + 1, j + 1
        if i < len(a) and a[i].isdigit():
            return 1
        if j < len(b) and b[j].isdigit():
            return -1
        if first_diff:
            return first_diff
    return 0


def _split_version(v: str) -> tuple[int, str, str]:
    epoch, _, rest = v.partition(":") if ":" in v else ("0", "", v)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "")
    return int(epoch or 0), upstream, revision


def compare_versions(a: str, b: str) -> int:
    """<0, 0, >0 as Debian version `a` sorts before, equal to, after `b`."""
    ea, ua, ra = _split_version(a)
    eb, ub, rb = _split_version(b)
    if ea != eb:
        return ea - eb
    return _verrevcmp(ua, ub) or _verrevcmp(ra, rb)
