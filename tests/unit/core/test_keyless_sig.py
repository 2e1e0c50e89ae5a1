"""builder.core.keyless_sig: cosign's older keyless format (certificate, chain and Rekor SET in
the `.sig` layer's annotations). A signature stock cosign made through sigstore's public good
(containers/image's fixture, tests/fixtures/cosign) verifies against the pinned root; layers
made the same way against the mock sigstore (tests/fixtures/sigstore_mock) verify by identity,
and each forgery is refused with one line naming why."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from test_keyless import ReferrerlessRegistry

from builder.core import keyless, keyless_sig, oci, sign
from builder.flows import verify_keyless

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
MOCK = FIXTURES / "sigstore_mock"
ROOT = MOCK / "cosign_sig_trusted_root.json"
ISSUER = keyless.GITHUB_ISSUER
WORKFLOW = "https://github.com/torch-images/torch-images/.github/workflows/build.yml"
MAIN = f"{WORKFLOW}@refs/heads/main"


def fixture(name: str) -> tuple[sign.Layer, str, str]:
    """(the layer, the repository it names, the digest it signs) of a fixture file."""
    doc = json.loads((MOCK / name).read_text())
    layer = sign.Layer(doc["mediaType"], base64.b64decode(doc["payload"]), doc["annotations"])
    return layer, doc["reference"], doc["digest"]


def policy(*identities: keyless.Identity, root: Path = ROOT) -> keyless.KeylessPolicy:
    return keyless.KeylessPolicy(identities or (keyless.Identity(ISSUER, MAIN),), root)


def annotated(layer: sign.Layer, **changes: str) -> sign.Layer:
    return sign.Layer(layer.media_type, layer.data, {**layer.annotations, **changes})


def test_a_keyless_signature_stock_cosign_made_verifies_against_the_public_good() -> None:
    """containers/image's fixture: cosign (2023) through sigstore's public Fulcio and Rekor."""
    doc = json.loads((FIXTURES / "cosign" / "fulcio-rekor-signature-1.json").read_text())
    layer = sign.Layer(doc["mimeType"], base64.b64decode(doc["payload"]), doc["annotations"])
    digest = oci.sha256((FIXTURES / "cosign" / "fulcio-rekor-manifest.json").read_bytes())
    reference = "192.168.64.2:5000/cosign-signed/fulcio-rekor-1"
    person = keyless.Identity("https://github.com/login/oauth", "mitr@redhat.com")
    public_good = policy(person, root=keyless.PUBLIC_GOOD_ROOT)
    assert keyless_sig.verify_layer(layer, reference, digest, public_good) == keyless.Signer(
        "mitr@redhat.com", "https://github.com/login/oauth")
    with pytest.raises(keyless.KeylessError, match=r"^another issuer: signed through https://"
                       r"github\.com/login/oauth"):
        keyless_sig.verify_layer(layer, reference, digest,
                                 policy(root=keyless.PUBLIC_GOOD_ROOT))
    with pytest.raises(keyless.KeylessError, match="no log of the trusted root"):
        keyless_sig.verify_layer(layer, reference, digest, policy(person))  # the mock's root


def test_the_genuine_layer_verifies_by_identity_and_by_regexp() -> None:
    layer, reference, digest = fixture("cosign_sig.json")
    signer = keyless_sig.verify_layer(layer, reference, digest, policy())
    assert signer == keyless.Signer(MAIN, ISSUER)
    regexp = keyless.Identity(ISSUER, regexp=r"https://github\.com/torch-images/.*@refs/heads/main")
    assert keyless_sig.verify_layer(layer, reference, digest, policy(regexp)) == signer


def _set_of(name: str) -> str:
    return fixture(name)[0].annotations[keyless_sig.BUNDLE_ANNOTATION]


def _later(bundle: str) -> str:
    doc = json.loads(bundle)
    doc["Payload"]["integratedTime"] += 60
    return json.dumps(doc)


@pytest.mark.parametrize(("case", "reason"), [
    ("another identity", f"another identity: signed by {MAIN}, trusted: {WORKFLOW}@refs/heads/dev"),
    ("another issuer", f"another issuer: signed through {ISSUER}"),
    ("a pull-request regexp", "another identity: signed by"),
    ("another digest", "it signs sha256:abab"),
    ("another repository", "it names registry.example/torch, not registry.example/other"),
    ("another root", "a signed entry timestamp that no log of the trusted root signed"),
    ("a SET of another signature", "a log entry that does not include the signature"),
    ("a SET changed", "a signed entry timestamp that no log of the trusted root signed"),
    ("another payload", "the signature does not verify with the certificate's key"),
    ("no SET", "a keyless signature without its dev.sigstore.cosign/bundle"),
    ("a malformed certificate", "a malformed keyless signature"),
    ("expired when logged", "a certificate outside its validity at signing time"),
])
def test_a_forgery_is_refused_with_one_line_naming_why(case: str, reason: str) -> None:
    layer, reference, digest = fixture("cosign_sig.json")
    trusted = policy()
    if case == "another identity":
        trusted = policy(keyless.Identity(ISSUER, f"{WORKFLOW}@refs/heads/dev"))
    elif case == "another issuer":
        trusted = policy(keyless.Identity("https://gitlab.com", MAIN))
    elif case == "a pull-request regexp":
        trusted = policy(keyless.Identity(ISSUER, regexp=r".*@refs/pull/.*"))
    elif case == "another digest":
        digest = "sha256:" + "cd" * 32
    elif case == "another repository":
        reference = "registry.example/other"
    elif case == "another root":
        trusted = policy(root=MOCK / "trusted_root.json")
    elif case == "a SET of another signature":  # genuine, same log: another layer's entry
        layer = annotated(layer, **{keyless_sig.BUNDLE_ANNOTATION: _set_of("cosign_sig_other.json")})
    elif case == "a SET changed":
        layer = annotated(layer, **{keyless_sig.BUNDLE_ANNOTATION: _later(_set_of(
            "cosign_sig.json"))})
    elif case == "another payload":
        layer = sign.Layer(layer.media_type, sign.simple_signing_payload(reference, digest, {
            "tag:x": "signed"}), layer.annotations)
    elif case == "no SET":
        layer = sign.Layer(layer.media_type, layer.data, {
            k: v for k, v in layer.annotations.items() if k != keyless_sig.BUNDLE_ANNOTATION})
    elif case == "a malformed certificate":
        layer = annotated(layer, **{keyless_sig.CERTIFICATE_ANNOTATION: "-----BEGIN CERTIFICATE"
                                    "-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"})
    elif case == "expired when logged":
        layer, reference, digest = fixture("cosign_sig_expired.json")
        trusted = policy(root=MOCK / "cosign_sig_expired_trusted_root.json")
    with pytest.raises(keyless.KeylessError) as refused:
        keyless_sig.verify_layer(layer, reference, digest, trusted)
    assert reason in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(("part", "reason"), [
    ("certificateAuthorities", "a certificate that does not chain to the trusted root's CA"),
    ("ctlogs", "the certificate's SCT does not verify"),
])
def test_a_root_with_another_ca_or_ct_log_refuses_the_certificate(
        tmp_path: Path, part: str, reason: str) -> None:
    """The log of the trusted root vouches for the time, but its Fulcio CA (or CT log) is
    another mock's: the chain (or the SCT) refuses the certificate."""
    root = json.loads(ROOT.read_text())
    root[part] = json.loads((MOCK / "trusted_root.json").read_text())[part]
    (tmp_path / "root.json").write_text(json.dumps(root))
    with pytest.raises(keyless.KeylessError) as refused:
        keyless_sig.verify_layer(*fixture("cosign_sig.json"), policy(root=tmp_path / "root.json"))
    assert str(refused.value).startswith(reason)


