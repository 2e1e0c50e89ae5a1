"""`builder verify REF@sha256:…`: what a platform team checks before it runs an image.

Needs no checkout and no matrix: everything is read from the registry, by digest — the image's
labels, and the smoke report, SBOM and provenance attached to that digest — and checked against
each other. Exit 0 only when everything a platform team needs is there and agrees.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from builder.core import labels, oci
from builder.core.errors import BuilderError
from builder.stages import platforms, provenance, smoketest
from smoke.host import host_summary

OK, MISSING, BAD = "ok", "missing", "fail"
# Report facts that must equal the image's labels.
AGREEING_FACTS = {"torch": labels.TORCH, "cuda": labels.CUDA, "cudnn": labels.CUDNN,
                  "accelerator": labels.ACCELERATOR, "flavor": labels.FLAVOR}


@dataclass(frozen=True)
class Row:
    what: str
    status: str  # ok | missing | fail
    detail: str


@dataclass(frozen=True)
class Reference:
    registry: str
    repository: str
    ref: str  # a digest or a tag

    @classmethod
    def parse(cls, text: str) -> Reference:
        name, sep, digest = text.partition("@")
        if not sep:
            name, digest = text.rsplit(":", 1) if ":" in text.split("/")[-1] else (text, "")
        registry, _, repository = name.partition("/")
        if not (registry and repository and digest):
            raise BuilderError(f"`{text}` is not REGISTRY/REPOSITORY@sha256:DIGEST",
                               hint="e.g. 127.0.0.1:5000/torch@sha256:… (the `reference` "
                               "field of published.json)")
        return cls(registry, repository, digest)


def verify(reference: Reference) -> tuple[str, list[Row]]:
    """(the image digest, one row per thing checked)."""
    reg = oci.Registry(reference.registry)
    found = reg.manifest(reference.repository, reference.ref)
    if found is None:
        raise BuilderError(f"`{reference.registry}/{reference.repository}` has no image "
                           f"`{reference.ref}`")
    body, desc = found
    manifest = json.loads(body)
    if desc.media_type in (oci.OCI_INDEX, oci.DOCKER_LIST):
        return desc.digest, index_rows(reference, manifest)
    config_digest = (manifest.get("config") or {}).get("digest", "")
    config = reg.config(reference.repository, config_digest) if config_digest else {}
    image_labels = (config.get("config") or {}).get("Labels") or {}

    def fetch(kind: str) -> Any:
        data = reg.fetch_artifact(reference.repository, desc.digest, kind)
        try:
            return None if data is None else json.loads(data)
        except ValueError:
            return "not JSON"

    rows = [label_row(image_labels),
            *smoke_rows(fetch("smoke"), config_digest, image_labels),
            sbom_row(fetch("sbom")),
            provenance_row(fetch("provenance"), desc.digest, image_labels)]
    return desc.digest, rows


def index_rows(reference: Reference, index: dict[str, Any]) -> list[Row]:
    """A multi-arch index: each platform's manifest is checked (its evidence is attached to
    it, not to the index), rows prefixed with the platform."""
    rows = []
    for child in index.get("manifests", []):  # at most oci.MAX_INDEX_CHILDREN, digests checked
        platform = child.get("platform") if isinstance(child.get("platform"), dict) else {}
        where = f"{platform.get('os', '?')}/{platform.get('architecture', '?')}"
        if child.get("mediaType") in oci.INDEX_TYPES:  # one level: no nesting, so no cycles
            rows.append(Row(f"{where} manifest", BAD, "a nested index: refused"))
            continue
        if where not in platforms.KNOWN:
            rows.append(Row(f"{where} manifest", BAD, "not a platform this pipeline builds "
                            f"({', '.join(platforms.KNOWN)})"))
            continue
        _, child_rows = verify(Reference(reference.registry, reference.repository,
                                         child["digest"]))
        rows += [Row(f"{where} {r.what}", r.status, r.detail) for r in child_rows]
    return rows or [Row("index", MISSING, "the index lists no manifests")]


def label_row(image_labels: dict[str, str]) -> Row:
    wanted = [labels.TORCH, labels.PYTHON, labels.ACCELERATOR, labels.FLAVOR, labels.CONTENT_HASH,
              labels.LOCK_HASH]
    lacking = [key for key in wanted if not image_labels.get(key)]
    if lacking:
        return Row("labels", BAD, f"missing {', '.join(lacking)}")
    versions = ", ".join(f"{key.removeprefix(labels.PREFIX)} {image_labels[key]}"
                         for key in (labels.TORCH, labels.PYTHON, labels.CUDA, labels.CUDNN,
                                     labels.NCCL, labels.MIN_DRIVER) if image_labels.get(key))
    return Row("labels", OK, versions)


def smoke_rows(report: Any, config_digest: str, image_labels: dict[str, str]) -> list[Row]:
    if report is None:
        return [Row("smoke", MISSING, "no smoke report attached (builder smoke, then publish)")]
    if not isinstance(report, dict) or (problem := smoketest.validation_error(report)):
        return [Row("smoke", BAD, f"the report does not match its schema: {problem}")]
    host = host_summary(report.get("host") or {})
    rows = [Row(f"smoke {c['name']}", OK if c["status"] in smoketest.OK_STATUSES else BAD,
                f"{c['status']}: {c.get('message', '')}"[:90]) for c in report["checks"]]
    problems = []
    if report["status"] != "pass":
        problems.append(f"overall {report['status']}")
    if (report.get("image") or {}).get("id") not in (None, config_digest):
        problems.append("it checked another image")
    facts = report.get("facts") or {}
    problems += [f"{name} {facts.get(name)!r} ≠ label {image_labels.get(key)!r}"
                 for name, key in AGREEING_FACTS.items()
                 if (facts.get(name) or "") != (image_labels.get(key) or "")]
    status = BAD if problems else OK
    detail = "; ".join(problems) or f"{report['status']}: {host}"
    return [Row("smoke", status, detail), *rows]


def sbom_row(doc: Any) -> Row:
    import sbom
    from sbom.diff import iter_components

    if doc is None:
        return Row("sbom", MISSING, "no SBOM attached (builder sbom, then publish)")
    if not isinstance(doc, dict):
        return Row("sbom", BAD, "not a CycloneDX JSON document")
    try:
        sbom.validate(doc)
    except sbom.SbomInvalid as exc:
        return Row("sbom", BAD, f"not valid CycloneDX 1.6: {exc}")
    counts: dict[str, int] = {}
    for comp in iter_components(doc):
        kind = (comp.get("purl") or "pkg:other/").split("/")[0].removeprefix("pkg:")
        counts[kind] = counts.get(kind, 0) + 1
    summary = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
    return Row("sbom", OK, f"CycloneDX {doc.get('specVersion')}: {summary}")


def provenance_row(doc: Any, digest: str, image_labels: dict[str, str]) -> Row:
    if doc is None:
        return Row("provenance", MISSING, "no provenance attached (builder publish attaches it)")
    if problems := provenance.problems(doc, digest, image_labels):
        return Row("provenance", BAD, "; ".join(problems))
    params = doc["predicate"]["buildDefinition"]["externalParameters"]
    return Row("provenance", OK, f"commit {params.get('revision', '')[:12]}, lock "
               f"{image_labels.get(labels.LOCK_HASH, '')[:12]}, base "
               f"{image_labels.get(labels.OCI + 'base.digest', '')[:19]}")

