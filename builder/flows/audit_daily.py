"""The daily check audits every published image afresh (issue 41.7).

Advisories appear after a publication: the audit `publish` attached says what was known then.
So `rebuild --check` audits each published platform image again (builder.flows.vuln_audit: the
image's SBOM, the one a trusted key attested, never an unsigned `.sbom` anyone with push rights
can write) and compares the findings (each vulnerability with its fixed versions and CVE ids,
the packages left unknown, each source's status) with the latest signed audit:

  unchanged     nothing is attached: the signed audit still says what is known today
  attached      the findings changed: the new report is attached to the digest and its twin,
                attested with the key (replacing the older audit's attestation) and/or keylessly
                with the job's OIDC identity (a bundle more; readers take the newest audit,
                builder.core.vouch), and so it is the newest audit the catalog shows
  not attached  the findings changed but nothing signs (no key, no identity token, or
                --dry-run): reported here only; an unsigned report would count for nobody

Only when the findings changed, not every day with a new date: a re-signed identical report
says nothing new, yet every attach is a registry write per image and platform and twin (and, as
keyless signing grows it, a bundle more in the digest's referrers, which readers cap); the
check's own output dates each day's audit (`audited_at`) and says since when it is unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from builder.core import keyless, keypair, oci, sign, vouch
from builder.core.errors import BuilderError
from builder.core.keypair import Vouchers
from builder.flows import audit_check, vuln_audit
from builder.flows.audit_check import Audit
from builder.model.publication import Publication
from builder.model.staged import Staged
from builder.stages import staging, twin

ATTACHED, UNCHANGED, NOT_ATTACHED, NOT_AUDITED = (
    "attached", "unchanged", "not attached", "not audited afresh")
NO_KEY_LINE = ("fresh audits not attached: no signing key or identity token (--key or "
               "COSIGN_PRIVATE_KEY, --identity-token or SIGSTORE_ID_TOKEN); each image keeps its "
               "latest signed audit")


def refresher(signer: keypair.Trust) -> Callable[[str, Publication, Vouchers], Audit]:
    """audit_check.audits' `one`: each image audited afresh, attached on change, signed with
    `signer`'s key and/or identity token."""
    return lambda variant, pub, vouchers: refresh(variant, pub, vouchers, signer)


def refresh(variant: str, pub: Publication, vouchers: Vouchers, signer: keypair.Trust) -> Audit:
    """The fresh audit of one published platform image, attached when its findings changed
    and `signer` signs; the signed audit (or why there is none) when it cannot be made."""
    where = audit_check.where_of(variant, pub)
    if not vouchers:
        return audit_check.audit_of(variant, pub, vouchers)
    try:
        found, problems = audit_check.attested(pub, vouchers)
    except BuilderError as exc:
        return Audit(**where, state=audit_check.UNREADABLE, detail=str(exc))
    signed = audit_check.signed_audit(where, found, problems, pub.digest)
    if "sbom" not in found:
        return replace(signed, refresh=NOT_AUDITED, refresh_detail="no signed SBOM: "
                       + problems.get("sbom", "none attested"))
    try:
        fresh = vuln_audit.report(found["sbom"].get("predicate") or {})
    except (BuilderError, OSError, ValueError) as exc:
        return replace(signed, refresh=NOT_AUDITED, refresh_detail=str(exc))
    before = audit_check.report_of(found["audit"]) if "audit" in found else None
    return replace(audit_check.of_report(where, fresh),
                   **outcome(pub, fresh, before, signer, vouchers))