def _registry_with(layers: list[sign.Layer], digest: str) -> ReferrerlessRegistry:
    """A registry named as the fixtures' payloads name it, `.sig` of `digest` holding `layers`
    (and no bundle)."""
    reg = ReferrerlessRegistry("registry.example")
    sign.write_layers(reg, "torch", sign.sig_tag(digest), layers)
    return reg


def test_verify_reads_the_old_format_from_sig_when_no_bundle_signs_the_image() -> None:
    layer, _, digest = fixture("cosign_sig.json")
    other = fixture("cosign_sig_other.json")[0]
    key_signed = sign.Layer(sign.SIMPLE_SIGNING, layer.data, {
        sign.SIGNATURE_ANNOTATION: layer.annotations[sign.SIGNATURE_ANNOTATION]})
    reg = _registry_with([key_signed, other, layer], digest)
    verified = verify_keyless.statements(reg, "torch", digest, policy())
    assert verified is not None
    signer, detail = verify_keyless.image_signature(verified, digest)
    assert signer == keyless.Signer(MAIN, ISSUER)
    assert detail == f"cosign keyless signature (.sig) over {digest[:19]} by {signer.describe()}"
    assert verified[1] == [f"cosign .sig: it signs sha256:{'cd' * 32}, not {digest}"]
    assert keyless_sig.keyless_layers([key_signed, other, layer], sign.SIMPLE_SIGNING) == [
        other, layer]


