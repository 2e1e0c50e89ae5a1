"""The daily check audits each published image afresh (builder.flows.audit_daily): the signed
SBOM is audited again; a report whose findings changed is attached (image and twin) with the
key; unchanged findings attach nothing; no key reports without attaching; an unsigned SBOM is
not audited. Against an in-memory registry (the attach itself: tests/e2e)."""

from __future__ import annotations

import argparse
import json
from types import SimpleNamespace
from typing import Any

import pytest
from memregistry import MemoryRegistry
from test_audit_check import new_key

from builder.commands import rebuild as rebuild_cmd
from builder.core import keypair, oci, sign
from builder.core.keypair import Vouchers
from builder.flows import audit_check, audit_daily, vuln_audit
from builder.stages import staging

SBOM = {"bomFormat": "CycloneDX", "components": [{"purl": "pkg:deb/debian/libc6@2.36-9"}]}
OLD = {"audited_at": "2026-12-01T04:17:00Z", "sources": {"debian-security": {"status": "ok"}},
       "unknown": [{"name": "numpy", "version": "2.4.5", "reason": "PyPI: timed out"}],
       "vulnerabilities": []}
ROW = {"id": "bookworm-security:libc6@2.36-9+deb12u9", "source": "debian-security",
       "name": "libc6", "version": "2.36-9", "fix_versions": ["2.36-9+deb12u9"],
       "aliases": ["CVE-2026-0001"]}
NEW = {**OLD, "audited_at": "2026-12-06T04:17:00Z", "vulnerabilities": [ROW]}


