"""cosign's older keyless format: what `cosign sign` wrote before sigstore bundles (and still
writes without `--new-bundle-format`), read by `builder verify --certificate-identity …`.

Each signature is one simple-signing layer of `REPO:sha256-H.sig` (builder.core.sign) whose
annotations carry, beside the signature (`dev.cosignproject.cosign/signature`), the Fulcio leaf
certificate (`dev.sigstore.cosign/certificate`, PEM), its chain (`dev.sigstore.cosign/chain`)
and Rekor's signed entry timestamp (`dev.sigstore.cosign/bundle`: `{SignedEntryTimestamp,
Payload: {body, integratedTime, logIndex, logID}}`, cosign's pkg/cosign/bundle). A layer counts
only when, as for a bundle (builder.core.keyless): the SET verifies with a Rekor key of the
trusted root, so its integratedTime is the signing time; the certificate chains to the trusted
root's Fulcio CA and was valid at that time, carries a valid SCT, is for code signing, and names
a trusted identity through the trusted issuer; the signature over the payload verifies with the
certificate's key; the logged body is the hashedrekord of exactly this payload's sha256, this
signature and this certificate; and the payload names this repository and digest.

Why not `Bundle.from_parts` and sigstore-python's verifier: the old format has a SET but no
inclusion proof, and sigstore-python (4.x) refuses any log entry without an inclusion proof and
checkpoint, whatever the bundle version. So the steps are sigstore's own, taken one by one: its
trusted root and Rekor keyring (the SET over RFC 8785 JSON, as its `_verify_set`), cryptography's
path validation with the EKU overrides sigstore's `_verify_chain_at_time` uses, its SCT check,
and the identity policy bundles use (keyless._check_identity). The `chain` annotation is not
trusted: the chain is built from the trusted root alone, as sigstore does.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from builder.core import oci, sign
from builder.core.errors import BuilderError
from builder.core.keyless import (
    MAX_BUNDLES,
    KeylessError,
    KeylessPolicy,
    Signer,
    _check_identity,
    _one_line,
    signer_of,
)

CERTIFICATE_ANNOTATION = "dev.sigstore.cosign/certificate"
CHAIN_ANNOTATION = "dev.sigstore.cosign/chain"
BUNDLE_ANNOTATION = "dev.sigstore.cosign/bundle"


@dataclass(frozen=True, kw_only=True)
class Entry:
    """Rekor's promise (the `dev.sigstore.cosign/bundle` annotation): the logged body, when,
    where, and the log's signature over them."""

    body: str  # base64 of the canonicalized entry
    integrated_time: int
    log_index: int
    log_id: str  # hex
    signed_entry_timestamp: bytes

    def logged_at(self) -> datetime:
        return datetime.fromtimestamp(self.integrated_time, UTC)


@cache
def _trusted_root(root: Path) -> Any:
    from sigstore.models import TrustedRoot

    try:
        return TrustedRoot.from_file(str(root))
    except (OSError, ValueError) as exc:
        raise BuilderError(f"{root}: not a sigstore trusted root ({exc})",
                           hint="give --trusted-root a trusted_root.json") from None


def signed_layers(layers: list[sign.Layer]) -> list[sign.Layer]:
    """The `.sig` layers in the keyless format (a certificate annotation; the key's have none),
    at most keyless.MAX_BUNDLES of them: whoever can push can add layers, each costs checks."""
    return [x for x in layers if x.media_type == sign.SIMPLE_SIGNING
            and CERTIFICATE_ANNOTATION in x.annotations][:MAX_BUNDLES]


def verify_layer(layer: sign.Layer, reference: str, digest: str, policy: KeylessPolicy
                 ) -> Signer:
    """Who signed `layer` when every check of the module docstring passes; KeylessError with
    one line naming the first that does not (a malformed part, parsed lazily, included)."""
    try:
        return _verified(layer, reference, digest, policy)
    except ValueError as exc:
        raise KeylessError(f"a malformed keyless signature ({_one_line(exc)})") from None


