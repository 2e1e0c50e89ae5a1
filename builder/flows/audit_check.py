"""What the daily `rebuild --check` says of each publication's vulnerability audit (issue 41.7).

It reads the latest publication's signed audit (`publish` attests one by default, cosign's vuln
predicate on each platform digest) and, since advisories appear every day, audits the image's
signed SBOM afresh (builder.flows.audit_daily: attached, signed, when the findings changed and a
key is given). It reports the vulnerabilities with a fixed version, so a CVE with a fix is in
the daily job's output (one warning annotation per row, rebuild.yml) and in the `--json` the
tracking issue quotes. Only an audit a trusted key attested counts: an unsigned `.audit` is what
anyone with push rights can write.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
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
    refresh: str = ""  # what the daily re-audit did (audit_daily: attached, unchanged, …)
    refresh_detail: str = ""

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "fixes": list(self.fixes)}


def audits(pubs: Mapping[str, Publication], variants: Sequence[Variant], vouchers: Vouchers,
           one: Callable[[str, Publication, Vouchers], Audit] | None = None) -> list[Audit]:
    """The audit of each selected variant's latest publication (`pubs`: variant id → its
    latest, rebuild_check.latest_publications), per platform: `one` (the variant's key, the
    platform's publication, who vouches) makes each; audit_of (the signed one) by default."""
    found = []
    for v in variants:
        latest = pubs.get(v.id)
        pub = latest.for_platform(v.platform) if latest else None
        if pub is not None:
            found.append((one or audit_of)(v.key, pub, vouchers))
    return found


def where_of(variant: str, pub: Publication) -> dict[str, str]:
    """The fields that name one published image in an Audit."""
    return {"variant": variant, "reference": pub.reference, "dated_tag": pub.dated_tag}


def audit_of(variant: str, pub: Publication, vouchers: Vouchers) -> Audit:
    """The audit a trusted key or identity attested on `pub`'s digest (vouch.attestations, as
    every other reader of evidence), or why there is none to report."""
    where = where_of(variant, pub)
    if not vouchers:
        return Audit(**where, state=NO_KEY, detail="no trusted key or identity (--trust-key, "
                     "--certificate-identity): an unsigned audit is not read")
    try:
        found, problems = attested(pub, vouchers)
    except BuilderError as exc:
        return Audit(**where, state=UNREADABLE, detail=str(exc))
    return signed_audit(where, found, problems, pub.digest)


def attested(pub: Publication, vouchers: Vouchers) -> tuple[dict[str, Any], dict[str, str]]:
    """The statements a voucher attested on `pub`'s digest, and why not for the other kinds."""
    return vouch.attestations(oci.Registry(pub.registry), pub.repository, pub.digest, vouchers)


def signed_audit(where: dict[str, str], found: dict[str, Any], problems: dict[str, str],
                 digest: str) -> Audit:
    """The Audit of the attested audit in `found`, or NOT_AUDITED saying why there is none."""
    if "audit" not in found:
        return Audit(**where, state=NOT_AUDITED, detail=problems.get(
            "audit", f"no signed audit ({sign.att_tag(digest)})"))
    return of_report(where, report_of(found["audit"]))


def report_of(statement: dict[str, Any]) -> dict[str, Any]:
    """The report inside an attested audit statement (cosign's vuln predicate's result)."""
    return ((statement.get("predicate") or {}).get("scanner") or {}).get("result") or {}


def of_report(where: dict[str, str], report: dict[str, Any]) -> Audit:
    """An AUDITED Audit of one report: its counts and the vulnerabilities with a fix."""
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
        refresh = f"; {a.refresh}: {a.refresh_detail}" if a.refresh else ""
        if a.state != AUDITED:
            out.append(f"audit of {a.variant}: {a.state}: {a.detail}{refresh}")
            continue
        out.append(f"audit of {a.variant} (`{a.dated_tag}`, audited {a.audited_at or '?'}): "
                   f"{a.vulnerabilities} vulnerabilities, {len(a.fixes)} with a fix, "
                   f"{a.unknown} packages unknown{refresh}")
        out += [f"  {f['id']} in {f['package']} {f['version']}: fixed in "
                f"{' or '.join(f['fixed'])}" + (f" ({', '.join(f['aliases'])})"
                                                if f["aliases"] else "") for f in a.fixes]
    return out
