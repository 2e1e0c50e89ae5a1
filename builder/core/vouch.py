"""Whether what a registry holds for a digest is vouched for: by a trusted key (cosign's
`.sig`/`.att`, builder.core.sign) or by a trusted workflow identity (sigstore bundles attached as
referrers, builder.core.keyless). Anyone with push rights can write either; only a signature by
one of the run's `keypair.Vouchers` counts. Every reader that decides on signatures (the publish
gate, the registry record, `rebuild --check`, the signed base and cache, the catalog) asks here,
so a key and an identity are accepted the same way everywhere.

An identity-signed publication names its tags as a key-signed one does: the image statement's
predicate (cosign's `https://sigstore.dev/cosign/sign/v1`) carries the same `optional` map as
the simple-signing payload (`variant`, `tag:<TAG>: signed`, a rollback's annotations), so a
payload read here has one shape whichever signed it.
"""

from __future__ import annotations

from typing import Any

from builder.core import keyless, keypair, oci, sign
from builder.core.keypair import Vouchers
from builder.core.sign import SignatureError


def policy(vouchers: Vouchers) -> keyless.KeylessPolicy:
    """The keyless half of `vouchers`, as keyless.verify takes it."""
    root = vouchers.trusted_root or keyless.PUBLIC_GOOD_ROOT
    return keyless.KeylessPolicy(vouchers.identities, root)


def describe(vouchers: Vouchers) -> str:
    """The trusted keys and identities, for messages: `the trusted key 1a2b…`, `the trusted
    identity https://…/build.yml@refs/heads/main (https://token.actions…)`, or both."""
    named = []
    if keys := vouchers.keys:
        named.append(f"the trusted key{'s' * (len(keys) > 1)} "
                     + ", ".join(keypair.key_id(k) for k in keys))
    if found := vouchers.identities:
        named.append(f"the trusted identit{'ies' if len(found) > 1 else 'y'} "
                     + ", ".join(x.describe() for x in found))
    return " or ".join(named) or "nobody"


def payloads(reg: oci.Registry, repository: str, digest: str, vouchers: Vouchers
             ) -> list[dict[str, Any]]:
    """Every signature of `registry/repository@digest` a voucher made, as a simple-signing
    payload (its `optional` map: variant, tags): the `.sig` payloads a trusted key signed and
    the image statements (cosign's image predicate) a trusted identity signed. SignatureError
    naming why when none verifies ("published unsigned" when nothing is attached)."""
    found, problems = [], []
    if vouchers.keys:
        try:
            found += sign.verified_payloads(reg, repository, digest, list(vouchers.keys))
        except SignatureError as exc:
            problems.append(str(exc))
    if vouchers.identities:
        signed, refused = identity_payloads(reg, repository, digest, policy(vouchers))
        found += signed
        problems += refused or ([] if signed else ["no image bundle by a trusted identity"])
    if not found:
        raise SignatureError("; ".join(problems) or "no trusted key or identity to verify with")
    return found


def identity_payloads(reg: oci.Registry, repository: str, digest: str,
                      trusted: keyless.KeylessPolicy) -> tuple[list[dict[str, Any]], list[str]]:
    """The payload shape of each image bundle a trusted identity signed that names this
    repository, and why the other bundles do not count."""
    good, refused = keyless.checked(reg, repository, digest, trusted)
    name = f"{reg.registry}/{repository}"
    found = []
    for statement, _signer in good:
        if statement.get("predicateType") != keyless.IMAGE_PREDICATE:
            continue
        if name not in [x.get("name") for x in statement.get("subject") or []
                        if isinstance(x, dict)]:
            refused.append(f"a bundle naming another repository, not {name}")
            continue
        predicate = statement.get("predicate")
        optional = predicate.get("optional") if isinstance(predicate, dict) else None
        found.append({"optional": optional if isinstance(optional, dict) else None})
    return found, refused