def _verified(layer: sign.Layer, reference: str, digest: str, policy: KeylessPolicy) -> Signer:
    certificate, signature, entry = _parts(layer.annotations)
    root = _trusted_root(policy.trusted_root)
    _check_set(root, entry)
    logged = entry.logged_at()
    if not certificate.not_valid_before_utc <= logged <= certificate.not_valid_after_utc:
        raise KeylessError(
            f"a certificate outside its validity at signing time (valid "
            f"{certificate.not_valid_before_utc:%Y-%m-%d %H:%M:%S}–"
            f"{certificate.not_valid_after_utc:%H:%M:%S} UTC, logged {logged:%H:%M:%S})")
    _check_certificate(root, certificate, logged)
    signer = signer_of(certificate)
    if not policy.any_identity:
        _check_identity(signer, policy.identities)
    try:
        key = certificate.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise KeylessError("the certificate's key is not an ECDSA key")
        key.verify(signature, layer.data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise KeylessError("the signature does not verify with the certificate's key") \
            from None
    _check_body(entry, layer.data, signature, certificate)
    if problem := sign.check_payload(layer.data, reference, digest):
        raise KeylessError(problem)
    return signer


def verified_signers(reg: oci.Registry, repository: str, digest: str, policy: KeylessPolicy
                     ) -> tuple[list[Signer], list[str]]:
    """Who signed the keyless layers of `digest`'s `.sig` that verify (each once), and one
    reason per layer that does not."""
    good: list[Signer] = []
    refused: list[str] = []
    reference = f"{reg.registry}/{repository}"
    for layer in signed_layers(sign.read_layers(reg, repository, sign.sig_tag(digest))):
        try:
            good.append(verify_layer(layer, reference, digest, policy))
        except KeylessError as exc:
            refused.append(f"cosign .sig: {exc}")
    return list(dict.fromkeys(good)), refused


# ---- the parts and their checks ---------------------------------------------------------------


def _parts(annotations: dict[str, str]) -> tuple[x509.Certificate, bytes, Entry]:
    try:
        certificate = x509.load_pem_x509_certificate(annotations[CERTIFICATE_ANNOTATION].encode())
        signature = base64.b64decode(annotations[sign.SIGNATURE_ANNOTATION], validate=True)
        doc = json.loads(annotations[BUNDLE_ANNOTATION])
        payload = doc["Payload"]
        entry = Entry(body=str(payload["body"]), integrated_time=int(payload["integratedTime"]),
                      log_index=int(payload["logIndex"]), log_id=str(payload["logID"]),
                      signed_entry_timestamp=base64.b64decode(doc["SignedEntryTimestamp"]))
    except KeyError as exc:
        raise KeylessError(f"a keyless signature without its {exc.args[0]}") from None
    except (ValueError, TypeError) as exc:
        raise KeylessError(f"a malformed keyless signature ({_one_line(exc)})") from None
    return certificate, signature, entry


def _check_set(root: Any, entry: Entry) -> None:
    """The log's signature over its promise (RFC 8785 JSON of the four fields), by a Rekor key
    of the trusted root: only then is integratedTime a signing time anyone vouched for."""
    import rfc8785
    from sigstore._internal.trust import KeyringPurpose
    from sigstore.errors import VerificationError

    promise = rfc8785.dumps({"body": entry.body, "integratedTime": entry.integrated_time,
                             "logID": entry.log_id, "logIndex": entry.log_index})
    try:
        root.rekor_keyring(KeyringPurpose.VERIFY).verify(
            key_id=bytes.fromhex(entry.log_id), signature=entry.signed_entry_timestamp,
            data=promise)
    except (VerificationError, ValueError):
        raise KeylessError("a signed entry timestamp that no log of the trusted root signed") \
            from None


def _check_certificate(root: Any, certificate: x509.Certificate, logged: datetime) -> None:
    """The chain to the trusted root's Fulcio CA at the logged time, the SCT, code signing."""
    from cryptography.x509.verification import (
        Criticality,
        ExtensionPolicy,
        PolicyBuilder,
        Store,
        VerificationError,
    )
    from sigstore._internal.sct import verify_sct
    from sigstore._internal.trust import KeyringPurpose
    from sigstore.errors import VerificationError as SigstoreError

    def policy(base: ExtensionPolicy) -> ExtensionPolicy:
        return base.may_be_present(x509.ExtendedKeyUsage, Criticality.NON_CRITICAL, None)

    verifier = (PolicyBuilder().store(Store(root.get_fulcio_certs())).time(logged)
                .extension_policies(ca_policy=policy(ExtensionPolicy.webpki_defaults_ca()),
                                    ee_policy=policy(ExtensionPolicy.webpki_defaults_ee()))
                .build_client_verifier())
    try:
        chain = verifier.verify(certificate, []).chain[1:]
    except (VerificationError, x509.UnsupportedGeneralNameType) as exc:
        raise KeylessError(f"a certificate that does not chain to the trusted root's CA "
                           f"({_one_line(exc)})") from None
    try:
        verify_sct(certificate, chain, root.ct_keyring(KeyringPurpose.VERIFY))
        usage = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except (SigstoreError, x509.ExtensionNotFound) as exc:
        raise KeylessError(f"the certificate's SCT does not verify ({_one_line(exc)})") \
            from None
    if x509.oid.ExtendedKeyUsageOID.CODE_SIGNING not in usage:
        raise KeylessError("a certificate that is not for code signing")


def _check_body(entry: Entry, payload: bytes, signature: bytes,
                certificate: x509.Certificate) -> None:
    """The logged entry must be the hashedrekord of this payload, signature and certificate:
    a genuine SET of another signature vouches for nothing here."""
    try:
        body = json.loads(base64.b64decode(entry.body))
        spec = body["spec"]
        logged = (body["kind"], spec["data"]["hash"]["algorithm"],
                  spec["data"]["hash"]["value"], base64.b64decode(spec["signature"]["content"]),
                  x509.load_pem_x509_certificate(
                      base64.b64decode(spec["signature"]["publicKey"]["content"])))
    except (ValueError, KeyError, TypeError):
        raise KeylessError("a log entry that is not a hashedrekord of a certificate") from None
    expected = ("hashedrekord", "sha256", hashlib.sha256(payload).hexdigest(), signature,
                certificate)
    if logged != expected:
        raise KeylessError("a log entry that does not include the signature (it logs "
                           "another payload, signature or certificate)")
