"""`cosign sign` before bundles, step by step against the mock sigstore services
(tests/e2e/sigstore_mock/serve.js): an ephemeral P-256 key, a Fulcio certificate for the OIDC
token (v2 `signingCert`, a CSR), the simple-signing payload signed, a `hashedrekord` 0.0.1
entry of its sha256 logged in Rekor (v1 `log/entries`), and the `.sig` layer annotations cosign
writes from the answers (pkg/cosign/bundle: `{SignedEntryTimestamp, Payload: {body,
integratedTime, logIndex, logID}}`; the certificate and chain as PEM).

Run as a script it makes the unit tests' fixtures (tests/fixtures/sigstore_mock/README.md):
  python tests/e2e/legacy_cosign.py MOCK_FOLDER NAME DIGEST TOKEN_FILE [sig|att]"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from builder.core import keyless_sig, sign
from builder.core.keypair import SigningKey

REFERENCE = "registry.example/torch"  # the fixtures' repository (the e2e test passes its own)


def _post(url: str, doc: dict[str, Any], token: str = "") -> dict[str, Any]:
    request = urllib.request.Request(url, json.dumps(doc).encode(), method="POST", headers={
        "Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token
                                               else {})})
    with urllib.request.urlopen(request, timeout=30) as answer:  # loopback only: the mock
        return json.loads(answer.read())


def certificate(url: str, token: str, key: ec.EllipticCurvePrivateKey) -> list[str]:
    """Fulcio's chain for `key` (leaf first), PEM each."""
    csr = (x509.CertificateSigningRequestBuilder().subject_name(x509.Name([]))
           .sign(key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode())
    answer = _post(f"{url}/api/v2/signingCert", {
        "credentials": {"oidcIdentityToken": token}, "certificateSigningRequest": csr}, token)
    found = answer.get("signedCertificateEmbeddedSct") or answer["signedCertificateDetachedSct"]
    return list(found["chain"]["certificates"])


def _logged(url: str, proposed: dict[str, Any], leaf: str) -> dict[str, str]:
    """Rekor's answer to `proposed`, as the annotations cosign writes beside the signature."""
    [entry] = _post(f"{url}/api/v1/log/entries", proposed).values()
    bundle = {"SignedEntryTimestamp": entry["verification"]["signedEntryTimestamp"],
              "Payload": {"body": entry["body"], "integratedTime": entry["integratedTime"],
                          "logIndex": entry["logIndex"], "logID": entry["logID"]}}
    return {keyless_sig.CERTIFICATE_ANNOTATION: leaf,
            keyless_sig.BUNDLE_ANNOTATION: json.dumps(bundle, separators=(",", ":"))}


def _sha256(data: bytes) -> dict[str, str]:
    return {"algorithm": "sha256", "value": hashlib.sha256(data).hexdigest()}


def annotations(url: str, token: str, payload: bytes) -> dict[str, str]:
    """The `.sig` layer annotations cosign writes for a keyless signature of `payload`."""
    key = ec.generate_private_key(ec.SECP256R1())
    leaf, *chain = certificate(url, token, key)
    signature = base64.b64encode(key.sign(payload, ec.ECDSA(hashes.SHA256()))).decode()
    proposed = {"kind": "hashedrekord", "apiVersion": "0.0.1", "spec": {
        "signature": {"content": signature,
                      "publicKey": {"content": base64.b64encode(leaf.encode()).decode()}},
        "data": {"hash": _sha256(payload)}}}
    return {sign.SIGNATURE_ANNOTATION: signature, keyless_sig.CHAIN_ANNOTATION: "".join(chain),
            **_logged(url, proposed, leaf)}


def layer(url: str, token: str, reference: str, digest: str) -> sign.Layer:
    """One keyless `.sig` layer over `reference@digest`, as cosign writes it."""
    payload = sign.simple_signing_payload(reference, digest)
    return sign.Layer(sign.SIMPLE_SIGNING, payload, annotations(url, token, payload))


def attestation(url: str, token: str, reference: str, digest: str, predicate_type: str,
                predicate: Any) -> sign.Layer:
    """One keyless `.att` layer, as `cosign attest` wrote it before bundles: the DSSE envelope
    of the statement, an empty signature annotation, and an `intoto` 0.0.1 entry in the form
    Rekor stores (the envelope's and the payload's sha256, the certificate; the mock logs what
    it is sent, so the stored form is sent)."""
    key = ec.generate_private_key(ec.SECP256R1())
    leaf, *chain = certificate(url, token, key)
    doc = sign.statement(reference, digest, predicate_type, predicate)
    envelope = sign.envelope(SigningKey(key), doc)
    proposed = {"kind": "intoto", "apiVersion": "0.0.1", "spec": {
        "content": {"hash": _sha256(envelope),
                    "payloadHash": _sha256(json.dumps(doc, separators=(",", ":")).encode())},
        "publicKey": base64.b64encode(leaf.encode()).decode()}}
    return sign.Layer(sign.DSSE_TYPE, envelope, {
        sign.SIGNATURE_ANNOTATION: "", sign.PREDICATE_ANNOTATION: predicate_type,
        keyless_sig.CHAIN_ANNOTATION: "".join(chain), **_logged(url, proposed, leaf)})


def main(folder: str, name: str, digest: str, token_file: str, kind: str = "sig") -> None:
    url, token = Path(folder, "url").read_text(), Path(token_file).read_text().strip()
    made = layer(url, token, REFERENCE, digest) if kind == "sig" else attestation(
        url, token, REFERENCE, digest, sign.PREDICATES["sbom"], {"bomFormat": "CycloneDX"})
    Path(name).write_text(json.dumps({
        "reference": REFERENCE, "digest": digest, "mediaType": made.media_type,
        "payload": base64.b64encode(made.data).decode(), "annotations": made.annotations},
        indent=1) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