def test_an_unverified_old_format_signature_is_named_in_the_row() -> None:
    layer, _, digest = fixture("cosign_sig.json")
    reg = _registry_with([layer], digest)
    verified = verify_keyless.statements(
        reg, "torch", digest, policy(keyless.Identity(ISSUER, f"{WORKFLOW}@refs/heads/dev")))
    assert verified is not None
    assert verify_keyless.image_signature(verified, digest) == (
        None, f"keyless: cosign .sig: another identity: signed by {MAIN}, trusted: "
        f"{WORKFLOW}@refs/heads/dev ({ISSUER})")



def test_a_keyless_attestation_verifies_and_its_forgeries_are_refused() -> None:
    """`cosign attest` before bundles: a DSSE envelope in `.att`, logged as an intoto entry."""
    layer, _, digest = fixture("cosign_att.json")
    statement, signer = keyless_sig.verify_attestation(layer, digest, policy())
    assert (statement["predicateType"], signer) == (sign.PREDICATES["sbom"],
                                                     keyless.Signer(MAIN, ISSUER))
    assert statement["predicate"] == {"bomFormat": "CycloneDX"}
    envelope = json.loads(layer.data)
    envelope["payload"] = base64.b64encode(json.dumps(
        {**statement, "predicate": {"bomFormat": "forged"}}).encode()).decode()
    forged = sign.Layer(layer.media_type, json.dumps(envelope).encode(), layer.annotations)
    spliced = annotated(layer, **{keyless_sig.BUNDLE_ANNOTATION: _set_of("cosign_sig.json")})
    for bad, trusted, why in [
            (forged, policy(), "the attestation: its signature does not verify"),
            (spliced, policy(), "a log entry that does not include the signature"),
            (layer, policy(keyless.Identity(ISSUER, f"{WORKFLOW}@refs/heads/dev")),
             "another identity"),
    ]:
        with pytest.raises(keyless.KeylessError, match=why):
            keyless_sig.verify_attestation(bad, digest, trusted)
    with pytest.raises(keyless.KeylessError, match="the attestation: its subject is not"):
        keyless_sig.verify_attestation(layer, "sha256:" + "cd" * 32, policy())


def test_verify_takes_an_attestation_from_att_when_no_bundle_states_it() -> None:
    layer, _, digest = fixture("cosign_att.json")
    reg = _registry_with([], digest)
    sign.write_layers(reg, "torch", sign.att_tag(digest), [layer])
    verified = verify_keyless.statements(reg, "torch", digest, policy())
    assert verified is not None
    found = verify_keyless.attestations(verified, digest)
    assert found["sbom"][0]["predicate"] == {"bomFormat": "CycloneDX"}
    assert found["sbom"][1] == (f"{sign.PREDICATES['sbom']}, cosign keyless .att by "
                                f"{MAIN} ({ISSUER}), subject {digest[:19]}")
    assert found["smoke"][0] is None
    assert verify_keyless.image_signature(verified, digest) == (None, "no sigstore bundle attached")
