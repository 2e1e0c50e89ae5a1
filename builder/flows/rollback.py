"""`builder publish --rollback-to <dated tag>`: a deliberate, signed rollback (issue 41.1).

Tags only move forward (builder.flows.tag_repair), so going back is its own act: the dated tag
must be a signed publication (builder.flows.record, with the trusted keys) older than the
variant's newest one. Its digest is signed again naming the tags it takes back (the floating tag
and the aliases both publications were signed for) and the rollback itself
(`dev.torch-images.rollback-to` / `rollback-from`, the newest publication's dated tag); then
those tags, and their `-zstd` twins, are moved. `verify --key` accepts a floating tag on an
older publication only through such a signature whose `rollback-from` is still the newest
publication: a hand-moved tag, or an old rollback signature after a newer publication, fails.
"""

from __future__ import annotations

from typing import Any

from builder.core import keypair, oci, sign, vouch
from builder.core.errors import UsageError
from builder.core.output import step
from builder.flows import record
from builder.model import catalog_doc
from builder.model import tags as tag_rules
from builder.model.matrix import Matrix
from builder.model.publication import Publication
from builder.stages import twin
from builder.stages.publish import sign_image_as


def rollback_to(matrix: Matrix, dated_tag: str, trust: keypair.Trust) -> dict[str, Any]:
    """Point the floating tag, aliases and twins of `dated_tag`'s variant back at it, signed;
    the result row (`status`: rolled-back)."""
    if not trust.signs:
        raise UsageError("--rollback-to needs a signing key or an OIDC token: a rollback is "
                         "signed, or it is tampering",
                         hint="give --key (or COSIGN_PRIVATE_KEY), or --identity-token (or "
                         "SIGSTORE_ID_TOKEN)")
    reg = oci.Registry(matrix.registry)
    vid, target, newest = find(matrix, dated_tag, trust.vouchers)
    moving = sorted(moving_tags(reg, matrix.repository, target, newest, trust.vouchers))
    moved = sign_and_move(reg, matrix.repository, target.digest, trust, vid,
                          [target.dated_tag, *moving], newest.dated_tag)
    held = reg.head(matrix.repository, twin.tag_of(target.dated_tag))
    if held is not None:
        moved += sign_and_move(reg, matrix.repository, held.digest, trust, vid,
                               [twin.tag_of(t) for t in [target.dated_tag, *moving]],
                               twin.tag_of(newest.dated_tag))
    step(f"  [{vid}] rolled back to `{target.dated_tag}` from `{newest.dated_tag}` (signed)")
    return {"id": vid, "status": "rolled-back", "digest": target.digest,
            "reference": target.reference, "dated_tag": target.dated_tag,
            "rollback_from": newest.dated_tag, "tags": moved}


def sign_and_move(reg: oci.Registry, repository: str, digest: str, trust: keypair.Trust,
                  vid: str, tags: list[str], since: str) -> list[str]:
    """Sign `digest` (key, OIDC token or both) as the rollback to `tags[0]` (its dated tag)
    from `since`, naming `tags`, then point the rest of `tags` (the ones that move) at it;
    those tags."""
    sign_image_as(reg, repository, digest, trust, annotations(vid, tags, tags[0], since))
    return retag(reg, repository, digest, tags[1:])


def annotations(vid: str, tags: list[str], to: str, since: str) -> dict[str, str]:
    """The rollback signature's `optional` map: the tags it names, and the rollback."""
    return {**sign.tag_annotations(vid, tags), sign.ROLLBACK_TO: to, sign.ROLLBACK_FROM: since}


def find(matrix: Matrix, dated_tag: str, vouchers: keypair.Vouchers
         ) -> tuple[str, Publication, Publication]:
    """(variant id, the publication of `dated_tag`, the variant's newest), or why not: only a
    signed dated publication older than the newest can be rolled back to."""
    if not catalog_doc.dated_key(dated_tag) or dated_tag.endswith(twin.SUFFIX):
        raise UsageError(f"--rollback-to `{dated_tag}`: not a dated tag",
                          hint="name a dated publication, `<floating>-YYYYMMDD[.n]` (the "
                          "catalog lists them)")
    for vid, pubs in record.history(matrix, vouchers).items():
        for pub in pubs:
            if pub.dated_tag == dated_tag:
                if pub is pubs[0]:
                    raise UsageError(f"--rollback-to `{dated_tag}`: it is the newest "
                                      f"publication of `{vid}`, nothing to roll back",
                                      hint="name an older dated tag of the variant")
                return vid, pub, pubs[0]
    raise UsageError(f"--rollback-to `{dated_tag}`: no publication signed by a trusted key "
                      f"in `{matrix.image_name}`",
                      hint="name a dated tag a trusted key signed (`builder verify --key` "
                      "says which do)")


def moving_tags(reg: oci.Registry, repository: str, target: Publication, newest: Publication,
                vouchers: keypair.Vouchers) -> set[str]:
    """The floating tag and aliases that both publications were signed for (never a dated
    or content tag: those never move)."""
    both = (vouch.tags_signed_by(reg, repository, target.digest, vouchers)
            & vouch.tags_signed_by(reg, repository, newest.digest, vouchers))
    return {t for t in both if not catalog_doc.dated_key(t)
            and not t.startswith(tag_rules.HASH_TAG_PREFIX) and not t.endswith(twin.SUFFIX)}


def retag(reg: oci.Registry, repository: str, digest: str, tags: list[str]) -> list[str]:
    """Point each tag at `digest`; the tags."""
    for tag in tags:
        reg.tag(repository, digest, tag)
    return tags


def signed_rollback(payloads: list[dict[str, Any]], tag: str, latest: str) -> str:
    """The dated tag a verified rollback signature (one naming `tag`, made while `latest` was
    the newest publication) rolled `tag` back to; '' when none did."""
    for payload in payloads:
        optional = payload.get("optional") or {}
        if optional.get(sign.ROLLBACK_FROM) == latest and tag in sign.signed_tags(optional):
            return str(optional.get(sign.ROLLBACK_TO) or "")
    return ""