def outcome(pub: Publication, fresh: dict[str, Any], before: dict[str, Any] | None,
            signer: keypair.Trust, vouchers: Vouchers) -> dict[str, str]:
    """Audit's refresh fields: unchanged, else attached and signed, else not attached."""
    since = f"the signed audit of {before.get('audited_at') or '?'}" if before else \
        "no signed audit"
    if before is not None and findings(before) == findings(fresh):
        return {"refresh": UNCHANGED, "refresh_detail": f"same findings as {since}"}
    if not signer.signs:
        return {"refresh": NOT_ATTACHED, "refresh_detail": f"the findings changed since {since}; "
                "no signing key or identity token"}
    try:
        attached = attach(pub, fresh, signer, vouchers)
    except BuilderError as exc:
        return {"refresh": NOT_ATTACHED, "refresh_detail": f"attaching failed: {exc}"}
    return {"refresh": ATTACHED, "refresh_detail": f"the findings changed since {since}: "
            f"signed and attached to {', '.join(d[:19] for d in attached)}"}


def findings(report: dict[str, Any]) -> tuple[Any, ...]:
    """What an audit found, without when or how each source answered in words: each
    vulnerability (source, package, version, id, fixed versions, CVE ids), each package left
    unknown, each source's status."""
    vulns = sorted(json.dumps([str(v.get(k) or "") for k in ("source", "name", "version", "id")]
                              + [sorted(map(str, v.get("fix_versions") or [])),
                                 sorted(map(str, v.get("aliases") or []))])
                   for v in report.get("vulnerabilities") or [] if isinstance(v, dict))
    unknown = sorted(f"{u.get('name')} {u.get('version')}"
                     for u in report.get("unknown") or [] if isinstance(u, dict))
    sources = sorted(f"{name} {s.get('status') if isinstance(s, dict) else s}"
                     for name, s in (report.get("sources") or {}).items())
    return tuple(vulns), tuple(unknown), tuple(sources)


def attach(pub: Publication, fresh: dict[str, Any], signer: keypair.Trust,
           vouchers: Vouchers) -> list[str]:
    """The fresh report attached to the image's digest and its signed zstd twin's, each
    attested with the key (as publish attaches its first audit) and/or keylessly; the digests."""
    reg = oci.Registry(pub.registry)
    targets = [staging.staged_at(reg, pub.repository, pub.digest), twin_of(reg, pub, vouchers)]
    done = []
    for staged in targets:
        if staged is not None:
            vuln_audit.attach(staged, fresh, signer.key)
            if signer.keyless is not None:
                attest_keyless(reg, staged, fresh, signer.keyless)
            done.append(staged.digest)
    if not done:
        raise BuilderError(f"`{pub.reference}` is not in the registry")
    return done


def attest_keyless(reg: oci.Registry, staged: Staged, fresh: dict[str, Any],
                   signer: keypair.KeylessSigner) -> None:
    """The report's vuln attestation as a sigstore bundle by the token's identity, listed as a
    referrer of the digest (kept beside the older ones: readers take the newest scan)."""
    ptype = sign.ATTESTED["audit"]
    statement = sign.statement(f"{reg.registry}/{staged.repository}", staged.digest, ptype,
                               staging.vuln_predicate(fresh))
    [bundle] = keyless.sign_statements(signer.token, signer.config, [statement])
    keyless.attach(reg, staged.repository, staged.digest, bundle, ptype)


def twin_of(reg: oci.Registry, pub: Publication, vouchers: Vouchers) -> Staged | None:
    """This platform's zstd twin: the digest under the twin of the dated tag, when a voucher's
    signature of it names that tag (anyone with push rights can move a tag: a report is never
    attested on a digest the publisher did not sign); in a multi-platform twin index, the
    manifest of the same platform. None when there is none."""
    tag = twin.tag_of(pub.dated_tag)
    head = reg.head(pub.repository, tag)
    if head is None or not vouch.names_tag(reg, pub.repository, head.digest, tag, vouchers):
        return None
    found = reg.manifest(pub.repository, head.digest)
    doc = json.loads(found[0]) if found else {}
    if "manifests" not in doc:
        return staging.staged_at(reg, pub.repository, head.digest)
    mine = next((p.platform for p in pub.platforms if p.digest == pub.digest), "")
    for entry in doc["manifests"]:
        platform = entry.get("platform") or {}
        if f"{platform.get('os')}/{platform.get('architecture')}" == mine:
            return staging.staged_at(reg, pub.repository, entry["digest"])
    return None