@pytest.fixture
def attached(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """(digest, report) of each vuln_audit.attach."""
    made: list[tuple[str, Any]] = []
    monkeypatch.setattr(vuln_audit, "attach",
                        lambda staged, found, key: made.append((staged.digest, found)))
    return made


def image(reg: MemoryRegistry, n: int) -> str:
    return reg.put_manifest("torch", f"m{n}", json.dumps({"schemaVersion": 2, "n": n}).encode(),
                            oci.OCI_MANIFEST)


def published(reg: MemoryRegistry, key: keypair.SigningKey, audit: dict[str, Any] | None,
              sbom: bool = True) -> SimpleNamespace:
    """A published image whose SBOM and `audit` the key attested, and its twin under the
    signed twin of its dated tag."""
    digest, twin = image(reg, 1), image(reg, 2)
    sign.sign_image(reg, "torch", twin, key, sign.tag_annotations(  # type: ignore[arg-type]
        "v", ["t-20261201-zstd"]))
    reg.tag("torch", twin, "t-20261201-zstd")
    if sbom:
        sign.attest(reg, "torch", digest, key, "sbom", SBOM)  # type: ignore[arg-type]
    if audit is not None:
        sign.attest(reg, "torch", digest, key, "audit",  # type: ignore[arg-type]
                    staging.vuln_predicate(audit))
    return SimpleNamespace(registry=reg.registry, repository="torch", digest=digest,
                           reference=f"{reg.registry}/torch@{digest}", dated_tag="t-20261201",
                           platforms=(), zstd=SimpleNamespace(digest=twin))


def fresh(monkeypatch: pytest.MonkeyPatch, report: dict[str, Any]) -> list[Any]:
    """vuln_audit.report answers `report`; the SBOMs it was given."""
    audited: list[Any] = []
    monkeypatch.setattr(vuln_audit, "report", lambda doc: audited.append(doc) or report)
    return audited


def test_changed_findings_are_attached_to_the_image_and_its_twin(reg, attached, monkeypatch):
    key = new_key()
    pub = published(reg, key, OLD)
    audited = fresh(monkeypatch, NEW)
    found = audit_daily.refresh("v-cpu", pub, Vouchers(keys=(key.public,)), keypair.Trust(key=key))
    assert audited == [SBOM]  # the SBOM the key attested
    assert attached == [(pub.digest, NEW), (pub.zstd.digest, NEW)]
    assert (found.state, found.refresh, found.audited_at) == (
        audit_check.AUDITED, audit_daily.ATTACHED, "2026-12-06T04:17:00Z")
    assert found.fixes[0]["aliases"] == ["CVE-2026-0001"]
    [line, row] = audit_check.lines([found])
    assert line.endswith("; attached: the findings changed since the signed audit of "
                         f"2026-12-01T04:17:00Z: signed and attached to {pub.digest[:19]}, "
                         f"{pub.zstd.digest[:19]}"), line
    assert row == "  bookworm-security:libc6@2.36-9+deb12u9 in libc6 2.36-9: fixed in " \
        "2.36-9+deb12u9 (CVE-2026-0001)"


def test_the_same_findings_on_another_day_attach_nothing(reg, attached, monkeypatch):
    key = new_key()
    pub = published(reg, key, NEW)
    again = {**NEW, "audited_at": "2026-12-07T04:17:00Z",
             "unknown": [{"name": "numpy", "version": "2.4.5", "reason": "PyPI: refused"}]}
    fresh(monkeypatch, again)
    found = audit_daily.refresh("v-cpu", pub, Vouchers(keys=(key.public,)), keypair.Trust(key=key))
    assert attached == [] and found.refresh == audit_daily.UNCHANGED
    assert found.audited_at == "2026-12-07T04:17:00Z"  # today's audit is the one reported
    assert "same findings as the signed audit of 2026-12-06T04:17:00Z" in found.refresh_detail


def test_without_a_key_the_fresh_audit_is_reported_not_attached(reg, attached, monkeypatch,
                                                                   capsys):
    key = new_key()
    pub = published(reg, key, OLD)
    fresh(monkeypatch, NEW)
    monkeypatch.setattr(rebuild_cmd, "latest_publications", lambda m, v: {"v": pub})
    monkeypatch.setattr(pub, "for_platform", lambda _p: pub, raising=False)
    args = argparse.Namespace(dry_run=False, key=None, identity_token=None, sigstore_config=None)
    monkeypatch.delenv("COSIGN_PRIVATE_KEY", raising=False)
    monkeypatch.delenv("SIGSTORE_ID_TOKEN", raising=False)
    variant = SimpleNamespace(id="v", key="v", platform="linux/amd64")
    [found] = rebuild_cmd.daily_audits(args, None, [variant],  # type: ignore[arg-type]
                                       Vouchers(keys=(key.public,)))
    assert attached == [] and found.refresh == audit_daily.NOT_ATTACHED
    assert found.vulnerabilities == 1 and "no signing key or identity token" in \
        found.refresh_detail
    assert capsys.readouterr().err.strip() == audit_daily.NO_KEY_LINE


def test_no_signed_sbom_is_not_audited_afresh(reg, attached, monkeypatch):
    key = new_key()
    pub = published(reg, key, OLD, sbom=False)
    audited = fresh(monkeypatch, NEW)
    found = audit_daily.refresh("v-cpu", pub, Vouchers(keys=(key.public,)), keypair.Trust(key=key))
    assert audited == [] and attached == []
    assert found.state == audit_check.AUDITED and found.audited_at == OLD["audited_at"]
    assert found.refresh == audit_daily.NOT_AUDITED and "no signed SBOM" in found.refresh_detail
    other = audit_daily.refresh("v-cpu", published(reg, new_key(), OLD),
                                Vouchers(keys=(key.public,)), keypair.Trust(key=key))
    assert other.state == audit_check.NOT_AUDITED and other.refresh == audit_daily.NOT_AUDITED


def test_findings_ignore_when_and_in_what_words() -> None:
    worded = {**NEW, "audited_at": "later", "sources": {"debian-security": {
        "status": "ok", "detail": "other words", "checked": 9}}}
    assert audit_daily.findings(worded) == audit_daily.findings(NEW)
    assert audit_daily.findings(NEW) != audit_daily.findings(OLD)
    fixed_elsewhere = {**NEW, "vulnerabilities": [{**ROW, "aliases": ["CVE-2026-0002"]}]}
    assert audit_daily.findings(fixed_elsewhere) != audit_daily.findings(NEW)
    unreachable = {**OLD, "sources": {"debian-security": {"status": "unreachable"}}}
    assert audit_daily.findings(unreachable) != audit_daily.findings(OLD)


def test_the_twin_is_the_signed_one_of_the_same_platform(reg) -> None:
    """The twin under the dated tag's twin counts only when the key's signature names that tag;
    in a twin index, the manifest of the publication's platform."""
    key, arm, amd = new_key(), image(reg, 3), image(reg, 4)
    index = json.dumps({"schemaVersion": 2, "manifests": [
        {"digest": amd, "platform": {"os": "linux", "architecture": "amd64"}},
        {"digest": arm, "platform": {"os": "linux", "architecture": "arm64"}}]}).encode()
    twin_index = reg.put_manifest("torch", "t-20261201-zstd", index, oci.OCI_INDEX)
    mine = "sha256:" + "b" * 64
    pub = SimpleNamespace(repository="torch", digest=mine, dated_tag="t-20261201",
                          platforms=(SimpleNamespace(platform="linux/arm64", digest=mine),))
    trusted = Vouchers(keys=(key.public,))
    assert audit_daily.twin_of(reg, pub, trusted) is None  # type: ignore[arg-type]  # unsigned
    sign.sign_image(reg, "torch", twin_index, key, sign.tag_annotations(  # type: ignore[arg-type]
        "v", ["t-20261201-zstd"]))
    found = audit_daily.twin_of(reg, pub, trusted)  # type: ignore[arg-type]
    assert found is not None and found.digest == arm
    other = Vouchers(keys=(new_key().public,))
    assert audit_daily.twin_of(reg, pub, other) is None  # type: ignore[arg-type]


def test_an_identity_token_attests_the_fresh_audit_keylessly(reg, attached, monkeypatch):
    """No key, an OIDC token: the report is attached and its vuln statement signed as a bundle
    listed for the image and for its twin."""
    key = new_key()
    pub = published(reg, key, OLD)
    fresh(monkeypatch, NEW)
    signed: list[Any] = []
    monkeypatch.setattr(audit_daily.keyless, "sign_statements",
                        lambda token, config, docs: [json.dumps(docs[0]).encode()])
    monkeypatch.setattr(audit_daily.keyless, "attach",
                        lambda _reg, repo, digest, bundle, ptype: signed.append((digest, ptype,
                                                                                 bundle)))
    signer = keypair.Trust(keyless=keypair.KeylessSigner("token"))
    found = audit_daily.refresh("v-cpu", pub, Vouchers(keys=(key.public,)), signer)
    assert found.refresh == audit_daily.ATTACHED
    assert [(d, t) for d, t, _ in signed] == [(pub.digest, sign.ATTESTED["audit"]),
                                              (pub.zstd.digest, sign.ATTESTED["audit"])]
    statement = json.loads(signed[0][2])
    assert statement["predicate"]["scanner"]["result"] == NEW
    assert statement["subject"][0]["digest"]["sha256"] == pub.digest.removeprefix("sha256:")
