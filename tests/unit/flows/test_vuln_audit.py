"""builder.flows.vuln_audit: publish audits every image by default; a source that cannot answer
is a warning naming it (its packages unknown), and no report at all never fails the publish."""

from __future__ import annotations

import json

import sbom
from builder.core import oci, settings
from builder.core.errors import CommandFailed
from builder.flows import vuln_audit
from builder.model.staged import Staged
from builder.stages import staging

STAGED = Staged("reg.example", "torch", oci.Descriptor("sha256:" + "a" * 64, oci.OCI_MANIFEST, 1),
                "")
REPORT = {"sources": {"pypi": {"status": "unreachable", "detail": "ConnectionError"},
                      "debian-security": {"status": "ok", "detail": ""}},
          "vulnerabilities": [{"name": "libc6", "aliases": ["CVE-2026-0001"]}],
          "unknown": [{"name": "numpy"}], "ok": False}


def test_the_report_is_attached_with_the_key_and_an_unreachable_source_is_a_warning(
        monkeypatch, capsys) -> None:
    attached = []
    monkeypatch.setattr(vuln_audit, "report", lambda doc: {**REPORT, "audited_at": "now"})
    monkeypatch.setattr(vuln_audit, "attach", lambda *a: attached.append(a))
    found = vuln_audit.audit_published(STAGED, b"{}", "cpu", "KEY")  # type: ignore[arg-type]
    assert found is not None and attached == [(STAGED, found, "KEY")]
    err = capsys.readouterr().err
    assert "warning: [cpu] audit source `pypi` unreachable: ConnectionError; its packages are " \
        "unknown, not clean" in err
    assert "[cpu] audit attached: 1 vulnerabilities, 1 unknown" in err


def test_no_report_is_a_warning_not_a_failed_publish(monkeypatch, capsys) -> None:
    def fail(doc):
        raise CommandFailed("pip-audit: not found")

    monkeypatch.setattr(vuln_audit, "report", fail)
    assert vuln_audit.audit_published(STAGED, b"{}", "cpu") is None
    assert "warning: [cpu] no vulnerability report attached: pip-audit: not found" in \
        capsys.readouterr().err


def test_the_attestation_is_cosign_s_vuln_predicate_around_the_report() -> None:
    found = {**REPORT, "audited_at": "2026-01-02T00:00:00Z"}
    pred = staging.predicate("audit", json.dumps(found).encode())
    assert pred["scanner"]["result"] == found
    assert pred["metadata"]["scanStartedOn"] == "2026-01-02T00:00:00Z"


def test_the_debian_security_mirror_setting_reaches_every_audit(monkeypatch) -> None:
    """$BUILDER_DEBIAN_SECURITY_MIRROR points publish's, the daily check's and `builder audit`'s
    report at a mirror of the suite; `--debian-mirror` (a given mirror) still wins."""
    asked: list[dict] = []
    monkeypatch.setattr(sbom, "audit", lambda doc, **kw: asked.append(kw) or {"sources": {}})
    env = settings.Settings.from_env({settings.DEBIAN_SECURITY_MIRROR_ENV: " http://m.example "})
    with settings.applied(env):
        vuln_audit.report({})
        vuln_audit.report({}, debian_mirror="http://given.example")
    vuln_audit.report({})
    assert asked == [{"debian_mirror": "http://m.example"},
                     {"debian_mirror": "http://given.example"}, {}]
