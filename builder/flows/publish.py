"""`builder publish`: every selected variant, gated and promoted by digest, then tagged.

One path for every variant: its platform images are a group (a linux/amd64-only variant is a
group of one), and each group is one record (`Going`, read with `Run`) through STEPS, in this
order (each idempotent; what users and `builder plan` read comes last):
  same_tags    every platform resolved to the same CUDA/cuDNN tag
  gate         each platform's staged (else local) image and its evidence (flows.publish_gate);
               one refused or unselected platform refuses the variant (no partial index);
               --dry-run stops here
  promote      each platform's manifest into the vetted repository by digest, with SBOM, smoke
               report and provenance attached (an index's platforms also signed and content-tagged)
  audit_step   each platform's signed vulnerability report (flows.vuln_audit; no answer: a warning)
  index        several platforms (or one off linux/amd64): an OCI image index of those
               manifests, pushed by digest; a linux/amd64-only variant keeps its plain manifest;
               the dated tag it will take
  twin_step    the zstd twin of that manifest or index (flows.publish_twin; unless the matrix's
               `compression` is [gzip]): same config, tar+zstd layers, attested alike
  sign_step    the manifest or index signed naming every tag it will carry, then its twins
  tags_step    `<floating>-YYYYMMDD` (never overwritten), the content tag `build-<hash20>`, the
               floating tag, then the aliases: on the manifest, or on the index; then the same
               tags with `-zstd` on the twin
  record_step  the publication: published.json's entry, as soon as the tags moved
A step is `(Run, Going) -> Going`; the next promotion artifact (a SOCI index) is one function and
one line in STEPS, as `audit_step` was. A stopped run leaves no tag on an image without its
evidence; run it again to complete it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from builder.core import clock, engine, keypair, oci, sign
from builder.core.errors import ConfigError
from builder.core.output import step
from builder.flows import publish_gate, record, resign, tag_repair, vuln_audit
from builder.flows.publish_twin import (
    Twins,
    attach,
    promote_twins,
    provenance_of,
    sign_twins,
    write_twin_tags,
)
from builder.model import platforms, publication
from builder.model.matrix import Matrix, Variant
from builder.model.planned import PlannedVariant
from builder.model.publication import Artifact, PlatformEntry, Publication, ZstdTwin
from builder.model.staged import Staged
from builder.stages import plan, publish, staging
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
        found = record.history(matrix, trust.vouchers)  # a registry down: the same hint as below
        known = {vid: pubs[0] for vid, pubs in found.items()}
        for group in groups(planned):
            vid = group[0].variant.id
            if not dry_run and (again := resign.restore(matrix, group, known.get(vid),
                                                        trust.vouchers)):
                known[vid], found[vid] = again, [again, *found.get(vid, [])]
            if held := already_published(known, group):
                if not dry_run:
                    tag_repair.repair(oci.Registry(matrix.registry), known[held["id"]],
                                      group[0].tags, trust.vouchers)
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


@dataclass(frozen=True)
class Run:
    """What every step of one publish reads: the matrix and what the run was asked for."""

    matrix: Matrix
    allow_cpu_smoke: bool
    dry_run: bool
    trust: keypair.Trust


@dataclass(frozen=True, kw_only=True)
class Going:
    """One variant's record through the steps: its platforms, then what each step made.
    `results` set (a refusal, --dry-run's entries, the publication) ends the variant."""

    group: tuple[PlannedVariant, ...]
    multi: bool
    cands: tuple[Candidate, ...] = ()
    promoted: tuple[Promoted, ...] = ()
    top: Staged | None = None  # the manifest or index that takes the variant's tags
    dated: tuple[str, bool] = ("", False)  # publish.next_dated
    twins: Twins | None = None
    audits: dict[str, dict[str, Any] | None] = field(default_factory=dict)  # digest → report
    signed: dict[str, Any] = field(default_factory=dict)
    zstd_tags: tuple[str, ...] = ()
    results: tuple[dict[str, Any], ...] | None = None

    @property
    def first(self) -> PlannedVariant:
        return self.cands[0].planned if self.cands else self.group[0]

    @property
    def tags(self) -> list[str]:
        """The tags after the dated one: content tag (a plain manifest's), floating, aliases."""
        return [*([] if self.multi else [self.first.hash_tag]), *self.first.tags]

    @property
    def platform_tags(self) -> dict[str, str] | None:
        """In an index, each platform manifest's content tag by its digest."""
        return {p.vetted.digest: p.cand.planned.hash_tag for p in self.promoted} \
            if self.multi else None


Step = Callable[[Run, Going], Going]


def publish_group(matrix: Matrix, group: list[PlannedVariant], *, allow_cpu_smoke: bool,
                  dry_run: bool, trust: keypair.Trust = keypair.UNSIGNED) -> list[dict[str, Any]]:
    """One variant through STEPS (see the module's docstring). Returns one result for the
    variant, one refusal per refused platform, or one would-publish entry per platform."""
    run = Run(matrix, allow_cpu_smoke, dry_run, trust)
    going = Going(group=tuple(group), multi=is_multi(matrix, group[0].variant))
    for each in STEPS:
        if going.results is None:
            going = each(run, going)
    return list(going.results or ())


def same_tags(run: Run, g: Going) -> Going:
    """Step `same tags`."""
    check_same_tags(list(g.group))
    return g


def gate(run: Run, g: Going) -> Going:
    """Step `gate`: the candidates in platform order, or the variant's refusal; --dry-run
    stops here with what it would publish."""
    cands, refused = gate_all(run.matrix, list(g.group), run.allow_cpu_smoke, run.trust)
    if refused:
        return replace(g, results=tuple(refused))
    if run.dry_run:
        return replace(g, results=tuple(would_publish(run.matrix, c, g.multi) for c in cands))
    order = list(platforms.KNOWN)
    cands.sort(key=lambda c: order.index(c.planned.variant.platform))
    return replace(g, cands=tuple(cands))


def promote(run: Run, g: Going) -> Going:
    """Step `promote`: each platform's manifest in the vetted repository, with its evidence."""
    return replace(g, promoted=tuple(promote_platform(run.matrix, c, g.multi) for c in g.cands))


def audit_step(run: Run, g: Going) -> Going:
    """Step `audit`: every promoted image audited by default (builder.flows.vuln_audit); each
    report kept for step `twin`, which attaches it to the platform's twin too."""
    return replace(g, audits={p.vetted.digest: vuln_audit.audit_published(
        p.vetted, p.cand.evidence["sbom"], p.cand.planned.variant.key, run.trust.key)
        for p in g.promoted})


def index(run: Run, g: Going) -> Going:
    """Step `index`: several platforms' image index (else the manifest), and its dated tag."""
    top = push_index(run.matrix, list(g.promoted)) if g.multi else g.promoted[0].vetted
    return replace(g, top=top, dated=publish.next_dated(top, g.first.floating_tag,
                                                             g.cands[0].trust.vouchers))


def twin_step(run: Run, g: Going) -> Going:
    """Step `twin` (builder.flows.publish_twin)."""
    assert g.top is not None
    return replace(g, twins=promote_twins(run.matrix, g.top, [(p.vetted, p.cand)
                                                             for p in g.promoted],
                                          [g.dated[0], *g.tags], g.platform_tags, g.audits))


def sign_step(run: Run, g: Going) -> Going:
    """Step `sign`: the manifest or index, naming every tag it will carry, then its twins."""
    assert g.top is not None
    vid, trust, tags = g.first.variant.id, g.cands[0].trust, [g.dated[0], *g.tags]
    signed = publish.sign_digest(g.top, trust, sign.tag_annotations(vid, tags))
    if not signed["signed"]:
        step(f"  [{vid}] published UNSIGNED (--unsigned): no signature, no signed "
             "attestations; `builder verify --key` refuses it")
    sign_twins(g.twins, trust, vid, tags, g.platform_tags)
    return replace(g, signed=signed)


def tags_step(run: Run, g: Going) -> Going:
    """Step `tags`, last: what users and `builder plan` read."""
    assert g.top is not None
    publish.write_tags(g.top, g.first.floating_tag, g.tags, g.dated)
    zstd_tags = write_twin_tags(g.twins, [g.dated[0], *g.tags], g.platform_tags)
    if g.multi:
        step(f"  [{g.first.variant.id}] index {g.top.digest[:19]} "
             f"({', '.join(p.cand.planned.variant.platform for p in g.promoted)}) → "
             f"{g.dated[0]}, {g.first.floating_tag}")
    return replace(g, zstd_tags=tuple(zstd_tags))


def record_step(run: Run, g: Going) -> Going:
    """Step `record`: the variant's publication (published.json's entry), its result."""
    assert g.top is not None
    first, dated = g.first, g.dated[0]
    pub = publication_of(run.matrix, g.cands[0], g.top.digest, dated,
                         [dated, *(c.planned.hash_tag for c in g.cands), *first.tags],
                         g.promoted[0].refs, g.signed)
    if g.multi:
        pub = replace(pub, platforms=tuple(platform_entry(run.matrix, p) for p in g.promoted))
    if g.twins is not None:
        pub = replace(pub, zstd=ZstdTwin(g.twins.top.digest, f"{run.matrix.image_name}@"
                                         f"{g.twins.top.digest}", g.zstd_tags))
    return replace(g, results=({"id": first.variant.id, "status": "published",
                                **pub.to_json()},))


# The steps of one variant, in order; the next promotion artifact is one function and one line.
STEPS: tuple[Step, ...] = (same_tags, gate, promote, audit_step, index, twin_step, sign_step,
                           tags_step, record_step)


def already_published(known: dict[str, Publication], group: list[PlannedVariant]
                      ) -> dict[str, Any] | None:
    """The result of a variant the registry already holds with this content (every platform's
    hash) under a publication that counts (signed by a trusted key, when keys are given)."""
    vid = group[0].variant.id
    pub = known.get(vid)
    if pub is None or not tag_repair.holds(pub, group):
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
    date = clock.stamp()
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
