"""`builder publish`: every selected variant, gated and promoted by digest, then tagged.

One path for every variant: its platform images are a group (a linux/amd64-only variant is a
group of one), and each group goes through the same steps, in this order (each idempotent; what
users and `builder plan` read comes last):
  same tags  every platform resolved to the same CUDA/cuDNN tag
  gate       each platform's staged (else local) image and its evidence (flows.publish_gate);
             one refused or unselected platform refuses the variant (no partial index)
  promote    each platform's manifest into the vetted repository by digest, with SBOM, smoke
             report and provenance attached, and signed
  index      several platforms (or one off linux/amd64): an OCI image index of those manifests,
             pushed by digest and signed; a linux/amd64-only variant keeps its plain manifest
  twin       the zstd twin of that manifest or index (builder.stages.twin; unless the matrix's
             `compression` is [gzip]): same config, tar+zstd layers, attested and signed alike
  tags       `<floating>-YYYYMMDD` (never overwritten), the content tag `build-<hash20>`, the
             floating tag, then the aliases: on the manifest, or on the index; then the same
             tags with `-zstd` on the twin
  record     published.json, as soon as the tags moved
A run stopped at any step leaves no tag on an image without its evidence; run it again to
complete it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from builder.core import clock, engine, keypair, oci, reproducible, sign, zstd
from builder.core.errors import ConfigError
from builder.core.output import human_bytes, step
from builder.flows import publish_gate, record, tag_repair
from builder.model import platforms, publication
from builder.model.matrix import Matrix, Variant
from builder.model.planned import PlannedVariant
from builder.model.publication import Artifact, PlatformEntry, Publication, ZstdTwin
from builder.model.staged import Staged
from builder.stages import build, plan, provenance, publish, staging, twin
from builder.stages.publish import Candidate

# What a platform's entry keeps of its own publication (the rest is the variant's).
PLATFORM_ENTRY_FIELDS = {f.name for f in fields(PlatformEntry)}


@dataclass(frozen=True)
class Promoted:
    """One platform's image in the vetted repository: where, its evidence, its signature."""

    cand: Candidate
    vetted: Staged
    refs: dict[str, dict[str, str]]
    signed: dict[str, Any]


# ---- all selected variants --------------------------------------------------------------------


def publish_variants(matrix: Matrix, planned: list[PlannedVariant], *,
                     allow_cpu_smoke: bool, dry_run: bool = False,
                     manifest: Path | None = None,
                     locks_dir: Path = Path("locks"),
                     trust: keypair.Trust = keypair.UNSIGNED) -> list[dict[str, Any]]:
    """Gate and publish each variant. Returns one result per variant (`status`: published,
    already-published, refused, would-publish). The registry is the record (builder.flows.
    record); `manifest`, when given, is a report of each selected variant's publication, the one
    this run made or the one it found already published, written even when a later variant
    fails. Every tag of the whole matrix is checked for collisions first."""
    if manifest is not None:
        publication.check(manifest)  # a report that cannot be written stops us before a push
    plan.check_tags(matrix, locks_dir)
    engine.ensure_engine()
    results: list[dict[str, Any]] = []
    try:
        found = record.history(matrix, trust.keys)  # a registry down: the same hint as below
        known = {vid: pubs[0] for vid, pubs in found.items()}
        for group in groups(planned):
            if held := already_published(known, group):
                if not dry_run:
                    tag_repair.repair(oci.Registry(matrix.registry), known[held["id"]],
                                      group[0].tags, trust.keys)
                results.append(held)
                report(manifest, {held["id"]: known[held["id"]]})
                continue
            tag_repair.refuse_older(found.get(group[0].variant.id, []), group)
            out = publish_group(matrix, group, allow_cpu_smoke=allow_cpu_smoke,
                                dry_run=dry_run, trust=trust)
            report(manifest, {r["id"]: Publication.from_json(
                {k: v for k, v in r.items() if k not in ("id", "status")})
                for r in out if r["status"] == "published"})
            results += out
    except oci.RegistryError as exc:
        exc.hint = ((exc.hint or "") + "\n\nno tag points at an image without its SBOM and "
                    "smoke report; run `builder publish` again to finish")
        raise
    return results


def report(manifest: Path | None, publications: dict[str, Publication]) -> None:
    """Add publications to the `--manifest` report, when one was asked for."""
    if manifest is not None:
        publication.record(manifest, publications)


