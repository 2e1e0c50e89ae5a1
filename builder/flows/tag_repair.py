"""Tags only move forward, and what moved them back is put right (issues 40.3 and 41.1).

`publish` (and `rebuild`, which publishes through it) reads each variant's signed publications,
newest first (builder.flows.record.history). Content the newest one holds is already published:
its floating tag, aliases and their zstd twins are re-pointed at it when an attacker or a
mistake moved them (each move printed), unless a trusted key signed that move back as a
rollback from that newest publication (builder.flows.rollback). Content only an *older*
signed publication holds is a checkout behind the registry: refused in one line, so a stale
lock never rolls a tag back.
"""

from __future__ import annotations

from collections.abc import Sequence

from builder.core import oci, sign, vouch
from builder.core.errors import GateRefused
from builder.core.keypair import NOBODY, Vouchers
from builder.core.output import step
from builder.flows import rollback
from builder.model.planned import PlannedVariant
from builder.model.publication import Publication
from builder.stages import twin


def holds(pub: Publication, group: Sequence[PlannedVariant]) -> bool:
    """Whether a publication holds every platform's content hash of the variant."""
    held = {pub.content_hash, *(e.content_hash for e in pub.platforms)}
    return all(p.content_hash in held for p in group)


def refuse_older(pubs: Sequence[Publication], group: Sequence[PlannedVariant]) -> None:
    """GateRefused when the group's content is an older signed publication than the newest
    (`pubs`, newest first): publishing it would point the floating tag back."""
    older = next((pub for pub in pubs[1:] if holds(pub, group)), None)
    if older is None or not pubs or holds(pubs[0], group):
        return
    newest = pubs[0]
    raise GateRefused(
        f"{group[0].variant.id}: this checkout builds the publication `{older.dated_tag}`, "
        f"older than the newest signed publication `{newest.dated_tag}` "
        f"({newest.digest[:19]}): no tag was moved",
        hint=f"your lock is older than what the registry published on {newest.date}: update "
        "the checkout (a deliberate rollback is `builder publish --rollback-to "
        f"{older.dated_tag}`)")


def drift(reg: oci.Registry, pub: Publication, moving: Sequence[str],
          vouchers: Vouchers = NOBODY) -> list[tuple[str, str, str]]:
    """Each of `moving` (floating tag, aliases) and its `-zstd` twin that points elsewhere than
    `pub` (and its twin): (tag, the digest it holds or '', the digest it should hold). With
    `vouchers`, only a tag a trusted key or identity signed for that digest counts (the only
    tags `repair` may move, so a drift reported is a drift `publish` puts right)."""
    repo = pub.repository
    twin_head = reg.head(repo, twin.tag_of(pub.dated_tag))
    targets = [(tag, pub.digest) for tag in moving]
    if twin_head is not None:
        targets += [(twin.tag_of(tag), twin_head.digest) for tag in moving]
    found = []
    for tag, digest in targets:
        head = reg.head(repo, tag)
        if head is not None and head.digest == digest:
            continue
        if vouchers and not vouch.names_tag(reg, repo, digest, tag, vouchers):
            continue
        newest = twin.tag_of(pub.dated_tag) if tag.endswith(twin.SUFFIX) else pub.dated_tag
        if vouchers and head is not None and kept_rollback(reg, repo, head.digest, tag, newest,
                                                           vouchers):
            continue
        found.append((tag, head.digest if head else "", digest))
    return found


def repair(reg: oci.Registry, pub: Publication, moving: Sequence[str],
           vouchers: Vouchers = NOBODY) -> list[str]:
    """Point each tag that drifted from `pub` (`drift`) back at it; the tags moved."""
    moved = []
    for tag, was, digest in drift(reg, pub, moving, vouchers):
        reg.tag(pub.repository, digest, tag)
        step(f"  moved `{tag}` from {was[:19] or 'nothing'} to {digest[:19]} (the newest signed "
             f"publication, `{pub.dated_tag}`)")
        moved.append(tag)
    return moved


def kept_rollback(reg: oci.Registry, repo: str, digest: str, tag: str, newest: str,
                  vouchers: Vouchers) -> bool:
    """Whether `tag` on `digest` is a signed rollback from the newest publication `newest`
    (a deliberate act, kept; printed)."""
    try:
        payloads = vouch.payloads(reg, repo, digest, vouchers)
    except sign.SignatureError:
        return False
    to = rollback.signed_rollback(payloads, tag, newest)
    if to:
        step(f"  kept `{tag}` on {digest[:19]}: a signed rollback to `{to}` from `{newest}`")
    return bool(to)
