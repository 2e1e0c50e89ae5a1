"""The keyless rehearsal on loopback: `@sigstore/mock`'s Fulcio and Rekor (tests/e2e/
sigstore_mock, pinned with integrity hashes in its package-lock.json) stand in for sigstore's
public good and a mock OIDC token for GitHub's; `builder attest` signs a tiny image and its
evidence with no private key, and `builder verify --certificate-identity …` checks it against a
trusted root made from the mock's keys. Each forgery is refused with one line naming why.
Pushes tiny images (helpers.fake_image): builds nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import fake_image, free_port, run_builder
from keyless_mock import ISSUER, MAIN, MOCK, PULL, WORKFLOW, by, serving, token

from builder.core import keyless, oci, registry

pytestmark = pytest.mark.docker

REPOSITORY = "keyless/torch"


@pytest.fixture(scope="module")
def backdated_mock(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A mock whose CA runs two hours behind its log: its certificates (ten minutes long) have
    expired when the log records a signature."""
    clock = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 7200))
    with serving(tmp_path_factory.mktemp("sigstore-mock-backdated"), clock) as folder:
        yield folder


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[oci.Registry]:
    folder = tmp_path_factory.mktemp("keyless-registry")
    addr = f"127.0.0.1:{free_port()}"
    registry.start(addr, folder)
    yield oci.Registry(addr)
    registry.stop(folder)


def attest(reg: oci.Registry, mock: Path, subject: str, tmp_path: Path,
           issuer: str = ISSUER) -> str:
    """A new tiny image with an SBOM attached, attested keylessly as `subject`; its digest."""
    digest = fake_image(reg, REPOSITORY, {"org.opencontainers.image.title": "keyless"})
    reg.push_artifact(REPOSITORY, reg.head(REPOSITORY, digest), "application/vnd.cyclonedx+json",
                      b'{"bomFormat": "CycloneDX"}', kind="sbom", title="sbom.cdx.json")
    (tmp_path / "token").write_text(token(subject, issuer))
    run_builder("attest", f"{reg.registry}/{REPOSITORY}@{digest}", "--identity-token",
                str(tmp_path / "token"), "--sigstore-config", str(mock / "trust_config.json"))
    return digest


def verify(reg: oci.Registry, digest: str, *args: str, root: Path) -> tuple[dict[str, Any], str]:
    """`builder verify --json` by identity: the rows by name, and stderr."""
    result = run_builder("verify", f"{reg.registry}/{REPOSITORY}@{digest}", "--json",
                         "--trusted-root", str(root), *args, check=False)
    assert result.returncode == 1, result.stderr  # the tiny image has no smoke report
    rows = {r["what"]: r for r in json.loads(result.stdout)["checks"]}
    return rows, result.stderr


def test_genuine_image_verifies_by_identity(reg: oci.Registry, mock: Path,
                                            tmp_path: Path) -> None:
    digest = attest(reg, mock, MAIN, tmp_path)
    rows, _ = verify(reg, digest, *by(), root=mock / "trusted_root.json")
    assert rows["signature"]["status"] == "ok", rows["signature"]
    assert MAIN in rows["signature"]["detail"]
    assert rows["attestation sbom"]["status"] == "ok", rows["attestation sbom"]
    regexp = ("--certificate-identity-regexp", r"https://github\.com/torch-images/.*@refs/heads/"
              r"main", "--certificate-oidc-issuer", ISSUER)
    rows, _ = verify(reg, digest, *regexp, root=mock / "trusted_root.json")
    assert rows["signature"]["status"] == "ok", rows["signature"]


@pytest.mark.parametrize(("case", "reason"), [
    ("another identity", "another identity: signed by " + MAIN),
    ("another issuer", "another issuer: signed through " + ISSUER),
    ("pull-request ref", "a pull-request ref identity: signed by " + PULL),
    ("another digest", "a bundle for another digest"),
    ("another root", "the bundle does not verify against the trusted root"),
])
def test_forgeries_are_refused_with_their_reason(reg: oci.Registry, mock: Path, tmp_path: Path,
                                                 case: str, reason: str) -> None:
    root, trusted = mock / "trusted_root.json", by()
    digest = attest(reg, mock, PULL if case == "pull-request ref" else MAIN, tmp_path)
    if case == "another identity":
        trusted = by(f"https://github.com/{WORKFLOW.replace('build', 'rebuild')}@refs/heads/main")
    elif case == "another issuer":
        trusted = by(issuer="https://gitlab.com")
    elif case == "another root":
        root = keyless.PUBLIC_GOOD_ROOT
    elif case == "another digest":  # the genuine bundle, copied onto another image
        bundle = keyless.bundles(reg, REPOSITORY, digest)[0]
        digest = fake_image(reg, REPOSITORY, {"org.opencontainers.image.title": "other"})
        keyless.attach(reg, REPOSITORY, digest, bundle, keyless.IMAGE_PREDICATE)
    assert_refused(reg, digest, trusted, root, reason)


