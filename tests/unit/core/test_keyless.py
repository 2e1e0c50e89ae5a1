"""builder.core.keyless and flows.verify_keyless: identities, the reasons a bundle is refused
(one line each), and a bundle @actions/attest made against the mock sigstore services
(tests/fixtures/sigstore_mock) verified offline, attached to and read back from an in-memory
registry by the referrers tag fallback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from memregistry import MemoryRegistry

from builder.core import keyless, keypair, oci
from builder.core.errors import BuilderError
from builder.flows import verify_keyless

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "sigstore_mock"
BUNDLE = (FIXTURE / "actions_attest.sigstore.json").read_bytes()
ROOT = FIXTURE / "trusted_root.json"
DIGEST = "sha256:" + "ab" * 32
WORKFLOW = "https://github.com/torch-images/torch-images/.github/workflows/build.yml"
MAIN = f"{WORKFLOW}@refs/heads/main"
ISSUER = keyless.GITHUB_ISSUER


def policy(*identities: keyless.Identity, root: Path = ROOT) -> keyless.KeylessPolicy:
    return keyless.KeylessPolicy(identities, root)


def test_the_genuine_bundle_verifies_by_identity_and_by_regexp() -> None:
    statement, signer = keyless.verify(BUNDLE, DIGEST, policy(keyless.Identity(ISSUER, MAIN)))
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert signer == keyless.Signer(MAIN, ISSUER)
    regexp = keyless.Identity(ISSUER, regexp=r"https://github\.com/torch-images/.*@refs/heads/.*")
    assert keyless.verify(BUNDLE, DIGEST, policy(regexp))[1] == signer


@pytest.mark.parametrize(("trusted", "digest", "reason"), [
    (keyless.Identity(ISSUER, f"{WORKFLOW}@refs/heads/dev"), DIGEST,
     f"another identity: signed by {MAIN}, trusted: {WORKFLOW}@refs/heads/dev"),
    (keyless.Identity("https://gitlab.com", MAIN), DIGEST,
     f"another issuer: signed through {ISSUER}"),
    (keyless.Identity(ISSUER, regexp=r".*@refs/tags/.*"), DIGEST, "another identity"),
    (keyless.Identity(ISSUER, MAIN), "sha256:" + "cd" * 32, "a bundle for another digest"),
])
def test_a_bundle_is_refused_with_one_line_naming_why(trusted, digest, reason) -> None:
    with pytest.raises(keyless.KeylessError) as refused:
        keyless.verify(BUNDLE, digest, policy(trusted))
    assert reason in str(refused.value) and "\n" not in str(refused.value)


def test_a_bundle_chained_to_another_root_is_refused() -> None:
    with pytest.raises(keyless.KeylessError, match="does not verify against the trusted root"):
        keyless.verify(BUNDLE, DIGEST, policy(keyless.Identity(ISSUER, MAIN),
                                              root=keyless.PUBLIC_GOOD_ROOT))


def test_a_certificate_expired_when_logged_is_refused_naming_it() -> None:
    """The mock CA backdated two hours: its certificate had expired when Rekor logged the
    signature, so the log's time proves nothing about the key's use within the validity."""
    expired = (FIXTURE / "expired_certificate.sigstore.json").read_bytes()
    with pytest.raises(keyless.KeylessError,
                       match=r"^a certificate outside its validity at signing time"):
        keyless.verify(expired, DIGEST, policy(keyless.Identity(ISSUER, MAIN),
                                               root=FIXTURE / "expired_trusted_root.json"))


def test_a_log_entry_of_another_signature_is_refused_naming_it() -> None:
    """A genuine log entry, from the same log, of another bundle's signature."""
    other = json.loads((FIXTURE / "actions_attest_other.sigstore.json").read_bytes())
    assert keyless.verify(json.dumps(other).encode(), "sha256:" + "cd" * 32,
                          policy(keyless.Identity(ISSUER, MAIN)))[1].subject == MAIN
    doc = json.loads(BUNDLE)
    doc["verificationMaterial"]["tlogEntries"] = other["verificationMaterial"]["tlogEntries"]
    with pytest.raises(keyless.KeylessError,
                       match=r"^a log entry that does not include the signature"):
        keyless.verify(json.dumps(doc).encode(), DIGEST, policy(keyless.Identity(ISSUER, MAIN)))


