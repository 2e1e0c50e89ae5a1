"""The vulnerability report of one published image, attached to its digest (issue 41.7).

What `builder audit --attach` attaches and `publish` attaches by default: sbom.audit's report of
the image's SBOM (Debian packages against the security suite, with the CVE ids the fixed
package's changelog names; Python packages through pip-audit, `unknown` where PyPI's data is
unreachable, never clean), stamped `audited_at`, attached as `sha256-<hex>.audit` (what the
catalog shows as the latest audit) and, with a key, attested in cosign's vulnerability predicate
(`https://cosign.sigstore.dev/attestation/vuln/v1`, builder.stages.staging.vuln_predicate).
"""

from __future__ import annotations

import json
from typing import Any

from builder.core import clock, keypair, settings
from builder.core.errors import BuilderError
from builder.core.output import step
from builder.model.staged import Staged
from builder.stages import staging


def report(sbom_doc: dict[str, Any], **sources: Any) -> dict[str, Any]:
    """sbom.audit's report of an SBOM (`sources`: its suite and mirror; the mirror defaults to
    $BUILDER_DEBIAN_SECURITY_MIRROR where set), stamped with when."""
    import sbom

    if mirror := settings.current().debian_security_mirror:
        sources.setdefault("debian_mirror", mirror)
    started = clock.iso()
    found = sbom.audit(sbom_doc, **sources)
    return {**found, "audited_at": started}


def attach(staged: Staged, found: dict[str, Any],
           key: keypair.SigningKey | None = None) -> dict[str, str]:
    """The report attached to the digest (`.audit`) and, with a key, its signed attestation."""
    return staging.attach(staged, "audit", (json.dumps(found, indent=2) + "\n").encode(), key)


def audit_published(staged: Staged, sbom_data: bytes, label: str,
                    key: keypair.SigningKey | None = None) -> dict[str, Any] | None:
    """Publish's audit of one image: its report attached (signed with `key`), one line of
    counts, a warning per source that could not answer (its packages are unknown, not clean).
    Never fails the publish: a report that could not be made at all is a warning too."""
    try:
        found = report(json.loads(sbom_data))
        attach(staged, found, key)
    except (BuilderError, OSError, ValueError) as exc:
        step(f"warning: [{label}] no vulnerability report attached: {exc} (`builder audit "
             f"--attach {staged.reference}` makes one)")
        return None
    for name, source in sorted(found["sources"].items()):
        if source.get("status") != "ok":
            step(f"warning: [{label}] audit source `{name}` {source.get('status')}: "
                 f"{source.get('detail') or 'no detail'}; its packages are unknown, not clean")
    step(f"  [{label}] audit attached: {len(found['vulnerabilities'])} vulnerabilities, "
         f"{len(found['unknown'])} unknown")
    return found