def publish_group(matrix: Matrix, group: list[PlannedVariant], *, allow_cpu_smoke: bool,
                  dry_run: bool, trust: keypair.Trust = keypair.UNSIGNED) -> list[dict[str, Any]]:
    """The steps of one variant (see the module's docstring). Returns one result for the
    variant, one refusal per refused platform, or one would-publish entry per platform."""
    multi = is_multi(matrix, group[0].variant)
    check_same_tags(group)
    cands, refused = gate_all(matrix, group, allow_cpu_smoke, trust)
    if refused:
        return refused
    if dry_run:
        return [would_publish(matrix, c, multi) for c in cands]
    order = list(platforms.KNOWN)
    cands.sort(key=lambda c: order.index(c.planned.variant.platform))
    promoted = [promote_platform(matrix, c, multi) for c in cands]
    top = push_index(matrix, promoted) if multi else promoted[0].vetted
    first = cands[0].planned
    tags = [*([] if multi else [first.hash_tag]), *first.tags]
    dated = publish.next_dated(top, first.floating_tag, cands[0].trust.keys)
    twins = promote_twins(matrix, top, [(p.vetted, p.cand) for p in promoted], first.floating_tag)
    signed = publish.sign_digest(top, cands[0].trust,
                                 sign.tag_annotations(first.variant.id, [dated[0], *tags]))
    if not signed["signed"]:
        step(f"  [{first.variant.id}] published UNSIGNED (--unsigned): no signature, no signed "
             "attestations; `builder verify --key` refuses it")
    platform_tags = {p.vetted.digest: p.cand.planned.hash_tag for p in promoted} if multi \
        else None
    sign_twins(twins, cands[0].trust, first.variant.id, [dated[0], *tags], platform_tags)
    publish.write_tags(top, first.floating_tag, tags, dated)
    zstd_tags = write_twin_tags(twins, [dated[0], *tags], platform_tags)
    dated = dated[0]
    if multi:
        step(f"  [{first.variant.id}] index {top.digest[:19]} "
             f"({', '.join(p.cand.planned.variant.platform for p in promoted)}) → {dated}, "
             f"{first.floating_tag}")
    pub = publication_of(matrix, cands[0], top.digest, dated,
                      [dated, *(c.planned.hash_tag for c in cands), *first.tags],
                      promoted[0].refs, signed)
    if multi:
        pub = replace(pub, platforms=tuple(platform_entry(matrix, p) for p in promoted))
    if twins is not None:
        pub = replace(pub, zstd=ZstdTwin(twins.top.digest, f"{matrix.image_name}@"
                                         f"{twins.top.digest}", tuple(zstd_tags)))
    return [{"id": first.variant.id, "status": "published", **pub.to_json()}]


def already_published(known: dict[str, Publication], group: list[PlannedVariant]
                      ) -> dict[str, Any] | None:
    """The result of a variant the registry already holds with this content (every platform's
    hash) under a publication that counts (signed by a trusted key, when keys are given)."""
    vid = group[0].variant.id
    pub = known.get(vid)
    if pub is None:
        return None
    held = {pub.content_hash, *(e.content_hash for e in pub.platforms)}
    if not all(p.content_hash in held for p in group):
        return None
    message = f"already published as {pub.reference} (dated {pub.dated_tag})"
    step(f"  [{vid}] {message}")
    return {"id": vid, "status": "already-published", "reason": message, "digest": pub.digest,
            "reference": pub.reference, "dated_tag": pub.dated_tag, "tags": list(pub.tags)}


# ---- the steps --------------------------------------------------------------------------------


def declared(matrix: Matrix, variant_id: str) -> list[str]:
    """The platforms the matrix declares for a variant id, in matrix order."""
    return [v.platform for v in matrix.variants if v.id == variant_id]


def is_multi(matrix: Matrix, variant: Variant) -> bool:
    """Published as an index: several platforms, or one that is not linux/amd64."""
    names = declared(matrix, variant.id)
    return len(names) > 1 or names != [platforms.DEFAULT]


def groups(planned: Iterable[PlannedVariant]) -> list[list[PlannedVariant]]:
    """The planned images by variant id (one list per variant), in plan order."""
    by_id: dict[str, list[PlannedVariant]] = {}
    for p in planned:
        by_id.setdefault(p.variant.id, []).append(p)
    return list(by_id.values())


