"""Every media type and artifact type the pipeline writes or reads, in one place.

Registry documents (OCI and Docker manifests, indexes, configs, layers), cosign's signature and
attestation formats, and the evidence attached to an image's digest: each kind of evidence has
one media type and one file name (its title), whoever attaches or reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

# ---- registry documents -----------------------------------------------------------------------
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
MANIFEST_TYPES = (OCI_INDEX, OCI_MANIFEST, DOCKER_MANIFEST, DOCKER_LIST)
INDEX_TYPES = (OCI_INDEX, DOCKER_LIST)
EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"

# ---- signatures and attestations (cosign's formats) -------------------------------------------
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
DSSE_ENVELOPE = "application/vnd.dsse.envelope.v1+json"
IN_TOTO = "application/vnd.in-toto+json"

# ---- evidence attached to an image's digest ---------------------------------------------------
SBOM = "application/vnd.cyclonedx+json"
SMOKE_REPORT = "application/vnd.torch-images.smoke-report+json"
PROVENANCE = IN_TOTO  # a whole in-toto statement (SLSA provenance v1)
AUDIT = "application/vnd.torch-images.audit+json"
REBUILD = "application/vnd.torch-images.rebuild+json"


@dataclass(frozen=True)
class Kind:
    """One kind of attached evidence: its artifact (media) type and file name."""

    media_type: str
    title: str


KINDS = {
    "smoke": Kind(SMOKE_REPORT, "smoke-report.json"),
    "sbom": Kind(SBOM, "sbom.cdx.json"),
    "provenance": Kind(PROVENANCE, "provenance.intoto.json"),
    "audit": Kind(AUDIT, "audit.json"),
    "rebuild": Kind(REBUILD, "rebuild.json"),
}