def test_a_tampered_bundle_is_refused() -> None:
    doc = json.loads(BUNDLE)
    doc["dsseEnvelope"]["payload"] = doc["dsseEnvelope"]["payload"][:-8] + "AAAAAAA="
    with pytest.raises(keyless.KeylessError, match="does not verify"):
        keyless.verify(json.dumps(doc).encode(), DIGEST, policy(keyless.Identity(ISSUER, MAIN)))


def test_a_pull_request_identity_is_named_as_such() -> None:
    pull = keyless.Signer(f"{WORKFLOW}@refs/pull/7/merge", ISSUER)
    with pytest.raises(keyless.KeylessError, match=r"^a pull-request ref identity: signed by"):
        keyless._check_identity(pull, (keyless.Identity(ISSUER, MAIN),))


def test_an_identity_needs_exactly_one_subject_and_an_issuer() -> None:
    with pytest.raises(BuilderError, match="exactly one"):
        keyless.Identity(ISSUER)
    with pytest.raises(BuilderError, match="exactly one"):
        keyless.Identity(ISSUER, MAIN, regexp=".*")
    with pytest.raises(BuilderError, match="--certificate-identity-regexp"):
        keyless.Identity(ISSUER, regexp="(")
    with pytest.raises(BuilderError, match="needs --certificate-oidc-issuer"):
        keyless.identities_of([MAIN], [], None)
    assert keyless.identities_of([MAIN], ["x.*"], ISSUER) == (
        keyless.Identity(ISSUER, MAIN), keyless.Identity(ISSUER, regexp="x.*"))


class ReferrerlessRegistry(MemoryRegistry):
    """distribution 2.8: no referrers API, so the `sha256-<hex>` fallback index."""

    def referrers(self, repository: str, digest: str, artifact_type: str | None = None) -> None:
        return None


