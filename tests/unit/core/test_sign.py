"""builder.core.keypair and builder.core.sign: cosign key files, simple signing against a signature made by stock cosign
(tests/fixtures/cosign: containers/image's fixture, Apache-2.0 — see its README), DSSE
attestations, and the `.sig`/`.att` layout read back from an in-memory registry."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from builder.core import keypair, oci, sign
from builder.core.errors import BuilderError

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "cosign"
DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64


class MemoryRegistry:
    """The part of oci.Registry that sign.py uses, in memory."""

    def __init__(self) -> None:
        self.registry = "r.example:5000"
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[tuple[str, str], bytes] = {}

    def manifest(self, repository: str, ref: str) -> tuple[bytes, oci.Descriptor] | None:
        body = self.manifests.get((repository, ref))
        if body is None:
            return None
        return body, oci.Descriptor(oci.sha256(body), oci.OCI_MANIFEST, len(body))

    def put_manifest(self, repository: str, ref: str, body: bytes, media_type: str) -> str:
        self.manifests[(repository, ref)] = body
        return oci.sha256(body)

    def push_blob(self, repository: str, data: bytes) -> str:
        self.blobs[oci.sha256(data)] = data
        return oci.sha256(data)

    def blob(self, repository: str, digest: str) -> bytes:
        return self.blobs[digest]


def new_key() -> keypair.SigningKey:
    return keypair.SigningKey(ec.generate_private_key(ec.SECP256R1()))


# ---- the fixture made by stock cosign ---------------------------------------------------------


def fixture_layer() -> tuple[bytes, bytes, str]:
    doc = json.loads((FIXTURE / "signature-1.json").read_text())
    assert doc["mimeType"] == sign.SIMPLE_SIGNING
    return (base64.b64decode(doc["payload"]),
            base64.b64decode(doc["annotations"][sign.SIGNATURE_ANNOTATION]),
            oci.sha256((FIXTURE / "manifest.json").read_bytes()))


def test_a_signature_made_by_stock_cosign_verifies() -> None:
    payload, signature, digest = fixture_layer()
    key = keypair.load_public(FIXTURE / "cosign.pub")
    assert keypair.verifies([key], payload, signature)
    identity = "192.168.64.2:5000/cosign-signed-single-sample"
    assert sign.check_payload(payload, identity, digest) == ""
    assert "not sha256:" in sign.check_payload(payload, identity, OTHER)
    assert "names" in sign.check_payload(payload, "192.168.64.2:5000/other", digest)
    assert not keypair.verifies([new_key().public], payload, signature)
    assert not keypair.verifies([key], payload.replace(b"sample", b"sampl3"), signature)


def test_our_payload_is_cosigns_byte_for_byte() -> None:
    payload, _, digest = fixture_layer()
    ours = sign.simple_signing_payload("192.168.64.2:5000/cosign-signed-single-sample", digest)
    assert ours == payload
    assert json.loads(ours) == json.loads(payload)  # and so field for field


def test_a_layer_we_sign_is_shaped_like_cosigns() -> None:
    reg = MemoryRegistry()
    key = new_key()
    sign.sign_image(reg, "torch", DIGEST, key)  # type: ignore[arg-type]
    manifest = json.loads(reg.manifests[("torch", sign.sig_tag(DIGEST))])
    assert manifest["mediaType"] == oci.OCI_MANIFEST
    (layer,) = manifest["layers"]
    cosign = json.loads((FIXTURE / "signature-1.json").read_text())
    assert layer["mediaType"] == cosign["mimeType"]
    assert set(layer["annotations"]) == set(cosign["annotations"])
    payload = reg.blobs[layer["digest"]]
    assert json.loads(payload) == {
        **json.loads(base64.b64decode(cosign["payload"])),
        "critical": {"identity": {"docker-reference": "r.example:5000/torch"},
                     "image": {"docker-manifest-digest": DIGEST},
                     "type": "cosign container image signature"}}


# ---- keys -------------------------------------------------------------------------------------


def test_keygen_writes_a_cosign_pair_that_loads_back(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSIGN_PASSWORD", "s3cret")
    key_path, pub_path = keypair.keygen(tmp_path)
    assert key_path.stat().st_mode & 0o777 == 0o600
    text = key_path.read_text()
    assert text.startswith("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    doc = json.loads(base64.b64decode("".join(text.splitlines()[1:-1])))
    assert doc["kdf"]["name"] == "scrypt" and doc["kdf"]["params"] == {"N": 32768, "r": 8, "p": 1}
    assert doc["cipher"]["name"] == "nacl/secretbox"
    key = keypair.signing_key(key_path)
    assert key is not None
    assert keypair.public_pem(key.public) == pub_path.read_bytes()
    monkeypatch.setenv("COSIGN_PRIVATE_KEY", text)
    from_env = keypair.signing_key(None)
    assert from_env is not None and keypair.key_id(from_env.public) == keypair.key_id(key.public)
    with pytest.raises(BuilderError, match="exists: not overwritten"):
        keypair.keygen(tmp_path)
    monkeypatch.setenv("COSIGN_PASSWORD", "wrong")
    with pytest.raises(BuilderError, match="wrong password"):
        keypair.signing_key(key_path)


def test_no_key_means_no_signing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COSIGN_PRIVATE_KEY", raising=False)
    assert keypair.signing_key(None) is None


def test_a_file_that_is_not_a_key_is_named(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("hello")
    with pytest.raises(BuilderError, match=r"k: not a cosign private key"):
        keypair.signing_key(tmp_path / "k")
    with pytest.raises(BuilderError, match=r"k: not a PEM public key"):
        keypair.load_public(tmp_path / "k")


# ---- signatures and attestations in the registry ----------------------------------------------


def test_signature_verifies_only_with_its_key_its_digest_and_its_repository() -> None:
    reg, key = MemoryRegistry(), new_key()
    sign.sign_image(reg, "torch", DIGEST, key)  # type: ignore[arg-type]
    sign.sign_image(reg, "torch", DIGEST, key)  # type: ignore[arg-type]  # idempotent
    layers = json.loads(reg.manifests[("torch", sign.sig_tag(DIGEST))])["layers"]
    assert len(layers) == 1
    assert "cosign signature" in sign.verify_image(reg, "torch", DIGEST, [key.public])  # type: ignore[arg-type]
    with pytest.raises(sign.SignatureError, match="another key"):
        sign.verify_image(reg, "torch", DIGEST, [new_key().public])  # type: ignore[arg-type]
    # the .sig copied onto another image: the payload names the first digest
    reg.manifests[("torch", sign.sig_tag(OTHER))] = reg.manifests[("torch", sign.sig_tag(DIGEST))]
    with pytest.raises(sign.SignatureError, match=f"it signs {DIGEST}, not {OTHER}"):
        sign.verify_image(reg, "torch", OTHER, [key.public])  # type: ignore[arg-type]
    # ... or onto the same digest in another repository
    reg.manifests[("other", sign.sig_tag(DIGEST))] = reg.manifests[("torch", sign.sig_tag(DIGEST))]
    with pytest.raises(sign.SignatureError, match=r"names r\.example:5000/torch"):
        sign.verify_image(reg, "other", DIGEST, [key.public])  # type: ignore[arg-type]
    with pytest.raises(sign.SignatureError, match="no signature"):
        sign.verify_image(reg, "torch", "sha256:" + "c" * 64, [key.public])  # type: ignore[arg-type]


def test_an_attestation_made_by_cosign_verifies_and_ours_has_its_shape() -> None:
    """cosign's DSSE envelope (kyverno's fixture, see tests/fixtures/cosign/README.md): its
    signature verifies over the same pre-authentication encoding we sign, and our envelope and
    statement have its fields."""
    data = (FIXTURE / "attestation-1.dsse.json").read_bytes()
    key = keypair.load_public(FIXTURE / "attestation.pub")
    env = sign.verify_envelope(data, [key])
    with pytest.raises(sign.SignatureError, match="does not verify"):
        sign.verify_envelope(data, [new_key().public])
    theirs = json.loads(data)
    statement = json.loads(env.payload)
    assert statement["subject"][0]["digest"]["sha256"].startswith("b31bfb4d")
    ours = json.loads(sign.envelope(new_key(), sign.statement(
        "r/torch", DIGEST, sign.PREDICATES["smoke"], {"status": "pass"})))
    assert set(ours) == set(theirs)
    assert [set(s) for s in ours["signatures"]] == [set(s) for s in theirs["signatures"]]
    assert ours["signatures"][0]["keyid"] == theirs["signatures"][0]["keyid"] == ""
    mine = json.loads(base64.b64decode(ours["payload"]))
    assert set(mine) == set(statement) == {"_type", "predicateType", "subject", "predicate"}
    assert set(mine["subject"][0]) == set(statement["subject"][0]) == {"name", "digest"}
    # cosign 1.x named the predicate as payloadType; builder requires in-toto's (cosign 2+)
    with pytest.raises(sign.SignatureError, match="payload type"):
        sign.open_envelope(data, [key], "sha256:" + statement["subject"][0]["digest"]["sha256"])


def test_envelope_is_dsse_with_an_in_toto_statement() -> None:
    key = new_key()
    doc = sign.statement("r/torch", DIGEST, sign.PREDICATES["sbom"], {"bomFormat": "CycloneDX"})
    env = json.loads(sign.envelope(key, doc))
    assert set(env) == {"payload", "payloadType", "signatures"}
    assert env["payloadType"] == "application/vnd.in-toto+json"
    assert env["signatures"][0]["keyid"] == ""
    payload = base64.b64decode(env["payload"])
    pae = b"DSSEv1 28 application/vnd.in-toto+json %d %b" % (len(payload), payload)
    assert keypair.verifies([key.public], pae, base64.b64decode(env["signatures"][0]["sig"]))
    statement = json.loads(payload)
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["subject"] == [{"name": "r/torch", "digest": {"sha256": "a" * 64}}]
    assert sign.open_envelope(sign.envelope(key, doc), [key.public], DIGEST) == doc
    with pytest.raises(sign.SignatureError, match="subject is not"):
        sign.open_envelope(sign.envelope(key, doc), [key.public], OTHER)
    with pytest.raises(sign.SignatureError, match="does not verify"):
        sign.open_envelope(sign.envelope(new_key(), doc), [key.public], DIGEST)
    tampered = {**env, "payload": base64.b64encode(payload.replace(b"CycloneDX", b"Evil")).decode()}
    with pytest.raises(sign.SignatureError, match="does not verify"):
        sign.open_envelope(json.dumps(tampered).encode(), [key.public], DIGEST)


def test_attestations_are_found_by_predicate_type_and_replaced() -> None:
    reg, key = MemoryRegistry(), new_key()
    for kind in ("sbom", "smoke"):
        sign.attest(reg, "torch", DIGEST, key, kind, {"v": 1})  # type: ignore[arg-type]
    sign.attest(reg, "torch", DIGEST, key, "sbom", {"v": 1})  # type: ignore[arg-type]  # same: kept
    sign.attest(reg, "torch", DIGEST, key, "smoke", {"v": 2})  # type: ignore[arg-type]  # replaced
    manifest = json.loads(reg.manifests[("torch", sign.att_tag(DIGEST))])
    assert [x["mediaType"] for x in manifest["layers"]] == [sign.DSSE_TYPE] * 2
    found, problems = sign.verified_attestations(reg, "torch", DIGEST, [key.public])  # type: ignore[arg-type]
    assert {kind: doc["predicate"] for kind, doc in found.items()} == {"sbom": {"v": 1},
                                                                       "smoke": {"v": 2}}
    assert problems == {"provenance": f"no signed attestation ({sign.att_tag(DIGEST)})"}
    found, problems = sign.verified_attestations(reg, "torch", DIGEST, [new_key().public])  # type: ignore[arg-type]
    assert found == {} and "does not verify" in problems["sbom"]


def cosign_style_envelope(statement: dict, *keys: keypair.SigningKey) -> bytes:
    """A DSSE envelope laid out as cosign (go-securesystemslib's dsse, through sigstore's
    WrapMultiSigner) marshals it: payloadType first, standard base64, one
    `{"keyid": "", "sig": …}` per signer, each over the same pre-authentication encoding."""
    payload = json.dumps(statement).encode()
    pae = b"DSSEv1 %d %b %d %b" % (len(sign.INTOTO_PAYLOAD), sign.INTOTO_PAYLOAD.encode(),
                                   len(payload), payload)
    return json.dumps({"payloadType": sign.INTOTO_PAYLOAD,
                       "payload": base64.b64encode(payload).decode(),
                       "signatures": [{"keyid": "", "sig": base64.b64encode(k.sign(pae)).decode()}
                                      for k in keys]}).encode()


def test_a_cosign_envelope_with_two_empty_keyid_signatures_verifies_by_either_key() -> None:
    trusted, other = new_key(), new_key()
    doc = sign.statement("r/torch", DIGEST, sign.PREDICATES["smoke"], {"status": "pass"})
    for order in ((other, trusted), (trusted, other)):
        data = cosign_style_envelope(doc, *order)
        assert [s["keyid"] for s in json.loads(data)["signatures"]] == ["", ""]
        assert sign.open_envelope(data, [trusted.public], DIGEST) == doc
    with pytest.raises(sign.SignatureError, match="does not verify"):
        sign.open_envelope(cosign_style_envelope(doc, other, other), [trusted.public], DIGEST)
    # a keyid may be set or absent; URL-safe base64 is DSSE too
    env = json.loads(cosign_style_envelope(doc, other, trusted))
    env["signatures"][0]["keyid"] = env["signatures"][1]["keyid"] = "k1"
    del env["signatures"][0]["keyid"]
    env["signatures"][1]["sig"] = env["signatures"][1]["sig"].replace("+", "-").replace("/", "_")
    assert sign.open_envelope(json.dumps(env).encode(), [trusted.public], DIGEST) == doc
    with pytest.raises(sign.SignatureError, match="no signature"):
        sign.verify_envelope(json.dumps({**env, "signatures": []}).encode(), [trusted.public])
    for broken in ({**env, "signatures": [{"keyid": ""}]}, {**env, "payload": 7},
                   {**env, "signatures": [{"keyid": 3, "sig": "AA=="}]}):
        with pytest.raises(sign.SignatureError, match="not a DSSE envelope"):
            sign.verify_envelope(json.dumps(broken).encode(), [trusted.public])


def test_keygen_refuses_symlinks_and_turns_file_errors_into_one_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSIGN_PASSWORD", "")
    with pytest.raises(BuilderError, match="no such folder") as missing:
        keypair.keygen(tmp_path / "missing")
    assert "mkdir -p" in (missing.value.hint or "")
    for name in ("cosign.pub", "cosign.key"):
        folder = tmp_path / name.replace(".", "-")
        folder.mkdir()
        (folder / name).symlink_to(tmp_path / "elsewhere")  # dangling
        with pytest.raises(BuilderError, match=f"{name} is a symlink"):
            keypair.keygen(folder)
        assert not (tmp_path / "elsewhere").exists()
        assert [p.name for p in folder.iterdir()] == [name]
    readonly = tmp_path / "ro"
    readonly.mkdir()
    monkeypatch.setattr(keypair.os, "open", lambda *a: (_ for _ in ()).throw(
        PermissionError(13, "Permission denied")))
    with pytest.raises(BuilderError, match=r"cosign\.key: cannot write the key file: Permission"):
        keypair.keygen(readonly)


def test_the_signature_names_the_variant_and_tags_and_a_new_publication_adds_one() -> None:
    reg, key = MemoryRegistry(), new_key()
    first = sign.tag_annotations("v1", ["a-20260101", "build-x", "a", "latest"])
    sign.sign_image(reg, "torch", DIGEST, key, first)  # type: ignore[arg-type]
    sign.sign_image(reg, "torch", DIGEST, key, first)  # type: ignore[arg-type]  # same: kept
    sign.sign_image(reg, "torch", DIGEST, key, sign.tag_annotations("v1", ["a-20260102"]))  # type: ignore[arg-type]
    payloads = sign.verified_payloads(reg, "torch", DIGEST, [key.public])  # type: ignore[arg-type]
    assert len(payloads) == 2
    assert payloads[0]["optional"] == {"tag:a": "signed", "tag:a-20260101": "signed",
                                       "tag:build-x": "signed", "tag:latest": "signed",
                                       "variant": "v1"}
    tags = set().union(*(sign.signed_tags(p["optional"]) for p in payloads))
    assert tags == {"a", "a-20260101", "a-20260102", "build-x", "latest"}
    assert sign.signed_tags(None) == set() and sign.signed_tags({"tag:x": "no"}) == set()
    with pytest.raises(sign.SignatureError, match="published unsigned"):
        sign.verified_payloads(reg, "torch", OTHER, [key.public])  # type: ignore[arg-type]


def test_a_key_with_unsigned_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSIGN_PASSWORD", "")
    key_path, _ = keypair.keygen(tmp_path)
    with pytest.raises(BuilderError, match="--unsigned with a signing key") as refused:
        keypair.trust(key_path, keypair.NOBODY, unsigned=True)
    assert "drop --unsigned" in (refused.value.hint or "")
    monkeypatch.setenv("COSIGN_PRIVATE_KEY", key_path.read_text())
    with pytest.raises(BuilderError, match="--unsigned with a signing key"):
        keypair.trust(None, keypair.NOBODY, unsigned=True)
    monkeypatch.delenv("COSIGN_PRIVATE_KEY")
    with pytest.raises(BuilderError, match="--unsigned with a signing key"):  # an OIDC token
        keypair.trust(None, keypair.NOBODY, unsigned=True, keyless=keypair.KeylessSigner("T"))
    assert keypair.trust(None, keypair.NOBODY, unsigned=True) == keypair.UNSIGNED
