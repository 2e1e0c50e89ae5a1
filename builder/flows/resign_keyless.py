"""`publish` never signs a lost keyless signature again (builder.flows.resign: with a trusted
key, the `.sig` is put back from its signed copy instead).

With identities alone there is no `.sig` and no signed copy of one: the digest's bundles were
removed (the referrers index overwritten). The only name for the publication left is its dated
tag, read off the registry, where a tag planted on the digest cannot be told apart from the
genuine one: signing it would sign the attacker's tag (issue 40.3's weakness). So the loss is
said in one line and `publish` publishes the content anew, under a dated tag it assigns itself.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from builder.core import clock, keypair, oci, sign, vouch
from builder.core.output import step
from builder.flows import record, tag_repair
from builder.model import catalog_doc
from builder.model.matrix import Matrix
from builder.model.planned import PlannedVariant
from builder.model.publication import Publication


def restore(matrix: Matrix, group: Sequence[PlannedVariant], newest: Publication | None,
            vouchers: keypair.Vouchers) -> None:
    """With identities alone: say which publication of the group lost its signature (nothing is
    signed: the caller then publishes the content anew). Nothing to say when nobody is trusted."""
    if not vouchers.identities:
        return
    reg = oci.Registry(matrix.registry)
    for vid, pub in newer(matrix, group[0].floating_tag, newest):
        if vid == group[0].variant.id and tag_repair.holds(pub, group) \
                and attested_unsigned(reg, pub, vouchers):
            step(f"  [{vid}] `{pub.dated_tag}` ({pub.digest[:19]}) lost its keyless signature: "
                 "not signed again naming a tag read off the registry (a planted one cannot "
                 "be told apart); publishing the content anew")
            return


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