def test_bundles_attach_as_referrers_and_verify_from_the_registry() -> None:
    reg = ReferrerlessRegistry()
    image = json.dumps({"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST}).encode()
    digest = reg.put_manifest("torch", oci.sha256(image), image, oci.OCI_MANIFEST)
    other = keyless.attach(reg, "torch", digest, b'{"not": "a bundle"}', "https://x/v1")
    keyless.attach(reg, "torch", digest, BUNDLE, "https://slsa.dev/provenance/v1")
    index = json.loads(reg.manifest("torch", keyless.referrers_tag(digest))[0])
    assert [x["artifactType"] for x in index["manifests"]] == [keyless.BUNDLE_MEDIA] * 2
    assert json.loads(reg.manifest("torch", other)[0])["subject"]["digest"] == digest
    good, refused = keyless.verified_statements(reg, "torch", digest,
                                                policy(keyless.Identity(ISSUER, MAIN)))
    assert good == {} and len(refused) == 2  # the fixture's subject is another digest
    assert "a bundle for another digest" in refused[1]


def test_keys_and_identities_either_suffices_unless_all_are_required() -> None:
    ok, bad = ("doc", "by key"), (None, "keyless: another identity")
    assert verify_keyless.pick([bad, ok], require_all=False) == ("doc", "by key")
    assert verify_keyless.pick([bad, ok], require_all=True) == (None, "keyless: another identity")
    assert verify_keyless.pick([ok, ok], require_all=True) == ("doc", "by key; by key")
    assert verify_keyless.pick([bad], require_all=False)[0] is None


def test_the_catalog_shows_who_signed_a_verified_image_bundle(tmp_path: Path) -> None:
    """Any identity the root's CA certified is shown (the page's commands then pin it), marked
    `trusted` when an identity the catalog was given names it; a bundle of evidence (not the
    image's own predicate) or one that does not chain to the root shows no one."""
    from builder.model import catalog_doc
    from builder.stages import catalog

    digest = "sha256:" + "cd" * 32

    def signers(root: Path, *names: str, trusting: tuple = ()) -> list[dict[str, Any]]:
        reg = ReferrerlessRegistry()
        reg.manifests[("torch", digest)] = b"{}"  # the subject attach() looks up
        for name in names:
            keyless.attach(reg, "torch", digest, (FIXTURE / name).read_bytes(), "x")
        reader = catalog.Reader(catalog.Source("r.example:5000", "torch"),
                                catalog.Cache(None), tmp_path, [], root, trusting)
        reader.reg = reg
        index_tag = keyless.referrers_tag(digest)
        tags = catalog_doc.classify([index_tag, "2.13.0-py3.11-cpu-runtime"])
        assert tags.images == ["2.13.0-py3.11-cpu-runtime"]  # the index is no image tag
        return catalog.keyless_signers(reader, digest, tags,
                                       {index_tag: reg.head("torch", index_tag).digest})

    image, evidence = "actions_attest_image.sigstore.json", "actions_attest_other.sigstore.json"
    assert signers(ROOT, image, evidence, image) == [{"subject": MAIN, "issuer": ISSUER,
                                                      "trusted": False}]
    main = keypair.Identity(ISSUER, MAIN)
    assert signers(ROOT, image, trusting=(main,))[0]["trusted"] is True
    pull = keypair.Identity(ISSUER, MAIN.replace("heads/main", "pull/7/merge"))
    assert signers(ROOT, image, trusting=(pull,))[0]["trusted"] is False
    assert signers(ROOT, evidence) == []
    assert signers(keyless.PUBLIC_GOOD_ROOT, image) == []


def test_malformed_referrers_are_skipped_not_fatal() -> None:
    """Anyone with push rights can list anything: entries without a digest, with a bad one,
    or pointing at a manifest that is not JSON are read as no bundle."""
    reg = ReferrerlessRegistry()
    digest = "sha256:" + "ab" * 32
    reg.put_manifest("torch", keyless.referrers_tag(digest), b"[]", oci.OCI_INDEX)
    assert keyless.bundles(reg, "torch", digest) == []
    junk = reg.put_manifest("torch", "junk", b"not json", oci.OCI_MANIFEST)
    listing = {"manifests": [{"artifactType": keyless.BUNDLE_MEDIA},
                             {"artifactType": keyless.BUNDLE_MEDIA, "digest": "sha256:../x"},
                             {"artifactType": keyless.BUNDLE_MEDIA, "digest": junk}, "x"]}
    reg.put_manifest("torch", keyless.referrers_tag(digest), json.dumps(listing).encode(),
                     oci.OCI_INDEX)
    assert keyless.bundles(reg, "torch", digest) == []


def test_the_issuer_extension_is_read_in_both_der_length_forms() -> None:
    assert keyless._der_utf8(b"\x0c\x03abc") == b"abc"
    long = b"x" * 200
    assert keyless._der_utf8(b"\x0c\x81\xc8" + long) == long
    assert keyless._der_utf8(b"\x04\x01a") == b""


GITHUB_JOB = {"GITHUB_ACTIONS": "true", "ACTIONS_ID_TOKEN_REQUEST_URL": "https://t.example/?v=2",
              "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "request-token"}


def test_a_github_job_that_may_ask_for_a_token_signs_with_one_asked_for_when_signing() -> None:
    """No token fetched up front in a GitHub job (it could expire before a long build signs):
    AMBIENT, unless --identity-token or SIGSTORE_ID_TOKEN names one; outside such a job, none."""
    assert keyless.identity_token(None, GITHUB_JOB) == keyless.AMBIENT
    assert keyless.identity_token(None, {**GITHUB_JOB, "SIGSTORE_ID_TOKEN": "tok"}) == "tok"
    assert keyless.identity_token(None, {"GITHUB_ACTIONS": "true"}) is None
    assert keyless.identity_token(None, {}) is None


def test_the_ambient_token_is_asked_of_the_provider_and_its_absence_is_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import sigstore.oidc

    monkeypatch.setattr(sigstore.oidc, "detect_credential", lambda: "fresh.jwt.token")
    assert keyless.ambient_token() == "fresh.jwt.token"
    monkeypatch.setattr(sigstore.oidc, "detect_credential", lambda: None)
    with pytest.raises(BuilderError, match="OIDC provider gave no token") as caught:
        keyless.ambient_token()
    assert "id-token: write" in (caught.value.hint or "")