def check_same_tags(group: list[PlannedVariant]) -> None:
    """One tag names all platforms: they must resolve to the same CUDA/cuDNN tag."""
    found = {p.tags for p in group}
    if len(found) != 1:
        raise ConfigError(f"{group[0].variant.id}: its platforms resolved to different tags "
                          f"({' vs '.join(t[0] for t in sorted(found))}): one tag cannot name "
                          "them all; make their locks agree or give them separate variants")


def gate_all(matrix: Matrix, group: list[PlannedVariant], allow_cpu_smoke: bool,
             trust: keypair.Trust = keypair.UNSIGNED
             ) -> tuple[list[Candidate], list[dict[str, Any]]]:
    """Candidates, and the variant's refusal (at most one: a variant is counted once): one
    refused or unselected platform refuses the variant (no partial index)."""
    vid = group[0].variant.id
    names = declared(matrix, vid)
    cands = [publish_gate.gate(matrix, p, allow_cpu_smoke=allow_cpu_smoke, trust=trust)
             for p in group]
    problems = [(f"{c.planned.variant.platform}: " if len(names) > 1 else "") + c.reason
                for c in cands if c.reason]
    missing = [name for name in names if name not in {p.variant.platform for p in group}]
    if missing:
        problems.append(f"{', '.join(missing)} not selected (one index holds every declared "
                        "platform of the variant)")
    if not problems:
        return cands, []
    image_id = next((c.image_id for c in cands if c.reason), "")
    refusal = {"id": vid, "status": "refused", "reason": "; ".join(problems),
               "image_id": image_id, "missing_platforms": missing}
    step(f"  [{vid}] refused: {refusal['reason']}")
    return cands, [refusal]


def would_publish(matrix: Matrix, cand: Candidate, multi: bool) -> dict[str, Any]:
    """--dry-run's entry of one platform (an index's also names its platform)."""
    entry = publish.dry_run_entry(matrix, cand)
    if multi:
        entry |= {"id": cand.planned.variant.key, "platform": cand.planned.variant.platform}
    return entry


def promote_platform(matrix: Matrix, cand: Candidate, multi: bool) -> Promoted:
    """One platform's manifest in the vetted repository with its evidence, signed; in an index,
    also its own content tag (a plain manifest gets it with the variant's tags)."""
    p = cand.planned
    ref = cand.staged.reference if cand.staged else cand.image
    step(f"  [{p.variant.key}] promoting {ref} by digest" if multi
         else f"  [{p.variant.id}] publishing {ref}")
    vetted, refs = promote_with_evidence(matrix, cand)
    signed: dict[str, Any] = {}
    if multi:  # a plain manifest is signed with the variant's tags (publish_group)
        signed = publish.sign_digest(vetted, cand.trust,
                                     sign.tag_annotations(p.variant.id, [p.hash_tag]))
        publish.tag_image(vetted, p.hash_tag)
    return Promoted(cand, vetted, refs, signed)


def promote_with_evidence(matrix: Matrix, cand: Candidate
                          ) -> tuple[Staged, dict[str, dict[str, str]]]:
    """The gated image in the vetted repository by digest, with SBOM, smoke report and
    provenance attached to that digest and (with a key) their signed attestations; no tag
    points at it yet (sign_digest signs it next)."""
    trust = cand.trust
    vetted = publish.promote(matrix, stage(matrix, cand))
    refs = {"sbom": attach(vetted, "sbom", cand.evidence["sbom"], trust),
            "smoke_report": attach(vetted, "smoke", cand.evidence["smoke"], trust),
            "provenance": attach(vetted, "provenance", provenance_of(vetted, trust), trust)}
    return vetted, refs


def stage(matrix: Matrix, cand: Candidate) -> Staged:
    """The staged image (the local one staged first, through the one staging path), with this
    machine's evidence attached there too, so the next machine finds it."""
    if cand.staged is None:
        return staging.stage(matrix, cand.image_id, cand.planned.hash_tag,
                             evidence_files=cand.evidence, key=cand.trust.key)
    staging.attach_all(cand.staged, cand.evidence, cand.trust.key)
    return cand.staged


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


def push_index(matrix: Matrix, promoted: list[Promoted]) -> Staged:
    """The image index of one variant's platform manifests, stored by digest (no tag yet, not
    signed yet: publish_group signs it with its tags)."""
    reg = oci.Registry(matrix.registry)
    vid = promoted[0].cand.planned.variant.id
    doc = platforms.index_document(
        [platforms.PlatformManifest(platforms.get(p.cand.planned.variant.platform),
                                    p.vetted.descriptor) for p in promoted],
        {"org.opencontainers.image.title": f"{matrix.repository}:{vid}"})
    desc = reg.push_index(matrix.repository, doc)
    return Staged(matrix.registry, matrix.repository, desc, "")