def assert_refused(reg: oci.Registry, digest: str, trusted: tuple[str, ...], root: Path,
                   reason: str) -> None:
    """The signature row fails naming `reason`, and so does the one `error:` line."""
    rows, stderr = verify(reg, digest, *trusted, root=root)
    assert rows["signature"]["status"] == "fail"
    assert reason in rows["signature"]["detail"], rows["signature"]
    error = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and reason in error[0], stderr


def test_a_certificate_expired_at_signing_time_is_refused(reg: oci.Registry,
                                                          backdated_mock: Path) -> None:
    """builder's signer (sigstore-python) refuses such a certificate; @actions/attest does
    not, so it makes the bundle."""
    digest = fake_image(reg, REPOSITORY, {"org.opencontainers.image.title": "expired"})
    actions_attest(reg, backdated_mock, digest)
    assert_refused(reg, digest, by(), backdated_mock / "trusted_root.json",
                   "a certificate outside its validity at signing time")


def test_a_log_entry_of_another_signature_is_refused(reg: oci.Registry, mock: Path,
                                                     tmp_path: Path) -> None:
    """A genuine entry of the same log, spliced from another image's bundle into this one's
    (the only bundle left listed for the digest)."""
    digest, other = attest(reg, mock, MAIN, tmp_path), attest(reg, mock, MAIN, tmp_path)
    doc = json.loads(keyless.bundles(reg, REPOSITORY, digest)[0])
    doc["verificationMaterial"]["tlogEntries"] = json.loads(
        keyless.bundles(reg, REPOSITORY, other)[0])["verificationMaterial"]["tlogEntries"]
    empty = json.dumps({"schemaVersion": 2, "mediaType": oci.OCI_INDEX, "manifests": []})
    reg.put_manifest(REPOSITORY, keyless.referrers_tag(digest), empty.encode(), oci.OCI_INDEX)
    keyless.attach(reg, REPOSITORY, digest, json.dumps(doc).encode(), keyless.IMAGE_PREDICATE)
    assert_refused(reg, digest, by(), mock / "trusted_root.json",
                   "a log entry that does not include the signature")


def test_a_bundle_builder_writes_verifies_with_sigstore_python(reg: oci.Registry, mock: Path,
                                                                tmp_path: Path) -> None:
    """Interoperability: sigstore-python's own `verify identity` accepts builder's bundle."""
    digest = attest(reg, mock, MAIN, tmp_path)
    (tmp_path / "image.sigstore.json").write_bytes(keyless.bundles(reg, REPOSITORY, digest)[0])
    result = subprocess.run(
        [sys.executable, "-m", "sigstore", "--trust-config",
         str(mock / "trust_config.json"), "verify", "identity", "--offline", "--bundle",
         str(tmp_path / "image.sigstore.json"), "--cert-identity", MAIN, "--cert-oidc-issuer",
         ISSUER, digest], capture_output=True, text=True, check=False, timeout=120)
    assert result.returncode == 0, result.stderr


def test_a_bundle_from_actions_attest_verifies_with_builder(reg: oci.Registry, mock: Path) -> None:
    """Interoperability: a bundle made by @actions/attest (the library behind GitHub's
    actions/attest-build-provenance), attached as a referrer, verifies by identity."""
    digest = fake_image(reg, REPOSITORY, {"org.opencontainers.image.title": "actions-attest"})
    actions_attest(reg, mock, digest)
    rows, _ = verify(reg, digest, *by(), root=mock / "trusted_root.json")
    assert rows["signature"]["status"] == "ok", rows["signature"]
    assert MAIN in rows["signature"]["detail"]


def actions_attest(reg: oci.Registry, mock: Path, digest: str) -> None:
    """@actions/attest signs the image statement of `digest` as MAIN against `mock`; the
    bundle is attached as a referrer (as attest-build-provenance's push-to-registry does)."""
    made = subprocess.run(
        ["node", "attest.mjs", (mock / "url").read_text(), digest, f"{reg.registry}/{REPOSITORY}",
         keyless.IMAGE_PREDICATE], cwd=MOCK, env={**os.environ, "SIGSTORE_ID_TOKEN": token(MAIN)},
        capture_output=True, text=True, check=False, timeout=120)
    assert made.returncode == 0, made.stderr
    keyless.attach(reg, REPOSITORY, digest, made.stdout.strip().encode(), keyless.IMAGE_PREDICATE)
