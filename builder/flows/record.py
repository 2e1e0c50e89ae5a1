"""The publication record, read from the registry alone: what `publish`, `rebuild --check` and
`rebuild` know about what was published. Nothing from a checkout or `.state/` (published.json is
a report, never read): two runners, or a runner and a laptop, see the same history.

The vetted repository's tags say it: each dated tag `<floating>-YYYYMMDD[.n]` (the catalog's
grammar, `model.catalog_doc.dated_key`) is one publication of the digest it names; that digest's
config labels name the variant and its content hash, and its evidence hangs off
`sha256-<hex>.sbom|smoke|provenance`, cosign's `.sig` and the sigstore bundles listed in
`sha256-<hex>`. With trusted keys or identities (`keypair.Vouchers`), a dated tag is a
publication only when a signature of its digest by one of them (a key's `.sig`, an identity's
image bundle: builder.core.vouch) names that very tag and the variant the digest's labels name
(push rights are not trust: anyone may write a tag); else the next older one counts. A date
after today (UTC) is never a publication.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from builder.core import clock, keyless, labels, oci, sign, vouch
from builder.core.keypair import NOBODY, Vouchers
from builder.core.output import step
from builder.model import catalog_doc, tags
from builder.model.matrix import Matrix
from builder.model.publication import Artifact, PlatformEntry, Publication

EVIDENCE = {"sbom": "sbom", "smoke_report": "smoke", "provenance": "provenance"}


@dataclass(frozen=True)
class Dated:
    """One dated tag of the vetted repository."""

    tag: str
    floating: str
    date: str
    n: int

    @property
    def order(self) -> tuple[str, int]:
        return self.date, self.n


def dated_tags(all_tags: Iterable[str]) -> list[Dated]:
    """The dated tags among a repository's tags, newest first."""
    found = [Dated(tag, *key) for tag in all_tags if (key := catalog_doc.dated_key(tag))]
    return sorted(found, key=lambda d: d.order, reverse=True)


def latest(matrix: Matrix, vouchers: Vouchers = NOBODY) -> dict[str, Publication]:
    """variant id → its newest publication in the matrix's vetted repository (with `vouchers`:
    the newest whose signature by one of them names its dated tag and its variant)."""
    return {vid: pubs[0] for vid, pubs in history(matrix, vouchers).items()}


def history(matrix: Matrix, vouchers: Vouchers = NOBODY) -> dict[str, list[Publication]]:
    """variant id → its publications, newest first (publication order: date, then suffix),
    each counted as `latest` counts it; keyed on the verified variant, never the tag's text."""
    reg = oci.Registry(matrix.registry)
    all_tags = reg.tags(matrix.repository)
    out: dict[str, list[Publication]] = {}
    for dated in current(dated_tags(all_tags)):
        vid, pub = read_publication(reg, matrix, dated, all_tags)
        if pub is None or not vid:
            continue
        if vouchers and (why := record_problem(reg, matrix.repository, pub.digest, dated.tag,
                                               vid, vouchers)):
            step(f"  {dated.tag}: not part of the record: {why}")
            continue
        out.setdefault(vid, []).append(pub)
    return dict(sorted(out.items()))


def current(found: list[Dated]) -> list[Dated]:
    """The dated tags not after today (UTC), with a warning for each later one: a tag dated
    in the future would otherwise stay "newest" for years."""
    now = clock.stamp()  # the command's day (one clock, read once at its start)
    for dated in found:
        if dated.date > now:
            step(f"warning: `{dated.tag}` is dated after today ({now}, UTC): ignored")
    return [d for d in found if d.date <= now]


def signed_for(reg: oci.Registry, repository: str, digest: str, vouchers: Vouchers
               ) -> tuple[set[str], set[str], str]:
    """The tags and variants the trusted keys and identities signed for a digest, or why
    there are none."""
    try:
        payloads = vouch.payloads(reg, repository, digest, vouchers)
    except sign.SignatureError as exc:
        return set(), set(), ("its signature does not verify against the trusted keys or "
                              f"identities ({exc})")
    optional = [p.get("optional") or {} for p in payloads]
    return (set().union(*(sign.signed_tags(o) for o in optional)),
            {str(o.get(sign.VARIANT_ANNOTATION)) for o in optional}, "")


def record_problem(reg: oci.Registry, repository: str, digest: str, tag: str, vid: str,
                   vouchers: Vouchers) -> str:
    """Why `tag` on `digest` is not a publication of variant `vid` ('' when a trusted key or
    identity signed that very tag, for that variant)."""
    tags_signed, variants, why = signed_for(reg, repository, digest, vouchers)
    if why:
        return why
    if tag not in tags_signed:
        return f"no trusted signature of {digest[:19]} names `{tag}`"
    if vid not in variants:
        return f"no trusted signature of {digest[:19]} names its variant `{vid}`"
    return ""


