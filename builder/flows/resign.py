"""A missing or overwritten `.sig` is put back by `publish` (issue 40.3).

Anyone with push rights can overwrite `sha256-<hex>.sig` (or the referrers index of its
sigstore bundles): the genuine signature is gone, the publication drops out of the record
(builder.flows.record) and every `verify` of its tags fails. `publish` of the same content,
with the key, an OIDC token (a sigstore bundle of the image, `--identity-token`) or both,
finds such a dated tag and signs its digest again, naming the tags it carries, but only from
verified evidence, so nothing anyone could write becomes trusted:
  - its digest carries no valid signature at all (a tag a valid signature does not name is a
    forgery, never signed);
  - its labels name the variant and the very content hashes this checkout publishes;
  - its SBOM, smoke report and provenance attestations verify against the trusted keys (the
    pipeline promoted that digest);
  - it is newer than the newest signed publication of the variant (never a rollback).
The zstd twin under its `-zstd` dated tag is signed again only when it is the twin made afresh
(builder.stages.twin, deterministic). Then `publish` goes on as for any publication it already
holds (builder.flows.tag_repair).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from builder.core import clock, keypair, oci, sign, vouch
from builder.core.output import step
from builder.flows import record, tag_repair
from builder.model import catalog_doc
from builder.model.matrix import Matrix
from builder.model.planned import PlannedVariant
from builder.model.publication import Publication
from builder.stages import twin
from builder.stages.publish import sign_image_as


def restore(matrix: Matrix, group: Sequence[PlannedVariant], newest: Publication | None,
            tags: Sequence[str], trust: keypair.Trust) -> Publication | None:
    """The group's publication whose signature was lost, signed again naming its dated tag and
    `tags` (content tag, floating, aliases), with the key, an OIDC token or both; None when
    there is none, or nothing to sign with."""
    if not trust.signs:
        return None
    reg = oci.Registry(matrix.registry)
    all_tags = reg.tags(matrix.repository)
    floor = (catalog_doc.dated_key(newest.dated_tag) if newest else None) or ("", "", -1)
    for dated in record.dated_tags(all_tags):
        if dated.floating != group[0].floating_tag or dated.date > clock.stamp() \
                or dated.order <= floor[1:]:
            continue
        vid, pub = record.read_publication(reg, matrix, dated, all_tags)
        if pub is not None and vid == group[0].variant.id and tag_repair.holds(pub, group) \
                and lost(reg, pub, trust.vouchers):
            signed = [dated.tag, *tags]
            sign_image_as(reg, pub.repository, pub.digest, trust,
                          sign.tag_annotations(vid, signed))
            step(f"  [{vid}] signed {pub.digest[:19]} again as `{dated.tag}`: its signature "
                 "was missing or did not verify; its attested evidence does")
            resign_twin(reg, pub, vid, signed, trust)
            return replace(pub, signed=True)
    return None


def lost(reg: oci.Registry, pub: Publication, vouchers: keypair.Vouchers) -> bool:
    """Whether the digest has no valid signature by the trusted keys and identities while its
    SBOM, smoke report and provenance attestations are vouched for by them."""
    if not unsigned(reg, pub.repository, pub.digest, vouchers):
        return False
    found, _ = vouch.attestations(reg, pub.repository, pub.digest, vouchers)
    return set(sign.PREDICATES) <= set(found)


def unsigned(reg: oci.Registry, repository: str, digest: str, vouchers: keypair.Vouchers
             ) -> bool:
    """Whether no signature of `digest` verifies against the trusted keys and identities."""
    return bool(record.signed_for(reg, repository, digest, vouchers)[2])


def resign_twin(reg: oci.Registry, pub: Publication, vid: str, tags: Sequence[str],
                trust: keypair.Trust) -> None:
    """Sign the twin under the dated `-zstd` tag again when its signature is gone too and it is
    the twin `twin.make` gives (nothing else is signed)."""
    head = reg.head(pub.repository, twin.tag_of(pub.dated_tag))
    if head is None or not trust.signs or \
            not unsigned(reg, pub.repository, head.digest, trust.vouchers):
        return
    if twin.make(reg, pub.repository, pub.digest).digest != head.digest:
        step(f"  [{vid}] `{twin.tag_of(pub.dated_tag)}` is not the twin of {pub.digest[:19]}: "
             "not signed (the next publication makes a new one)")
        return
    sign_image_as(reg, pub.repository, head.digest, trust,
                  sign.tag_annotations(vid, [twin.tag_of(t) for t in tags]))
