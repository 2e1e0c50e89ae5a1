"""SBOMs of built images: CycloneDX 1.6 from the image's filesystem, diffs, vulnerability audit.

Public API: `generate`, `write`, `validate`, `diff_sboms`, `audit`.
"""

from __future__ import annotations

from typing import Any

from sbom.audit import audit
from sbom.diff import diff_sboms
from sbom.validate import SbomInvalid, validate, write

__all__ = ["SbomInvalid", "audit", "diff_sboms", "generate", "validate", "write"]


def generate(image_ref: str, *, reproducible: bool = False) -> dict[str, Any]:
    """The CycloneDX 1.6 JSON document of a local image, as a dict.

    Validated where it leaves the process (`write`, `validate.render`), once, not here.

    `reproducible` (or SOURCE_DATE_EPOCH in the environment) derives the serial number from the
    image id and the timestamp from its `org.opencontainers.image.created` label.
    """
    from sbom.bom import build_document
    from sbom.collect import collect

    return build_document(collect(image_ref), reproducible=reproducible)