def platform_entry(matrix: Matrix, promoted: Promoted) -> PlatformEntry:
    """A platform's entry in its index's publication."""
    p = promoted.cand.planned
    own = publication_of(matrix, promoted.cand, promoted.vetted.digest, "", [p.hash_tag],
                      promoted.refs).to_json()
    entry = {k: v for k, v in own.items() if k in PLATFORM_ENTRY_FIELDS}
    return PlatformEntry.from_json({**entry, "platform": p.variant.platform,
                                    "smoke_emulated": smoke_emulated(promoted.cand)})


def smoke_emulated(cand: Candidate) -> bool:
    """Whether the platform's smoke report ran under emulation (recorded per platform)."""
    try:
        report = json.loads(cand.evidence.get("smoke", b"{}"))
    except ValueError:
        return False
    return bool((report.get("runner") or {}).get("emulated"))


def publication_of(matrix: Matrix, cand: Candidate, digest: str, dated: str,
                tags: list[str], refs: dict[str, dict[str, str]],
                signed: dict[str, Any] | None = None) -> Publication:
    """The published.json record of one image (a manifest, or an index)."""
    p = cand.planned
    date = publish.today()
    facts = p.rendered.facts
    return Publication(
        date=f"{date[:4]}-{date[4:6]}-{date[6:]}",
        published_at=clock.iso(),
        registry=matrix.registry, repository=matrix.repository,
        digest=digest, reference=f"{matrix.image_name}@{digest}",
        image_id=cand.image_id, content_hash=p.content_hash,
        tags=tuple(tags), dated_tag=dated, hash_tag=p.hash_tag,
        floating_tag=p.floating_tag, aliases=tuple(p.tags[1:]),
        torch=facts.get("torch"), python=facts.get("python") or p.variant.python,
        accelerator=p.variant.accelerator, cuda=facts.get("cuda"),
        cudnn=facts.get("cudnn"), nccl=facts.get("nccl"),
        min_driver=facts.get("min_driver"), flavor=p.variant.flavor,
        **{kind: Artifact.from_json(ref) for kind, ref in refs.items()},
        smoke_gpu=cand.smoke_gpu, allow_cpu_smoke=cand.allow_cpu_smoke, **(signed or {}),
    )


# ---- the zstd twins (builder.stages.twin) ------------------------------------------------------


@dataclass(frozen=True)
class Twins:
    """The twins of one publication in the vetted repository: the top one (a manifest, or an
    index) and each platform manifest's, by its gzip sibling's digest."""

    top: Staged
    platforms: dict[str, Staged]
    report: twin.Report


def promote_twins(matrix: Matrix, top: Staged, images: Sequence[tuple[Staged, Candidate]],
                  floating: str) -> Twins | None:
    """Step `twin` of `builder publish` (none when the matrix's `compression` lacks zstd): the
    zstd twin of the promoted manifest or index, each platform's twin with the same SBOM and
    smoke report attached and its own provenance (naming its gzip sibling). Not signed and not
    tagged yet: `sign_twins` signs them with their tags, `write_twin_tags` writes those last."""
    if not matrix.zstd_twins:
        return None
    reg, report, start = oci.Registry(top.registry), twin.Report(), time.monotonic()
    desc = twin.make(reg, top.repository, top.digest, known=twin.tag_of(floating),
                     report=report)
    twins: dict[str, Staged] = {}
    for vetted, cand in images:
        mine = Staged(vetted.registry, vetted.repository, report.twins[vetted.digest],
                      vetted.image_id)
        for kind in ("sbom", "smoke"):
            attach(mine, kind, cand.evidence[kind], cand.trust)
        attach(mine, "provenance", twin_provenance(provenance_of(mine, cand.trust),
                                                   vetted.digest), cand.trust)
        twins[vetted.digest] = mine
    report.seconds = time.monotonic() - start
    step(f"  zstd twin {desc.digest[:19]} of {top.digest[:19]}: "
         + ("already there" if report.reused else
            f"{human_bytes(report.gzip_bytes)} gzip → {human_bytes(report.zstd_bytes)} zstd "
            f"in {report.seconds:.0f} s"))
    return Twins(twins.get(top.digest) or Staged(top.registry, top.repository, desc, ""),
                     twins, report)


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
