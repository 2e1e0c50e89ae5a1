"""Multi-platform publishing: one OCI image index joins a variant's platform images under its tags,
so `docker pull TAG` gives each node its own architecture.

Each platform is built and staged on its own (`builder build --stage`: a platform's content
hash is its own, so `<repository>-staging:build-<hash20>` names one platform's image, with its
smoke report and SBOM attached to that platform manifest). `builder publish` then, per variant:
  gate     every declared platform (one refused or unselected platform refuses the variant)
  promote  each platform manifest by digest, with SBOM, smoke report and provenance attached to
           it, and its content tag `build-<hash20>` (what `builder plan` reads)
  index    an image index of those manifests, pushed by digest, then the dated, floating and
           alias tags pointed at it
Tags a user reads point at the index only once every platform's manifest, with its evidence,
is in the vetted repository. A variant that is linux/amd64 alone keeps its plain manifest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from builder.core import engine, oci, sign
from builder.core.errors import ConfigError
from builder.core.output import step
from builder.model import platforms, publication
from builder.model.matrix import Matrix, Variant
from builder.model.publication import PlatformEntry, Publication
from builder.stages import plan, publish
from builder.stages.evidence import Staged

# What a platform's entry keeps of its own publication (the rest is the variant's).
PLATFORM_ENTRY_FIELDS = {f.name for f in fields(PlatformEntry)}

def declared(matrix: Matrix, variant_id: str) -> list[str]:
    """The platforms the matrix declares for a variant id, in matrix order."""
    return [v.platform for v in matrix.variants if v.id == variant_id]


def is_multi(matrix: Matrix, variant: Variant) -> bool:
    """Published as an index: several platforms, or one that is not linux/amd64."""
    names = declared(matrix, variant.id)
    return len(names) > 1 or names != [platforms.DEFAULT]


def groups(planned: Iterable[plan.PlannedVariant]) -> list[list[plan.PlannedVariant]]:
    """The planned images by variant id (one list per index), in plan order."""
    by_id: dict[str, list[plan.PlannedVariant]] = {}
    for p in planned:
        by_id.setdefault(p.variant.id, []).append(p)
    return list(by_id.values())


def smoke_emulated(cand: publish.Candidate) -> bool:
    """Whether the platform's smoke report ran under emulation (recorded per platform)."""
    try:
        report = json.loads(cand.evidence.get("smoke", b"{}"))
    except ValueError:
        return False
    return bool((report.get("runner") or {}).get("emulated"))


# ---- the gate ---------------------------------------------------------------------------------


def gate_all(matrix: Matrix, group: list[plan.PlannedVariant], allow_cpu_smoke: bool,
             trust: sign.Trust = sign.UNSIGNED
             ) -> tuple[list[publish.Candidate], list[dict[str, Any]]]:
    """Candidates, and refusals: one refused platform refuses the variant (no partial index)."""
    vid = group[0].variant.id
    cands = [publish.gate(matrix, p, allow_cpu_smoke=allow_cpu_smoke, trust=trust)
             for p in group]
    refused = [{"id": c.planned.variant.key, "status": "refused", "reason": c.reason,
                "image_id": c.image_id} for c in cands if c.reason]
    missing = sorted(set(declared(matrix, vid)) - {p.variant.platform for p in group})
    if missing:
        refused.append({"id": vid, "status": "refused", "image_id": "",
                        "reason": f"not selected: {', '.join(missing)}; one index holds every "
                        "declared platform (select them all, e.g. without platform=)"})
    for entry in refused:
        step(f"  [{entry['id']}] refused: {entry['reason']}")
    return cands, refused


# ---- per platform, then the index -------------------------------------------------------------


def promote_platform(matrix: Matrix, cand: publish.Candidate) -> tuple[Staged, PlatformEntry]:
    """One platform's manifest in the vetted repository with its evidence and content tag;
    returns it and its entry in the index's publication."""
    p = cand.planned
    step(f"  [{p.variant.key}] promoting "
         f"{cand.staged.reference if cand.staged else cand.image} by digest")
    vetted, refs = publish.promote_with_evidence(matrix, cand)
    publish.sign_digest(vetted, cand.trust)
    publish.tag_image(vetted, p.hash_tag)
    own = publish.publication(matrix, cand, vetted.digest, "", [p.hash_tag], refs).to_json()
    entry = {k: v for k, v in own.items() if k in PLATFORM_ENTRY_FIELDS}
    return vetted, PlatformEntry.from_json(
        {**entry, "platform": p.variant.platform, "smoke_emulated": smoke_emulated(cand)})


