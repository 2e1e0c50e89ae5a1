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
An attestation (`cosign attest` before bundles) is a DSSE envelope layer of `REPO:sha256-H.att`
with the same annotations (its signature annotation empty): the same checks, the envelope's
signature by the certificate's key, the statement's subject this digest, and the logged body an
`intoto` entry (0.0.1 or 0.0.2) whose hash is the envelope's sha256 and whose key is this
certificate (cosign's VerifyBundle compares exactly these).

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
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any, TypeVar

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from builder.core import oci, sign
from builder.core.errors import BuilderError
from builder.core.keyless import (
    IMAGE_PREDICATE,
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
# what stands for the image's statement when a keyless `.sig` layer signed it
IMAGE_STATEMENT = {"predicateType": IMAGE_PREDICATE, "format": "cosign .sig"}
Verified = tuple[dict[str, Any], Signer]
_T = TypeVar("_T")


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


def keyless_layers(layers: list[sign.Layer], media_type: str) -> list[sign.Layer]:
    """The `.sig`/`.att` layers of `media_type` in the keyless format (a certificate annotation;
    the key's have none), at most MAX_BUNDLES: whoever can push can add layers."""
    return [x for x in layers if x.media_type == media_type
            and CERTIFICATE_ANNOTATION in x.annotations][:MAX_BUNDLES]


def verify_layer(layer: sign.Layer, reference: str, digest: str, policy: KeylessPolicy
                 ) -> Signer:
    """Who signed the `.sig` layer when every check of the module docstring passes;
    KeylessError with one line naming the first that does not."""
    return _guarded(_signed_by, layer, reference, digest, policy)


def verify_attestation(layer: sign.Layer, digest: str, policy: KeylessPolicy
                       ) -> tuple[dict[str, Any], Signer]:
    """The statement of an `.att` layer (`cosign attest` before bundles: a DSSE envelope, its
    certificate and SET in the annotations, logged as an `intoto` entry whose hash is the
    envelope's) and who signed it, checked as verify_layer checks a signature."""
    return _guarded(_attested_by, layer, digest, policy)


def _signed_by(layer: sign.Layer, reference: str, digest: str, policy: KeylessPolicy) -> Signer:
    certificate, entry, signer = _vouched(layer, policy)
    try:
        signature = base64.b64decode(layer.annotations[sign.SIGNATURE_ANNOTATION], validate=True)
        _key(certificate).verify(signature, layer.data, ec.ECDSA(hashes.SHA256()))
    except (KeyError, ValueError, InvalidSignature):
        raise KeylessError("the signature does not verify with the certificate's key") \
            from None
    _check_body(entry, ("hashedrekord", hashlib.sha256(layer.data).hexdigest(), certificate,
                        signature))
    if problem := sign.check_payload(layer.data, reference, digest):
        raise KeylessError(problem)
    return signer


def _attested_by(layer: sign.Layer, digest: str, policy: KeylessPolicy
                 ) -> tuple[dict[str, Any], Signer]:
    certificate, entry, signer = _vouched(layer, policy)
    try:
        statement = sign.open_envelope(layer.data, [_key(certificate)], digest)
    except sign.SignatureError as exc:
        raise KeylessError(f"the attestation: {exc}") from None
    _check_body(entry, ("intoto", hashlib.sha256(layer.data).hexdigest(), certificate, None))
    return statement, signer


def verified_statements(reg: oci.Registry, repository: str, digest: str, policy: KeylessPolicy,
                        have: Collection[str]) -> tuple[dict[str, Verified], list[str]]:
    """predicate type → (statement, signer) of what `.sig` and `.att` hold in this format and
    `have` (the bundles' verified predicate types) lacks; one reason per layer refused. The
    image's signature stands as IMAGE_STATEMENT."""
    good: dict[str, Verified] = {}
    refused: list[str] = []
    if IMAGE_PREDICATE not in have:
        for layer in keyless_layers(sign.read_layers(reg, repository, sign.sig_tag(digest)),
                                    sign.SIMPLE_SIGNING):
            try:
                signer = verify_layer(layer, f"{reg.registry}/{repository}", digest, policy)
                good.setdefault(IMAGE_PREDICATE, (IMAGE_STATEMENT, signer))
            except KeylessError as exc:
                refused.append(f"cosign .sig: {exc}")
    if set(sign.PREDICATES.values()) <= set(have):
        return good, refused
    for layer in keyless_layers(sign.read_layers(reg, repository, sign.att_tag(digest)),
                                sign.DSSE_TYPE):
        try:
            statement, signer = verify_attestation(layer, digest, policy)
        except KeylessError as exc:
            refused.append(f"cosign .att: {exc}")
            continue
        if (ptype := str(statement.get("predicateType"))) not in have:
            good.setdefault(ptype, (statement, signer))
    return good, refused


def _guarded(check: Callable[..., _T], *args: Any) -> _T:
    """`check(*args)`, a part that fails to parse lazily (an extension, a key) one line."""
    try:
        return check(*args)
    except ValueError as exc:
        raise KeylessError(f"a malformed keyless signature ({_one_line(exc)})") from None


# ---- the parts and their checks ---------------------------------------------------------------


def _vouched(layer: sign.Layer, policy: KeylessPolicy) -> tuple[x509.Certificate, Entry, Signer]:
    """The certificate, log entry and signer of a layer whose SET, certificate (at the logged
    time) and identity pass; what is signed is for the caller to check."""
    certificate, entry = _parts(layer.annotations)
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
    return certificate, entry, signer


def _key(certificate: x509.Certificate) -> ec.EllipticCurvePublicKey:
    key = certificate.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise KeylessError("the certificate's key is not an ECDSA key")
    return key


def _parts(annotations: dict[str, str]) -> tuple[x509.Certificate, Entry]:
    try:
        certificate = x509.load_pem_x509_certificate(annotations[CERTIFICATE_ANNOTATION].encode())
        doc = json.loads(annotations[BUNDLE_ANNOTATION])
        payload = doc["Payload"]
        entry = Entry(body=str(payload["body"]), integrated_time=int(payload["integratedTime"]),
                      log_index=int(payload["logIndex"]), log_id=str(payload["logID"]),
                      signed_entry_timestamp=base64.b64decode(doc["SignedEntryTimestamp"]))
    except KeyError as exc:
        raise KeylessError(f"a keyless signature without its {exc.args[0]}") from None
    except (ValueError, TypeError) as exc:
        raise KeylessError(f"a malformed keyless signature ({_one_line(exc)})") from None
    return certificate, entry


def _check_set(root: Any, entry: Entry) -> None:
    """The log's signature over its promise (RFC 8785 JSON of the four fields), by a Rekor key
    of the trusted root: only then is integratedTime a signing time anyone vouched for. For two
    integers and two strings, RFC 8785 is JSON with sorted keys, no spaces and UTF-8 (a string
    that needs other escaping than json's is not base64 or hex: its SET does not verify)."""
    from sigstore._internal.trust import KeyringPurpose
    from sigstore.errors import VerificationError

    promise = json.dumps({"body": entry.body, "integratedTime": entry.integrated_time,
                          "logID": entry.log_id, "logIndex": entry.log_index},
                         sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
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


def _check_body(entry: Entry, expected: tuple[str, str, x509.Certificate, bytes | None]
                ) -> None:
    """The logged entry must be (kind, sha256 of the signed bytes, certificate, signature) of
    this layer, as cosign's VerifyBundle compares them: a hashedrekord of the payload for a
    signature; an intoto entry (0.0.1 or 0.0.2) of the envelope for an attestation, whose
    signature is inside the hashed envelope (None: not compared). A genuine SET of another
    signature vouches for nothing here."""
    try:
        logged = _logged(json.loads(base64.b64decode(entry.body)))
    except (ValueError, KeyError, TypeError, IndexError):
        raise KeylessError(f"a log entry that is not a {expected[0]} entry of a certificate") \
            from None
    if logged[:3] != expected[:3] or (expected[3] is not None and logged[3] != expected[3]):
        raise KeylessError("a log entry that does not include the signature (it logs "
                           "another payload, signature or certificate)")


def _logged(body: dict[str, Any]) -> tuple[str, str, x509.Certificate, bytes | None]:
    """(kind, sha256 hex, certificate, signature or None) of a Rekor entry body."""
    spec, kind = body["spec"], body["kind"]
    if kind == "hashedrekord":
        digest, pem = spec["data"]["hash"], spec["signature"]["publicKey"]["content"]
        signature: bytes | None = base64.b64decode(spec["signature"]["content"])
    elif kind == "intoto":
        digest, signature = spec["content"]["hash"], None
        pem = spec["publicKey"] if body["apiVersion"] == "0.0.1" else \
            spec["content"]["envelope"]["signatures"][0]["publicKey"]
    else:
        raise ValueError(kind)
    if digest["algorithm"] != "sha256":
        raise ValueError(digest["algorithm"])
    return kind, digest["value"], x509.load_pem_x509_certificate(base64.b64decode(pem)), signature
