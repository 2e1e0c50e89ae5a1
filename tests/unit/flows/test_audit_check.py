"""The daily check reports the latest publication's signed audit (builder.flows.audit_check):
the vulnerabilities it lists with a fixed version, one line each; an audit no trusted key
attested (unsigned, another key's, none) is not read. Against an in-memory registry."""

from __future__ import annotations

import json
from types import SimpleNamespace

from cryptography.hazmat.primitives.asymmetric import ec
from memregistry import MemoryRegistry

from builder.core import keypair, oci, sign
from builder.core.keypair import Vouchers
from builder.flows import audit_check
from builder.stages import staging

REPORT = {"audited_at": "2026-12-06T04:17:00Z", "sources": {"debian-security": "ok"},
          "unknown": [{"name": "numpy"}], "vulnerabilities": [
              {"id": "DSA-5800-1", "source": "debian-security", "name": "libc6",
               "version": "2.36-9+deb12u7", "fix_versions": ["2.36-9+deb12u9"],
               "aliases": ["CVE-2024-33599", "CVE-2024-33600"]},
              {"id": "PYSEC-1", "source": "pypi", "name": "pip", "version": "1.0"}]}


def new_key() -> keypair.SigningKey:
    return keypair.SigningKey(ec.generate_private_key(ec.SECP256R1()))


def published(reg: MemoryRegistry, n: int = 0) -> SimpleNamespace:
    digest = reg.put_manifest("torch", "t", json.dumps({"schemaVersion": 2, "n": n}).encode(),
                              oci.OCI_MANIFEST)
    return SimpleNamespace(registry=reg.registry, repository="torch", digest=digest,
                           reference=f"{reg.registry}/torch@{digest}", dated_tag="t-20261205")


def test_the_signed_audit_s_fixes_are_reported_one_line_each(reg: MemoryRegistry) -> None:
    pub, key = published(reg), new_key()
    sign.attest(reg, "torch", pub.digest, key, "audit",  # type: ignore[arg-type]
                staging.vuln_predicate(REPORT))
    found = audit_check.audit_of("v-cpu", pub, Vouchers(keys=(key.public,)))
    assert (found.state, found.vulnerabilities, found.unknown) == (audit_check.AUDITED, 2, 1)
    assert found.fixes == ({"id": "DSA-5800-1", "package": "libc6", "version": "2.36-9+deb12u7",
                            "fixed": ["2.36-9+deb12u9"],
                            "aliases": ["CVE-2024-33599", "CVE-2024-33600"]},)
    assert audit_check.lines([found]) == [
        "audit of v-cpu (`t-20261205`, audited 2026-12-06T04:17:00Z): 2 vulnerabilities, "
        "1 with a fix, 1 packages unknown",
        "  DSA-5800-1 in libc6 2.36-9+deb12u7: fixed in 2.36-9+deb12u9 (CVE-2024-33599, "
        "CVE-2024-33600)"]
    assert json.loads(json.dumps(found.as_json()))["fixes"][0]["package"] == "libc6"


def test_an_audit_no_trusted_key_attested_is_not_read(reg: MemoryRegistry) -> None:
    pub = published(reg)
    sign.attest(reg, "torch", pub.digest, new_key(), "audit",  # type: ignore[arg-type]
                staging.vuln_predicate(REPORT))
    other = audit_check.audit_of("v-cpu", pub, Vouchers(keys=(new_key().public,)))
    assert other.state == audit_check.NOT_AUDITED and other.fixes == ()
    none = audit_check.audit_of("v-cpu", pub, Vouchers())
    assert none.state == audit_check.NO_KEY
    assert audit_check.lines([none]) == [
        "audit of v-cpu: no key: no trusted key or identity (--trust-key, --certificate-identity): "
        "an unsigned audit is not read"]
    bare = audit_check.audit_of("v-cpu", published(reg, 1), Vouchers(keys=(new_key().public,)))
    assert bare.state == audit_check.NOT_AUDITED and "no signed audit" in bare.detail