def read_publication(reg: oci.Registry, matrix: Matrix, dated: Dated, all_tags: list[str]
                     ) -> tuple[str, Publication | None]:
    """The variant id and publication a dated tag names, rebuilt from the digest and its
    attached evidence (None when it is not an image this pipeline published)."""
    found = reg.manifest(matrix.repository, dated.tag)
    if found is None:
        return "", None
    body, desc = found
    doc = json.loads(body)
    entries: list[PlatformEntry] = []
    if "manifests" in doc:
        for item in doc["manifests"]:
            name = catalog_doc.platform_name(item)
            entry = platform_entry(reg, matrix, name, item["digest"], all_tags)
            if entry is not None:
                entries.append(entry)
        if not entries:
            return "", None
        first = image_facts(reg, matrix, entries[0].digest, all_tags)
    else:
        first = image_facts(reg, matrix, desc.digest, all_tags)
    if first is None:
        return "", None
    return (first["labels"].get(labels.VARIANT, ""),
            publication_of(matrix, dated, desc.digest, first, tuple(entries), all_tags))


def image_facts(reg: oci.Registry, matrix: Matrix, digest: str,
                all_tags: list[str]) -> dict[str, Any] | None:
    """A platform manifest's config id, labels and evidence artifacts."""
    found = reg.manifest(matrix.repository, digest)
    if found is None:
        return None
    config_digest = (json.loads(found[0]).get("config") or {}).get("digest", "")
    config = json.loads(reg.blob(matrix.repository, config_digest)) if config_digest else {}
    found_labels = (config.get("config") or {}).get("Labels") or {}
    if not found_labels.get(labels.CONTENT_HASH):
        return None
    artifacts = {name: artifact(reg, matrix, digest, kind, all_tags)
                 for name, kind in EVIDENCE.items()}
    return {"digest": digest, "image_id": config_digest, "labels": found_labels, **artifacts}


def artifact(reg: oci.Registry, matrix: Matrix, subject: str, kind: str,
             all_tags: list[str]) -> Artifact | None:
    tag = oci.artifact_tag(subject, kind)
    if tag not in all_tags:
        return None
    found = reg.head(matrix.repository, tag)
    if found is None:
        return None
    return Artifact(tag, found.digest, found.media_type,
                    f"{matrix.registry}/{matrix.repository}@{found.digest}")


def platform_entry(reg: oci.Registry, matrix: Matrix, name: str, digest: str,
                   all_tags: list[str]) -> PlatformEntry | None:
    facts = image_facts(reg, matrix, digest, all_tags)
    if facts is None or facts["sbom"] is None or facts["smoke_report"] is None:
        return None
    found = facts["labels"]
    content = found.get(labels.CONTENT_HASH, "")
    return PlatformEntry(
        platform=name, digest=digest, sbom=facts["sbom"], smoke_report=facts["smoke_report"],
        reference=f"{matrix.registry}/{matrix.repository}@{digest}",
        image_id=facts["image_id"], content_hash=content,
        hash_tag=tags.HASH_TAG_PREFIX + content[:20], cuda=found.get(labels.CUDA) or None,
        cudnn=found.get(labels.CUDNN) or None, nccl=found.get(labels.NCCL) or None,
        min_driver=found.get(labels.MIN_DRIVER) or None, provenance=facts["provenance"])


def publication_of(matrix: Matrix, dated: Dated, digest: str, first: dict[str, Any],
                   entries: tuple[PlatformEntry, ...], all_tags: list[str]) -> Publication:
    found = first["labels"]
    content = found.get(labels.CONTENT_HASH, "")
    hash_tag = tags.HASH_TAG_PREFIX + content[:20]
    empty = Artifact("", "", "", "")
    signed = sign.sig_tag(digest) in all_tags or keyless.referrers_tag(digest) in all_tags
    return Publication(
        date=f"{dated.date[:4]}-{dated.date[4:6]}-{dated.date[6:]}", published_at="",
        registry=matrix.registry, repository=matrix.repository, digest=digest,
        reference=f"{matrix.registry}/{matrix.repository}@{digest}",
        image_id=first["image_id"], content_hash=content,
        tags=tuple(t for t in (dated.tag, dated.floating, hash_tag) if t in all_tags),
        dated_tag=dated.tag, hash_tag=hash_tag, floating_tag=dated.floating, aliases=(),
        torch=found.get(labels.TORCH), python=found.get(labels.PYTHON),
        accelerator=found.get(labels.ACCELERATOR, ""), cuda=found.get(labels.CUDA) or None,
        cudnn=found.get(labels.CUDNN) or None, nccl=found.get(labels.NCCL) or None,
        min_driver=found.get(labels.MIN_DRIVER) or None, flavor=found.get(labels.FLAVOR, ""),
        sbom=first["sbom"] or empty, smoke_report=first["smoke_report"] or empty,
        provenance=first["provenance"], signed=signed, platforms=entries)
