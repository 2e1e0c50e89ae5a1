"""`builder publish --identity-token`: every digest the run published is attested keylessly —
a plain manifest, and an index with each of its platform manifests — and nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.commands import publish
from builder.core import keyless


def test_each_published_digest_and_platform_is_attested(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def attest_digest(reg, repository, digest, token, config):
        calls.append((reg.registry, repository, digest, token, config))
        return keyless.Signer("https://github.com/o/r/.github/workflows/build.yml@refs/heads/main",
                              keyless.GITHUB_ISSUER), []

    monkeypatch.setattr(keyless, "attest_digest", attest_digest)
    results = [
        {"id": "cpu", "status": "published", "registry": "r:5000", "repository": "t",
         "digest": "sha256:1"},
        {"id": "multi", "status": "published", "registry": "r:5000", "repository": "t",
         "digest": "sha256:2", "platforms": [{"digest": "sha256:3"}, {"digest": "sha256:4"}]},
        {"id": "old", "status": "already-published", "registry": "r:5000", "repository": "t",
         "digest": "sha256:5"},
        {"id": "bad", "status": "refused", "reason": "no smoke report"},
    ]
    publish.attest_published(results, "TOKEN", Path("trust_config.json"))
    assert [c[2] for c in calls] == ["sha256:1", "sha256:2", "sha256:3", "sha256:4"]
    assert {c[:2] + c[3:] for c in calls} == {("r:5000", "t", "TOKEN", Path("trust_config.json"))}
