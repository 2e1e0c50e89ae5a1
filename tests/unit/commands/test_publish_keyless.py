"""`builder publish --identity-token`: each digest publish signs (a plain manifest, an index and
each platform manifest of it: stages.publish.sign_digest) is attested keylessly, its image
statement naming the tags as the key's `.sig` does; without a key that is the signature."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.core import keyless, keypair, oci
from builder.model.staged import Staged
from builder.stages import publish

SIGNER = keyless.Signer("https://github.com/o/r/.github/workflows/build.yml@refs/heads/main",
                        keyless.GITHUB_ISSUER)


def vetted(digest: str) -> Staged:
    return Staged("r:5000", "t", oci.Descriptor(digest, oci.OCI_MANIFEST, 1), "sha256:id")


def test_identity_only_publish_signs_keylessly_naming_the_tags(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def attest_digest(reg, repository, digest, token, config, optional):
        calls.append((reg.registry, repository, digest, token, config, optional))
        return SIGNER, []

    monkeypatch.setattr(keyless, "attest_digest", attest_digest)
    trust = keypair.Trust(keyless=keypair.KeylessSigner("TOKEN", Path("trust_config.json")))
    tags = {"variant": "cpu", "tag:cpu-20260101": "signed"}
    found = publish.sign_digest(vetted("sha256:" + "1" * 64), trust, tags)
    assert calls == [("r:5000", "t", "sha256:" + "1" * 64, "TOKEN", Path("trust_config.json"),
                      tags)]
    assert found["signed"] and not found["unsigned"]
    assert found["signature"].tag == "sha256-" + "1" * 64
    assert found["signature"].key == f"keyless: {SIGNER.describe()}"


def test_unsigned_publish_signs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyless, "attest_digest", lambda *a: pytest.fail("signed"))
    assert publish.sign_digest(vetted("sha256:" + "2" * 64), keypair.UNSIGNED) == {
        "signed": False, "unsigned": True}
