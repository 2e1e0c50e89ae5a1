"""Publish with no key anywhere: the session's staged CPU runtime (fixtures_published) copied
with its evidence files, but none of the key's signatures, into a registry of this module's own
(`own_registry`), its evidence attested by `builder attest` with a mock OIDC token for the
workflow identity; `builder publish` on a second state folder, trusting only that identity and
signing with the token, promotes it, and `builder verify --certificate-identity …
--certificate-oidc-issuer …` passes on the published tag. Trusting another identity, the gate
refuses it with one line. Builds nothing (the shared publication's build is the session's)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fixtures_published import CPU, Publication, moved_matrix, own_registry
from helpers import run_builder
from keyless_mock import MAIN, by, token

from builder.core import oci, sign

pytestmark = pytest.mark.docker

DEV = MAIN.replace("heads/main", "heads/dev")


def stage_without_signatures(shared: Publication, addr: str) -> str:
    """The shared staged digest and its evidence files (`.sbom`, `.smoke`; no `.sig`, no
    `.att`: nothing a key vouched for) in the same staging repository at `addr`."""
    source, target = oci.Registry(shared.addr), oci.Registry(addr)
    oci.promote(source, shared.staging, target, shared.staging, shared.staged)
    target.tag(shared.staging, shared.staged, shared.record["hash_tag"])  # what publish finds
    copied = []
    for kind in sign.PREDICATES:
        tag = oci.artifact_tag(shared.staged, kind)
        if (desc := source.head(shared.staging, tag)) is not None:
            oci.promote(source, shared.staging, target, shared.staging, desc.digest)
            target.tag(shared.staging, desc.digest, tag)
            copied.append(kind)
    assert {"sbom", "smoke"} <= set(copied), copied
    assert target.head(shared.staging, sign.att_tag(shared.staged)) is None
    return f"{addr}/{shared.staging}@{shared.staged}"


def test_identity_attested_staging_is_published_and_verified_by_identity_alone(
        shared_publication: Publication, mock: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COSIGN_", "SIGSTORE_"))}
    env["BUILDER_STATE"] = str(tmp_path / "second-runner")  # none of the build's evidence
    (tmp_path / "token").write_text(token(MAIN))
    keyless = ("--identity-token", str(tmp_path / "token"),
               "--sigstore-config", str(mock / "trust_config.json"))
    root = ("--trusted-root", str(mock / "trusted_root.json"))
    with own_registry(tmp_path) as addr:
        staged = stage_without_signatures(shared_publication, addr)
        run_builder("attest", staged, *keyless, env=env)
        matrix = moved_matrix(shared_publication, tmp_path, addr)
        publish = ("publish", "--select", f"id={CPU}", *keyless, *root,
                   "--manifest", str(tmp_path / "published.json"))
        refused = run_builder(*publish, *by(DEV), matrix=matrix, env=env, check=False)
        errors = [x for x in refused.stderr.splitlines() if x.startswith("error:")]
        assert refused.returncode == 1 and len(errors) == 1, refused.stderr
        assert "has no attestation by a trusted key or identity" in errors[0], errors
        assert f"another identity: signed by {MAIN}" in errors[0], errors
        run_builder(*publish, *by(), matrix=matrix, env=env)
        [pub] = json.loads((tmp_path / "published.json").read_text())["variants"][CPU][
            "publications"]
        assert pub["signed"] and pub["signature"]["key"].startswith(f"keyless: {MAIN}"), pub
        assert oci.Registry(addr).head(shared_publication.repository,
                                       sign.sig_tag(pub["digest"])) is None  # no key signed
        ok = run_builder("verify", f"{addr}/{shared_publication.repository}:{CPU}", *by(),
                         *root, env=env, check=False)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert f"`{CPU}` is among the tags signed" in ok.stdout, ok.stdout
