"""`publish` signs a lost signature again with an OIDC token where only identities are trusted
(builder.flows.resign: with a trusted key, the `.sig` is put back from its signed copy instead).

With identities alone there is no `.sig` and no signed copy of one: the digest's bundles were
removed (the referrers index overwritten). It is signed again naming the dated tag found on it
and this checkout's tags, only when no trusted signature verifies and its SBOM, smoke report and
provenance attestations do, and it is newer than the newest signed publication. The dated tag is
read off the registry: a tag planted on the digest could be the one named (issue 40.3's
weakness, closed for key-signed publications only).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
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
    """With identities alone: the group's publication whose signature was lost, signed again
    with the OIDC token naming its dated tag and `tags`; None when there is none, or no token."""
    if not trust.signs:
        return None
    reg = oci.Registry(matrix.registry)
    for vid, pub in newer(matrix, group[0].floating_tag, newest):
        if vid == group[0].variant.id and tag_repair.holds(pub, group) \
                and attested_unsigned(reg, pub, trust.vouchers):
            signed = [pub.dated_tag, *tags]
            sign_image_as(reg, pub.repository, pub.digest, trust,
                          sign.tag_annotations(vid, signed))
            step(f"  [{vid}] signed {pub.digest[:19]} again as `{pub.dated_tag}`: its "
                 "signature was missing or did not verify; its attested evidence does")
            resign_twin(reg, pub, vid, signed, trust)
            return replace(pub, signed=True)
    return None


def newer(matrix: Matrix, floating: str, newest: Publication | None
          ) -> Iterator[tuple[str, Publication]]:
    """(variant id, publication) of each dated tag of `floating` after `newest` and not after
    today, newest first, as the tag reads: nothing about its signature is checked here."""
    reg = oci.Registry(matrix.registry)
    all_tags = reg.tags(matrix.repository)
    floor = (catalog_doc.dated_key(newest.dated_tag) if newest else None) or ("", "", -1)
    for dated in record.dated_tags(all_tags):
        if dated.floating == floating and dated.date <= clock.stamp() \
                and dated.order > floor[1:]:
            vid, pub = record.read_publication(reg, matrix, dated, all_tags)
            if pub is not None:
                yield vid, pub


def attested_unsigned(reg: oci.Registry, pub: Publication, vouchers: keypair.Vouchers) -> bool:
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