def tags_signed_by(reg: oci.Registry, repository: str, digest: str, vouchers: Vouchers
                   ) -> set[str]:
    """The tags the vouchers' signatures of `digest` name (SignatureError when none verifies)."""
    return {tag for p in payloads(reg, repository, digest, vouchers)
            for tag in sign.signed_tags(p.get("optional"))}


def names_tag(reg: oci.Registry, repository: str, digest: str, tag: str,
              vouchers: Vouchers) -> bool:
    """Whether a voucher's signature of `digest` names `tag` (a tag anyone with push rights
    could have written counts only then)."""
    try:
        return tag in tags_signed_by(reg, repository, digest, vouchers)
    except SignatureError:
        return False


def verify_image(reg: oci.Registry, repository: str, digest: str, vouchers: Vouchers) -> str:
    """A line for a table when a voucher signed `digest`; SignatureError naming why not. A
    key's `.sig` is checked once: its line when it verifies, else every voucher (`payloads`)."""
    if vouchers.keys and sign.read_layers(reg, repository, sign.sig_tag(digest)):
        try:
            return sign.verify_image(reg, repository, digest, list(vouchers.keys))
        except SignatureError:
            pass  # an identity may vouch instead
    payloads(reg, repository, digest, vouchers)
    by = describe(Vouchers(identities=vouchers.identities))
    return f"sigstore bundle over {digest[:19]} by {by}"


def attestations(reg: oci.Registry, repository: str, digest: str, vouchers: Vouchers
                 ) -> tuple[dict[str, Any], dict[str, str]]:
    """(evidence kind → its statement attested by a voucher, kind → why none is) for every
    kind in sign.PREDICATES (and an audit's when one is attested): a key's `.att` first, then
    the bundles of a trusted identity."""
    found: dict[str, Any] = {}
    problems: dict[str, str] = {}
    if vouchers.keys:
        found, problems = sign.verified_attestations(reg, repository, digest,
                                                     list(vouchers.keys))
    if vouchers.identities:
        statements, refused = identity_statements(reg, repository, digest, vouchers)
        for kind, predicate_type in sign.ATTESTED.items():
            if kind in found:
                continue
            if predicate_type in statements:
                found[kind] = statements[predicate_type]
                problems.pop(kind, None)
            elif kind in sign.PREDICATES:
                problems[kind] = _joined(problems.get(kind), _why_not(kind, refused))
    for kind in sign.PREDICATES:
        if kind not in found and kind not in problems:
            problems[kind] = "no trusted key or identity to verify with"
    return found, problems


def identity_statements(reg: oci.Registry, repository: str, digest: str, vouchers: Vouchers
                        ) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """predicate type → the statement a trusted identity attested (the first listed; of audits
    the newest scan: bundles are only ever added, and the daily check adds one when the
    findings change, builder.flows.audit_daily), and one reason per bundle refused."""
    good, refused = keyless.checked(reg, repository, digest, policy(vouchers))
    audit = sign.ATTESTED["audit"]
    chosen: dict[str, dict[str, Any]] = {}
    for statement, _signer in good:
        ptype = str(statement.get("predicateType"))
        newer = ptype == audit and ptype in chosen and _scanned(statement) > _scanned(
            chosen[ptype])
        if ptype not in chosen or newer:
            chosen[ptype] = statement
    return chosen, refused


def _scanned(statement: dict[str, Any]) -> str:
    """When an attested audit was made (its vuln predicate's scanFinishedOn, ISO 8601 UTC)."""
    return str(((statement.get("predicate") or {}).get("metadata") or {}).get("scanFinishedOn")
               or "")


def _why_not(kind: str, refused: list[str]) -> str:
    return (f"no keyless {kind} attestation by a trusted identity"
            + (f" (refused: {refused[0]})" if refused else ""))


def _joined(*reasons: str | None) -> str:
    return "; ".join(x for x in reasons if x)