def push_index(matrix: Matrix, vid: str, manifests: list[platforms.PlatformManifest]) -> Staged:
    """The image index of one variant's platform manifests, stored by digest (no tag yet)."""
    reg = oci.Registry(matrix.registry)
    doc = platforms.index_document(
        manifests, {"org.opencontainers.image.title": f"{matrix.repository}:{vid}"})
    desc = reg.push_index(matrix.repository, doc)
    return Staged(matrix.registry, matrix.repository, desc, "")


def check_same_tags(group: list[plan.PlannedVariant]) -> None:
    """One tag names all platforms: they must resolve to the same CUDA/cuDNN tag."""
    found = {p.tags for p in group}
    if len(found) != 1:
        raise ConfigError(f"{group[0].variant.id}: its platforms resolved to different tags "
                          f"({' vs '.join(t[0] for t in sorted(found))}): one tag cannot name "
                          "them all; make their locks agree or give them separate variants")


def publish_group(matrix: Matrix, group: list[plan.PlannedVariant], *, allow_cpu_smoke: bool,
                  dry_run: bool, trust: sign.Trust = sign.UNSIGNED) -> list[dict[str, Any]]:
    """Gate every platform, promote each by digest with its evidence, then the index and its
    tags. Returns one result for the variant (or one refusal per refused platform)."""
    check_same_tags(group)
    cands, refused = gate_all(matrix, group, allow_cpu_smoke, trust)
    if refused:
        return refused
    if dry_run:
        return [publish.dry_run_entry(matrix, c) | {"id": c.planned.variant.key,
                                                    "platform": c.planned.variant.platform}
                for c in cands]
    order = list(platforms.KNOWN)
    cands.sort(key=lambda c: order.index(c.planned.variant.platform))
    promoted = [promote_platform(matrix, c) for c in cands]
    index = push_index(matrix, group[0].variant.id, [
        platforms.PlatformManifest(platforms.get(entry.platform), vetted.descriptor)
        for vetted, entry in promoted])
    signed = publish.sign_digest(index, trust)
    first = cands[0].planned
    dated = publish.write_tags(index, first.floating_tag, list(first.tags))
    step(f"  [{first.variant.id}] index {index.digest[:19]} "
         f"({', '.join(e.platform for _, e in promoted)}) → {dated}, {first.floating_tag}")
    own = promoted[0][1]
    evidence_refs = {"sbom": own.sbom.to_json(), "smoke_report": own.smoke_report.to_json()}
    if own.provenance:
        evidence_refs["provenance"] = own.provenance.to_json()
    pub = publish.publication(matrix, cands[0], index.digest, dated,
                              [dated, *(c.planned.hash_tag for c in cands), *first.tags],
                              evidence_refs, signed)
    pub = replace(pub, platforms=tuple(entry for _, entry in promoted))
    return [{"id": first.variant.id, "status": "published", **pub.to_json()}]


# ---- all selected variants --------------------------------------------------------------------


def publish_variants(matrix: Matrix, planned: list[plan.PlannedVariant], *,
                     allow_cpu_smoke: bool, dry_run: bool = False,
                     manifest: Path = publication.MANIFEST,
                     locks_dir: Path = Path("locks"),
                     trust: sign.Trust = sign.UNSIGNED) -> list[dict[str, Any]]:
    """Gate and publish each variant. Returns one result per variant (`status`: published,
    refused, would-publish). Records what was published even when a later variant fails.
    Every tag of the whole matrix is checked for collisions before anything is pushed. A variant
    with several platforms is published as one image index (publish_group)."""
    publication.check(manifest)  # a record that cannot be written stops us before a push
    plan.check_tags(matrix, locks_dir)
    engine.ensure_engine()
    results: list[dict[str, Any]] = []
    try:
        for group in groups(planned):
            if is_multi(matrix, group[0].variant):
                out = publish_group(matrix, group, allow_cpu_smoke=allow_cpu_smoke,
                                    dry_run=dry_run, trust=trust)
            else:
                out = [publish.publish_variant(matrix, p, allow_cpu_smoke=allow_cpu_smoke,
                                               dry_run=dry_run, trust=trust) for p in group]
            # Recorded as soon as its tags moved; a run stopped before this line is recorded by
            # the next one, which finds the tags in place (each step is idempotent).
            publication.record(manifest, {
                r["id"]: Publication.from_json({k: v for k, v in r.items()
                                                if k not in ("id", "status")})
                for r in out if r["status"] == "published"})
            results += out
    except oci.RegistryError as exc:
        exc.hint = ((exc.hint or "") + "\n\nno tag points at an image without its SBOM and "
                    "smoke report; run `builder publish` again to finish")
        raise
    return results
