"""Installed Python distributions: core metadata, requirements, RECORD ownership."""

from __future__ import annotations

import email.parser
import re
from dataclasses import dataclass, field

from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement

from sbom.collect import PythonDist

_ARCH_TO_MACHINE = {"amd64": "x86_64", "arm64": "aarch64", "ppc64le": "ppc64le", "s390x": "s390x"}


def normalize(name: str) -> str:
    """PEP 503 name: runs of `-_.` become `-`, lowercase (what syft and PyPI use)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Dist:
    name: str
    version: str
    site: str
    dist_info_path: str  # absolute in-image path
    python: str
    summary: str = ""
    license_expression: str = ""  # PEP 639 License-Expression
    license: str = ""  # legacy License field, when it is a short name
    classifier_licenses: list[str] = field(default_factory=list)
    author: str = ""
    home_page: str = ""
    requires: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)  # RECORD paths, relative to site

    @property
    def key(self) -> str:
        return normalize(self.name)


def parse_dist(raw: PythonDist) -> Dist | None:
    """A Dist from METADATA (+ RECORD), or None when the metadata lacks a name or version."""
    msg = email.parser.HeaderParser().parsestr(raw.metadata)
    name, version = (msg.get("Name") or "").strip(), (msg.get("Version") or "").strip()
    if not name or not version:
        return None
    legacy = (msg.get("License") or "").strip()
    return Dist(
        name=name,
        version=version,
        site=raw.site,
        dist_info_path=f"{raw.site}/{raw.dist_info}",
        python=raw.python,
        summary=(msg.get("Summary") or "").strip(),
        license_expression=(msg.get("License-Expression") or "").strip(),
        # Old packages put the whole license text here; only a one-line name is useful.
        license=legacy if legacy and "\n" not in legacy and len(legacy) <= 80 else "",
        classifier_licenses=[
            c.split("::")[-1].strip()
            for c in msg.get_all("Classifier") or []
            if c.startswith("License ::") and c.count("::") >= 2
        ],
        author=(msg.get("Author") or msg.get("Maintainer") or "").strip(),
        home_page=(msg.get("Home-page") or "").strip(),
        requires=list(msg.get_all("Requires-Dist") or []),
        files=[line.rsplit(",", 2)[0] for line in raw.record.splitlines() if line.strip()],
    )


def marker_environment(python: str, architecture: str) -> dict[str, str]:
    """PEP 508 marker values for the image's interpreter (CPython on Linux), not the host's."""
    full = python if python.count(".") >= 2 else f"{python}.0"
    return {
        "implementation_name": "cpython",
        "implementation_version": full,
        "os_name": "posix",
        "platform_machine": _ARCH_TO_MACHINE.get(architecture, architecture),
        "platform_python_implementation": "CPython",
        "platform_release": "",
        "platform_system": "Linux",
        "platform_version": "",
        "python_full_version": full,
        "python_version": ".".join(python.split(".")[:2]),
        "sys_platform": "linux",
        "extra": "",
    }


def required_names(dist: Dist, architecture: str) -> list[str]:
    """Normalized names of what `dist` requires in the image (markers evaluated, no extras)."""
    env = marker_environment(dist.python if "." in dist.python else "3", architecture)
    names: list[str] = []
    for line in dist.requires:
        try:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(env):
                continue
        except (InvalidRequirement, InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
            continue
        if (key := normalize(req.name)) not in names:
            names.append(key)
    return names
