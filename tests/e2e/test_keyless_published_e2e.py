"""The keyless rehearsal on a real publication: the session's CPU runtime (fixtures_published),
copied with its evidence into a repository of this module's own (the shared one is not
touched), attested by `builder attest` with the mock OIDC token, then `builder verify` by
identity alone passes every check — signature, three attestations, smoke, SBOM, provenance —
with no key; another identity is refused. (The key's signature names the shared repository, so
it does not verify for the copy: keys with identities are unit-tested, flows.verify_keyless.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from fixtures_published import Publication
from helpers import run_builder
from keyless_mock import MAIN, by, token

from builder.core import oci, sign

pytestmark = pytest.mark.docker


def copy_with_evidence(pub: Publication, repository: str) -> str:
    """The published digest, its `.sbom`/`.smoke`/`.provenance` artifacts and its key's
    `.sig`/`.att` in `repository`."""
    reg = oci.Registry(pub.addr)
    digest = pub.record["digest"]
    oci.promote(reg, pub.repository, reg, repository, digest)
    for kind in [*sign.PREDICATES, "sig", "att"]:
        tag = oci.artifact_tag(digest, kind)
        desc = reg.head(pub.repository, tag)
        assert desc is not None, f"the publication has no {kind}"
        oci.promote(reg, pub.repository, reg, repository, desc.digest)
        reg.tag(repository, desc.digest, tag)
    return f"{pub.addr}/{repository}@{digest}"


def test_a_real_publication_verifies_by_identity_alone(
        shared_publication: Publication, mock: Path, tmp_path: Path) -> None:
    reference = copy_with_evidence(shared_publication, "keyless-published/torch")
    (tmp_path / "token").write_text(token(MAIN))
    run_builder("attest", reference, "--identity-token", str(tmp_path / "token"),
                "--sigstore-config", str(mock / "trust_config.json"))
    root = ("--trusted-root", str(mock / "trusted_root.json"))
    ok = run_builder("verify", reference, *by(), *root, check=False)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    for row in ("attestation sbom", "attestation smoke", "attestation provenance"):
        assert f"sigstore bundle by {MAIN}" in next(
            line for line in ok.stdout.splitlines() if line.startswith(row)), ok.stdout
    other = run_builder("verify", reference, *by(MAIN.replace("heads/main", "heads/dev")),
                        *root, check=False)
    assert other.returncode == 1 and "another identity" in other.stderr, other.stderr
