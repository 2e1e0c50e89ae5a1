"""What the daily `rebuild --check` says of each publication's vulnerability audit (issue 41.7).

The check job holds no key and pushes nothing, so it neither audits afresh nor attaches: it
reads the latest publication's signed audit (`publish` attests one by default, cosign's vuln
predicate on each platform digest; `builder audit --attach` refreshes it) and reports the
vulnerabilities it lists with a fixed version. So a CVE with a fix is in the daily job's output
(one warning annotation per row, rebuild.yml) and in the `--json` the tracking issue quotes.
Only an audit a trusted key attested counts: an unsigned `.audit` is what anyone with push
rights can write. The audit is as of its `audited_at`: newer advisories need a new audit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from builder.core import oci, sign, vouch
from builder.core.errors import BuilderError
from builder.core.keypair import Vouchers
from builder.model.matrix import Variant
from builder.model.publication import Publication

AUDITED, NOT_AUDITED, UNREADABLE, NO_KEY = "audited", "not audited", "unreadable", "no key"


@dataclass(frozen=True, kw_only=True)
class Audit:
    """The latest signed audit of one published platform image, as the check reports it."""

    variant: str  # the variant's key (its id, `.linux-arm64` off amd64)
    reference: str
    dated_tag: str
    state: str  # AUDITED, NOT_AUDITED, UNREADABLE or NO_KEY
    detail: str = ""
    audited_at: str = ""
    vulnerabilities: int = 0
    unknown: int = 0
    fixes: tuple[dict[str, Any], ...] = ()  # the vulnerabilities with a fixed version

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "fixes": list(self.fixes)}


def audits(pubs: Mapping[str, Publication], variants: Sequence[Variant],
           vouchers: Vouchers) -> list[Audit]:
    """The audit of each selected variant's latest publication (`pubs`: variant id → its
    latest, rebuild_check.latest_publications), per platform."""
    found = []
    for v in variants:
        latest = pubs.get(v.id)
        pub = latest.for_platform(v.platform) if latest else None
        if pub is not None:
            found.append(audit_of(v.key, pub, vouchers))
    return found


def audit_of(variant: str, pub: Publication, vouchers: Vouchers) -> Audit:
    """The audit a trusted key or identity attested on `pub`'s digest (vouch.attestations, as
    every other reader of evidence), or why there is none to report."""
    where = {"variant": variant, "reference": pub.reference, "dated_tag": pub.dated_tag}
    if not vouchers:
        return Audit(**where, state=NO_KEY, detail="no trusted key or identity (--trust-key, "
                     "--certificate-identity): an unsigned audit is not read")
    try:
        found, problems = vouch.attestations(oci.Registry(pub.registry), pub.repository,
                                             pub.digest, vouchers)
    except BuilderError as exc:
        return Audit(**where, state=UNREADABLE, detail=str(exc))
    if "audit" not in found:
        return Audit(**where, state=NOT_AUDITED, detail=problems.get(
            "audit", f"no signed audit ({sign.att_tag(pub.digest)})"))
    report = ((found["audit"].get("predicate") or {}).get("scanner") or {}).get("result") or {}
    vulns = [v for v in report.get("vulnerabilities") or [] if isinstance(v, dict)]
    return Audit(**where, state=AUDITED, audited_at=str(report.get("audited_at") or ""),
                 vulnerabilities=len(vulns), unknown=len(report.get("unknown") or []),
                 fixes=tuple(fix_of(v) for v in vulns if v.get("fix_versions")))


def fix_of(vuln: dict[str, Any]) -> dict[str, Any]:
    """One row: the advisory, the package and version in the image, the fixed versions."""
    return {"id": str(vuln.get("id") or ""), "package": str(vuln.get("name") or ""),
            "version": str(vuln.get("version") or ""),
            "fixed": [str(v) for v in vuln.get("fix_versions") or []],
            "aliases": [str(a) for a in vuln.get("aliases") or []]}


def lines(found: Sequence[Audit]) -> list[str]:
    """The check's human report: one line per image, one per vulnerability with a fix."""
    out = []
    for a in found:
        if a.state != AUDITED:
            out.append(f"audit of {a.variant}: {a.state}: {a.detail}")
            continue
        out.append(f"audit of {a.variant} (`{a.dated_tag}`, audited {a.audited_at or '?'}): "
                   f"{a.vulnerabilities} vulnerabilities, {len(a.fixes)} with a fix, "
                   f"{a.unknown} packages unknown")
        out += [f"  {f['id']} in {f['package']} {f['version']}: fixed in "
                f"{' or '.join(f['fixed'])}" + (f" ({', '.join(f['aliases'])})"
                                                if f["aliases"] else "") for f in a.fixes]
    return out
