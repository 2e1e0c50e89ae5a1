"""A missing or overwritten `.sig` is put back by `publish` (issue 40.3).

Anyone with push rights can overwrite `sha256-<hex>.sig`: the genuine signature is gone, the
publication drops out of the record (builder.flows.record) and every `verify --key` of its tags
fails. Publishing signs a digest and attests a copy of its `.sig` layers (`sign.keep_copy`);
`publish` of the same content puts back the layers of that copy, byte for byte, and nothing
else, so nothing anyone could write becomes trusted:
  - the digest carries no valid signature at all (a tag a valid signature does not name is a
    forgery, never signed);
  - the copy is attested by a trusted key and each layer in it verifies again and signs this
    very digest;
  - the dated tag is one a layer of the copy names: a dated tag planted on the digest (any
    `<floating>-<date>.n` anyone can write) is never signed, the genuine one is found instead;
  - it is newer than the newest signed publication of the variant (never a rollback), and its
    labels name the variant and the content hashes this checkout publishes.
The zstd twin's `.sig` is put back from the twin's own signed copy. Then `publish` goes on as
for any publication it already holds (builder.flows.tag_repair); `rebuild --check` reports a
signature `lost` so (builder.flows.rebuild_check, `tag-drift`).

A publication trusted by identity alone (no trusted key: no `.sig`, no copy) whose sigstore
bundles were removed is never signed again (`say_lost_keyless`): its only name left is a
dated tag read off the registry, where a planted one cannot be told apart. It is said in one
line, and `publish` publishes the content anew under a dated tag it assigns.
"""

from __future__ import annotations

import json
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

NOT_NAMED = ("the signed copy of its digest's signature does not name it: not signed (a tag "
             "read off the registry never is)")


def restore(matrix: Matrix, group: Sequence[PlannedVariant], newest: Publication | None,
            vouchers: keypair.Vouchers) -> Publication | None:
    """The group's publication whose signature was lost, its `.sig` put back from its signed
    copy (and its twin's); None when there is none, and always with identities alone
    (say_lost_keyless: nothing is signed anew)."""
    if not vouchers.keys:
        say_lost_keyless(matrix, group, newest, vouchers)
        return None
    found = lost(matrix, group[0].floating_tag, group[0].variant.id, newest, vouchers)
    if found is None or not tag_repair.holds(found[0], group):
        return None
    pub, layers = found
    reg = oci.Registry(matrix.registry)
    sign.reattach(reg, pub.repository, pub.digest, layers)
    step(f"  [{group[0].variant.id}] re-attached the signature of {pub.digest[:19]} as "
         f"`{pub.dated_tag}` from its signed copy: its .sig was missing or did not verify")
    restore_twin(reg, pub, vouchers)
    return replace(pub, signed=True)


def lost(matrix: Matrix, floating: str, vid: str, newest: Publication | None,
         vouchers: keypair.Vouchers) -> tuple[Publication, list[sign.Layer]] | None:
    """The newest publication of `vid` after `newest` whose digest carries no valid signature
    while a signed copy of its `.sig` names its dated tag, with the layers to put back."""
    if not vouchers.keys:
        return None
    reg = oci.Registry(matrix.registry)
    for found, pub in newer(matrix, floating, newest):
        if found != vid or \
                not unsigned(reg, pub.repository, pub.digest, vouchers):
            continue
        layers = copied(reg, pub.repository, pub.digest, vouchers)
        if pub.dated_tag in named(layers):
            return pub, layers
        if layers:  # a tag planted on a signed publication: said (no copy at all is silent)
            step(f"  `{pub.dated_tag}` ({pub.digest[:19]}): {NOT_NAMED}")
    return None


def lost_line(pub: Publication) -> str:
    """`rebuild --check`'s finding for a publication `lost` returned."""
    return (f"`{pub.dated_tag}` ({pub.digest[:19]}) lost its signature "
            f"(`{sign.sig_tag(pub.digest)}` is missing or does not verify): `builder publish` "
            "re-attaches it from its signed copy")


def lost_data(pub: Publication) -> dict[str, str]:
    """The finding's data: the `.sig` tag as the tag drifted, the digest it should sign."""
    return {"tag": sign.sig_tag(pub.digest), "old": "", "new": pub.digest}


def copied(reg: oci.Registry, repository: str, digest: str, vouchers: keypair.Vouchers
           ) -> list[sign.Layer]:
    """The layers of the signed copy of `digest`'s `.sig` that verify again ([] if none)."""
    found, _ = vouch.attestations(reg, repository, digest, vouchers)
    statement = found.get("signatures")
    return sign.copied_layers(statement, f"{reg.registry}/{repository}", digest,
                              list(vouchers.keys)) if statement else []


def named(layers: Sequence[sign.Layer]) -> set[str]:
    """The tags the (verified) payloads of `layers` name."""
    return {tag for x in layers for tag in sign.signed_tags(json.loads(x.data).get("optional"))}


def restore_twin(reg: oci.Registry, pub: Publication, vouchers: keypair.Vouchers) -> None:
    """Put the `.sig` of the twin under the dated `-zstd` tag back from the twin's signed copy
    when it is lost too and the copy names that tag (nothing else is put back)."""
    tag = twin.tag_of(pub.dated_tag)
    head = reg.head(pub.repository, tag)
    if head is None or not unsigned(reg, pub.repository, head.digest, vouchers):
        return
    layers = copied(reg, pub.repository, head.digest, vouchers)
    if tag not in named(layers):
        step(f"  `{tag}` ({head.digest[:19]}): {NOT_NAMED}; the next publication makes a new "
             "twin")
        return
    sign.reattach(reg, pub.repository, head.digest, layers)
    step(f"  re-attached the signature of {head.digest[:19]} as `{tag}` from its signed copy")


def say_lost_keyless(matrix: Matrix, group: Sequence[PlannedVariant], newest: Publication | None,
                     vouchers: keypair.Vouchers) -> None:
    """With identities alone: say which publication of the group lost its signature. Nothing is
    signed (its only name left is a dated tag read off the registry, where a planted one cannot
    be told apart): the caller publishes the content anew. Nothing to say when nobody is
    trusted."""
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
