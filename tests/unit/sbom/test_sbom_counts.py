"""One number of components everywhere (build's table, `builder sbom`, verify, the catalog:
nested components included), and a changelog that tells an upgrade from a downgrade."""

from __future__ import annotations

import json
from typing import Any

import pytest

import sbom
from builder.core import state
from builder.flows import build as build_flow
from builder.flows import verify
from builder.model import catalog_doc
from sbom.diff import COUNTED, change_line, component_total, diff_sboms, direction, format_diff

IMAGE_ID = "sha256:" + "3" * 64


def nested() -> dict[str, Any]:
    """Two top-level components, one of them bundling a native library (nested)."""
    return {"specVersion": "1.6", "components": [
        {"type": "library", "name": "torch", "version": "2.13.0", "purl": "pkg:pypi/torch@2.13.0",
         "components": [{"type": "library", "name": "libgomp", "version": "1",
                         "purl": "pkg:generic/libgomp@1"}]},
        {"type": "library", "name": "bash", "version": "5.2", "purl": "pkg:deb/debian/bash@5.2"}]}


def test_build_verify_and_the_catalog_print_one_number(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = nested()
    assert component_total(doc) == 3 and "nested" in COUNTED
    state.atomic_write(state.evidence_path("sbom", IMAGE_ID), json.dumps(doc))
    built = build_flow.summarized(build_flow.Outcome(variant_id="v", state="built", image="i", image_id=IMAGE_ID))
    monkeypatch.setattr(sbom, "validate", lambda _doc: None)
    assert built.sbom_components == 3
    assert verify.sbom_row(doc).detail.startswith("CycloneDX 1.6: 3 components")
    assert catalog_doc.sbom_summary(doc)["total"] == 3


@pytest.mark.parametrize(("kind", "old", "new", "moved"), [
    ("pypi", "2.3.6", "2.3.5", "downgrade"),
    ("pypi", "2.3.5", "2.3.10", "upgrade"),
    ("deb", "2.36-9+deb12u10", "2.36-9+deb12u4", "downgrade"),  # not by string order
    ("deb", "1.0~rc1", "1.0", "upgrade"),
    ("pypi", "not a version", "2.0", "change"),
    ("generic", "1", "2", "change"),
])
def test_a_change_is_ordered_by_the_package_types_own_versions(kind, old, new, moved) -> None:
    assert direction(kind, {old}, {new}) == moved
    assert direction(kind, {old, new}, {new}) == "change"  # two installed: no one order


def test_the_changelog_line_says_downgraded() -> None:
    def doc(version: str) -> dict[str, Any]:
        return {"components": [{"name": "numpy", "version": version,
                                "purl": f"pkg:pypi/numpy@{version}"}]}

    down = diff_sboms(doc("2.3.6"), doc("2.3.5"))
    assert change_line(down) == "0 added, 0 removed, 0 upgraded, 1 downgraded"
    assert "pypi/numpy 2.3.6 → 2.3.5 (downgrade)" in format_diff(down)
    assert change_line(diff_sboms(doc("2.3.5"), doc("2.3.6"))) == "0 added, 0 removed, 1 upgraded"
