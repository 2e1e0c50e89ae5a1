"""The zstd twin steps of `builder publish` (builder.stages.twin), and the evidence calls a
gzip image and its twin share (`attach`, `provenance_of`): step `twin` makes and attests the
twins, step `sign` signs them, step `tags` writes their `-zstd` tags last (builder.flows.publish).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from builder.core import keypair, oci, reproducible, sign, zstd
from builder.core.output import human_bytes, step
from builder.flows import vuln_audit
from builder.model.matrix import Matrix
from builder.model.staged import Staged
from builder.stages import build, provenance, publish, staging, twin
from builder.stages.publish import Candidate


def attach(vetted: Staged, kind: str, data: bytes, trust: keypair.Trust) -> dict[str, str]:
    """One evidence file attached to a vetted digest, signed with the trusted key (if any)."""
    return staging.attach(vetted, kind, data, key=trust.key)


def provenance_of(vetted: Staged, trust: keypair.Trust) -> bytes:
    """The SLSA provenance statement, from the image's labels in the registry; it says when
    the staged evidence was taken unsigned (--unsigned)."""
    config = staging.image_config(vetted)
    doc = provenance.statement(f"{vetted.registry}/{vetted.repository}", vetted.digest,
                               (config.get("config") or {}).get("Labels") or {},
                               reproducible.record(config),
                               times=build.build_times(vetted.image_id))
    if trust.unsigned:
        doc["predicate"]["buildDefinition"]["internalParameters"]["unsigned_staging"] = True
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()




@dataclass(frozen=True)
class Twins:
    """The twins of one publication in the vetted repository: the top one (a manifest, or an
    index) and each platform manifest's, by its gzip sibling's digest."""

    top: Staged
    platforms: dict[str, Staged]
    report: twin.Report


def promote_twins(matrix: Matrix, top: Staged, images: Sequence[tuple[Staged, Candidate]],
                  tags: Sequence[str], platform_tags: dict[str, str] | None = None,
                  audits: Mapping[str, dict[str, Any] | None] | None = None) -> Twins | None:
    """Step `twin` of `builder publish` (none when the matrix's `compression` lacks zstd): the
    zstd twin of the promoted manifest or index, always recompressed (never found), each
    platform's twin with the same SBOM and smoke report attached, its own provenance (naming
    its gzip sibling) and its gzip sibling's vulnerability report (`audits`: a node pulling the
    twin asks about the twin's digest). A different twin already under one of `tags`' twin
    tags, or in an index under a platform's content tag's twin (`platform_tags`), is reported;
    the tags step replaces it. Not signed and not tagged yet: `sign_twins` signs them with
    their tags, `write_twin_tags` writes those last."""
    if not matrix.zstd_twins:
        return None
    reg, report, start = oci.Registry(top.registry), twin.Report(), time.monotonic()
    desc = twin.make(reg, top.repository, top.digest, report=report)
    twins: dict[str, Staged] = {}
    for vetted, cand in images:
        mine = Staged(vetted.registry, vetted.repository, report.twins[vetted.digest],
                      vetted.image_id)
        for kind in ("sbom", "smoke"):
            attach(mine, kind, cand.evidence[kind], cand.trust)
        attach(mine, "provenance", twin_provenance(provenance_of(mine, cand.trust),
                                                   vetted.digest), cand.trust)
        if (found := (audits or {}).get(vetted.digest)) is not None:
            vuln_audit.attach(mine, found, cand.trust.key)
        twins[vetted.digest] = mine
    report.seconds = time.monotonic() - start
    step(f"  zstd twin {desc.digest[:19]} of {top.digest[:19]}: "
         f"{human_bytes(report.gzip_bytes)} gzip → {human_bytes(report.zstd_bytes)} zstd "
         f"in {report.seconds:.0f} s ({report.reused} of {report.layers} layers made before)")
    report_stale(reg, top.repository, desc, top.digest, tags)
    for gzip_digest, tag in (platform_tags or {}).items():
        report_stale(reg, top.repository, report.twins[gzip_digest], gzip_digest, [tag])
    return Twins(twins.get(top.digest) or Staged(top.registry, top.repository, desc, ""),
                     twins, report)


def report_stale(reg: oci.Registry, repository: str, made: oci.Descriptor, source: str,
                 tags: Sequence[str]) -> None:
    """One line for each twin of `tags` that holds another manifest than the twin `made` of
    `source` while claiming it (twin.stale): the tags step overwrites it, and says so here."""
    for tag, held in twin.stale(reg, repository, made, source, [twin.tag_of(t) for t in tags]):
        step(f"  zstd twin `{tag}` held {held[:19]}, not the twin made of {source[:19]}: "
             "replacing it")


def twin_provenance(statement: bytes, gzip_digest: str) -> bytes:
    """The twin's provenance statement (its own subject) saying what it was made from."""
    doc = json.loads(statement)
    doc["predicate"]["buildDefinition"]["internalParameters"].update(
        {"zstd_twin_of": gzip_digest, "zstd_encoder": zstd.ENCODER})
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()


def sign_twins(published: Twins | None, trust: keypair.Trust, variant: str,
               tags: Sequence[str], platform_tags: dict[str, str] | None = None) -> None:
    """Sign each twin as its gzip sibling is signed, naming the `-zstd` tags it will carry: an
    index's platform twins their content tag's twin, the top one every twin tag."""
    if published is None:
        return
    for gzip_digest, tag in (platform_tags or {}).items():
        publish.sign_digest(published.platforms[gzip_digest], trust,
                            sign.tag_annotations(variant, [twin.tag_of(tag)]))
    publish.sign_digest(published.top, trust,
                        sign.tag_annotations(variant, [twin.tag_of(t) for t in tags]))


def write_twin_tags(published: Twins | None, tags: Sequence[str],
               platform_tags: dict[str, str] | None = None) -> list[str]:
    """`<tag>-zstd` for each of the gzip image's `tags` (dated, content, floating, aliases, in
    that order) and, in an index, for each platform's content tag; the twin tags written."""
    if published is None:
        return []
    written = []
    for tag in tags:
        publish.tag_image(published.top, twin.tag_of(tag))
        written.append(twin.tag_of(tag))
    for gzip_digest, tag in (platform_tags or {}).items():
        publish.tag_image(published.platforms[gzip_digest], twin.tag_of(tag))
        written.append(twin.tag_of(tag))
    return written
