"""Keyless signatures: sigstore bundles whose certificate names a workflow identity, attached to
an image as OCI referrers, as GitHub's artifact attestations and cosign ≥ 2.4 write them.

A trusted key vouches for bytes in `builder.core.sign`; here a *trusted identity* does: the
bundle's certificate must chain to the trusted root (sigstore's public-good one, pinned in
builder/trust/, or the rehearsal's mock), its transparency-log entry must verify, and the
certificate's subject (the workflow `https://github.com/O/R/.github/workflows/F@REF`) and OIDC
issuer must be the ones the verifier trusts. Anyone with push rights can attach a bundle; only
one that passes all of this counts.

In the registry (distribution 2.8 has no referrers API: the OCI tag-schema fallback, as
cosign and oras use it), next to `REPO@sha256:H`:
  `REPO:sha256-H`  an OCI index listing one artifact manifest per bundle
                   (`artifactType` = the bundle media type, `subject` = H, the statement's
                   predicate type in the `dev.sigstore.bundle.predicateType` annotation)
Each bundle is a DSSE envelope of an in-toto Statement whose subject is H: the image's own
signature has cosign's predicate type `https://sigstore.dev/cosign/sign/v1`.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

from cryptography import x509

from builder.core import oci, sign
from builder.core.errors import BuilderError
from builder.core.keypair import Identity

BUNDLE_MEDIA = "application/vnd.dev.sigstore.bundle.v0.3+json"
PREDICATE_ANNOTATION = "dev.sigstore.bundle.predicateType"
IMAGE_PREDICATE = "https://sigstore.dev/cosign/sign/v1"
GITHUB_ISSUER = "https://token.actions.githubusercontent.com"
PUBLIC_GOOD_ROOT = Path(__file__).resolve().parent.parent / "trust" / "sigstore_public_good.json"
# Fulcio's OIDC issuer extensions: v2 (DER UTF8String) first, then the legacy raw one.
ISSUER_V2, ISSUER_V1 = "1.3.6.1.4.1.57264.1.8", "1.3.6.1.4.1.57264.1.1"
PULL_REQUEST_REF = "@refs/pull/"
MAX_BUNDLES = 32  # more than any publication attaches; a longer listing is not read further


class KeylessError(BuilderError):
    """A bundle that does not verify, or one by an identity nobody trusts: a finding."""

    exit_code = 1


@dataclass(frozen=True)
class Signer:
    """Who a verified bundle's certificate names."""

    subject: str
    issuer: str

    def describe(self) -> str:
        return f"{self.subject} ({self.issuer})"


@dataclass(frozen=True)
class KeylessPolicy:
    """The identities a verifier trusts and the root their certificates must chain to
    (any_identity: whoever the root's CA certified, to show who signed, never to trust)."""

    identities: tuple[Identity, ...] = ()
    trusted_root: Path = PUBLIC_GOOD_ROOT
    any_identity: bool = False


def identities_of(identity: Iterable[str], regexp: Iterable[str], issuer: str | None
                  ) -> tuple[Identity, ...]:
    """The command line's identities, each under the one --certificate-oidc-issuer."""
    found = [("identity", x) for x in identity] + [("regexp", x) for x in regexp]
    if found and not issuer:
        raise BuilderError("--certificate-identity needs --certificate-oidc-issuer",
                           hint=f"GitHub Actions' issuer is {GITHUB_ISSUER}")
    return tuple(Identity(issuer or "", **{field: value}) for field, value in found)


# ---- the registry: the referrers tag-schema fallback -------------------------------------------


def referrers_tag(digest: str) -> str:
    return digest.replace(":", "-")


def attach(reg: oci.Registry, repository: str, digest: str, bundle: bytes,
           predicate_type: str) -> str:
    """Push `bundle` as an artifact manifest whose subject is `digest` and list it in the
    fallback index (kept, not replaced: other referrers stay). Returns the artifact digest."""
    subject = reg.head(repository, digest)
    if subject is None:
        raise BuilderError(f"`{reg.registry}/{repository}` has no manifest `{digest}` to attest")
    empty = reg.push_blob(repository, oci.EMPTY_JSON)
    annotations = {PREDICATE_ANNOTATION: predicate_type}
    manifest = {"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST, "artifactType": BUNDLE_MEDIA,
                "config": {"mediaType": oci.EMPTY_CONFIG, "size": len(oci.EMPTY_JSON),
                           "digest": empty},
                "layers": [{"mediaType": BUNDLE_MEDIA, "size": len(bundle),
                            "digest": reg.push_blob(repository, bundle)}],
                "subject": {"mediaType": subject.media_type, "size": subject.size,
                            "digest": digest},
                "annotations": annotations}
    body = json.dumps(manifest, separators=(",", ":")).encode()
    artifact = reg.put_manifest(repository, oci.sha256(body), body, oci.OCI_MANIFEST)
    listed = [x for x in _listed(reg, repository, digest) if x.get("digest") != artifact]
    listed.append({"mediaType": oci.OCI_MANIFEST, "artifactType": BUNDLE_MEDIA,
                   "size": len(body), "digest": artifact, "annotations": annotations})
    index = json.dumps({"schemaVersion": 2, "mediaType": oci.OCI_INDEX, "manifests": listed},
                       separators=(",", ":")).encode()
    reg.put_manifest(repository, referrers_tag(digest), index, oci.OCI_INDEX)
    return artifact


def _listed(reg: oci.Registry, repository: str, digest: str) -> list[dict[str, Any]]:
    found = reg.manifest(repository, referrers_tag(digest))
    try:
        doc = json.loads(found[0]) if found else {}
    except ValueError:
        return []
    listed = doc.get("manifests") if isinstance(doc, dict) else []
    return [x for x in listed if isinstance(x, dict)] if isinstance(listed, list) else []


def bundles(reg: oci.Registry, repository: str, digest: str) -> list[bytes]:
    """The bytes of every sigstore bundle listed for `digest`, by the referrers API where the
    registry has one (GitHub's attestations are pushed there), else by the fallback index
    (unchecked: whoever can push can list one; verify() decides what counts). A malformed
    entry is skipped; at most MAX_BUNDLES are read, each at most oci.EVIDENCE_CAP bytes."""
    listed = reg.referrers(repository, digest, BUNDLE_MEDIA)
    found: list[bytes] = []
    for item in _listed(reg, repository, digest) if listed is None else listed:
        if item.get("artifactType") == BUNDLE_MEDIA and len(found) < MAX_BUNDLES:
            found += _bundle_layers(reg, repository, item.get("digest"))
    return found[:MAX_BUNDLES]


def _bundle_layers(reg: oci.Registry, repository: str, ref: Any) -> list[bytes]:
    """The bundle layers of one listed artifact ([] when it is malformed: nothing to verify; a
    registry that does not answer is still an error)."""
    if not _is_digest(ref) or (manifest := reg.manifest(repository, ref)) is None:
        return []
    try:
        layers = json.loads(manifest[0]).get("layers") or []
    except (ValueError, AttributeError):
        return []
    return [reg.blob(repository, x["digest"], oci.EVIDENCE_CAP) for x in layers
            if isinstance(x, dict) and x.get("mediaType") == BUNDLE_MEDIA
            and _is_digest(x.get("digest"))]


def _is_digest(ref: Any) -> bool:
    try:
        oci.check_digest(ref, "a referrer")
    except oci.RegistryError:
        return False
    return True


# ---- verification -------------------------------------------------------------------------------


@cache
def _verifier(root: Path) -> Any:
    from sigstore.models import TrustedRoot
    from sigstore.verify import Verifier

    try:
        return Verifier(trusted_root=TrustedRoot.from_file(str(root)))
    except (OSError, ValueError) as exc:
        raise BuilderError(f"{root}: not a sigstore trusted root ({exc})",
                           hint="give --trusted-root a trusted_root.json") from None


def signer_of(certificate: x509.Certificate) -> Signer:
    """The certificate's subject (its SAN: a URI for a workflow, an email for a person) and the
    OIDC issuer Fulcio recorded."""
    try:
        san = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [*san.get_values_for_type(x509.UniformResourceIdentifier),
                 *san.get_values_for_type(x509.RFC822Name)]
    except x509.ExtensionNotFound:
        names = []
    return Signer(names[0] if names else "", _issuer(certificate))


def _issuer(certificate: x509.Certificate) -> str:
    for oid, der in ((ISSUER_V2, True), (ISSUER_V1, False)):
        try:
            raw = certificate.extensions.get_extension_for_oid(x509.ObjectIdentifier(oid))
        except x509.ExtensionNotFound:
            continue
        value = raw.value.value  # an UnrecognizedExtension's bytes
        return (_der_utf8(value) if der else value).decode(errors="replace")
    return ""


def _der_utf8(value: bytes) -> bytes:
    """The contents of a DER UTF8String (short or long length form)."""
    if len(value) < 2 or value[0] != 0x0C:
        return b""
    if value[1] < 0x80:
        return value[2:2 + value[1]]
    width = value[1] & 0x7F
    return value[2 + width:2 + width + int.from_bytes(value[2:2 + width], "big")]


def verify(data: bytes, digest: str, policy: KeylessPolicy) -> tuple[dict[str, Any], Signer]:
    """The in-toto statement of one bundle and who signed it, when it verifies against the
    trusted root (chain, log entry, signature), a trusted identity signed it and its subject is
    `digest`; KeylessError with one line naming why not otherwise."""
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import Bundle

    try:
        bundle = Bundle.from_json(data)
        payload_type, payload = _verifier(policy.trusted_root).verify_dsse(
            bundle, _TrustedSigner(policy.identities, policy.any_identity))
    except (SigstoreError, ValueError, KeyError, TypeError) as exc:
        raise KeylessError(_unverified(data, exc)) from None
    try:
        statement = json.loads(payload)
    except ValueError:
        raise KeylessError(f"its payload ({payload_type}) is not JSON") from None
    subjects = [x.get("digest", {}).get("sha256") for x in statement.get("subject") or []
                if isinstance(x, dict)]
    if digest.removeprefix("sha256:") not in subjects:
        raise KeylessError(f"a bundle for another digest (subject "
                           f"{', '.join(f'sha256:{s}'[:19] for s in subjects)}), "
                           f"not {digest[:19]}")
    return statement, signer_of(bundle.signing_certificate)


def _unverified(data: bytes, exc: Exception) -> str:
    """Why a bundle failed sigstore's checks, in the words a platform team needs where the
    bundle itself shows it (read only to word a refusal, never to accept anything): a
    certificate that was not valid when the log recorded the signature, a log entry of another
    signature; else sigstore's own reason."""
    try:
        material = json.loads(data)["verificationMaterial"]
        entry = material["tlogEntries"][0]
        logged = datetime.fromtimestamp(int(entry["integratedTime"]), UTC)
        cert = x509.load_der_x509_certificate(base64.b64decode(
            material["certificate"]["rawBytes"]))
        body = json.loads(base64.b64decode(entry["canonicalizedBody"]))
        envelope_sigs = [x["sig"] for x in json.loads(data)["dsseEnvelope"]["signatures"]]
    except (KeyError, IndexError, TypeError, ValueError):
        envelope_sigs, body = [], {}
    else:
        if not cert.not_valid_before_utc <= logged <= cert.not_valid_after_utc:
            return (f"a certificate outside its validity at signing time (valid "
                    f"{cert.not_valid_before_utc:%H:%M:%S}–{cert.not_valid_after_utc:%H:%M:%S} "
                    f"UTC {cert.not_valid_after_utc:%Y-%m-%d}, logged {logged:%Y-%m-%d %H:%M:%S})")
    logged_sigs = [x.get("signature") for x in (body.get("spec") or {}).get("signatures") or []]
    if logged_sigs and envelope_sigs and not set(envelope_sigs) & set(logged_sigs):
        return "a log entry that does not include the signature (it logs another one)"
    return f"the bundle does not verify against the trusted root: {_one_line(exc)}"


@dataclass(frozen=True)
class _TrustedSigner:
    """sigstore-python's verification policy (called once the chain verified): the
    certificate must name a trusted identity; KeylessError says which part does not."""

    identities: tuple[Identity, ...]
    any_identity: bool

    def verify(self, certificate: x509.Certificate) -> None:
        if not self.any_identity:
            _check_identity(signer_of(certificate), self.identities)


def trusts(identities: Iterable[Identity], signer: Signer) -> bool:
    """Whether one of `identities` names `signer` (its issuer, its subject exactly or by
    full-match regexp)."""
    return any(x.issuer == signer.issuer and x.matches(signer.subject) for x in identities)


def _check_identity(signer: Signer, identities: tuple[Identity, ...]) -> None:
    if trusts(identities, signer):
        return
    trusted = "; ".join(x.describe() for x in identities) or "none given"
    if not any(x.issuer == signer.issuer for x in identities):
        raise KeylessError(f"another issuer: signed through {signer.issuer or 'no issuer'}, "
                           f"trusted: {trusted}")
    why = "a pull-request ref identity" if PULL_REQUEST_REF in signer.subject \
        else "another identity"
    raise KeylessError(f"{why}: signed by {signer.subject}, trusted: {trusted}")


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def checked(reg: oci.Registry, repository: str, digest: str, policy: KeylessPolicy
            ) -> tuple[list[tuple[dict[str, Any], Signer]], list[str]]:
    """(statement, signer) of every bundle attached to `digest` that verifies, and one reason
    per bundle that does not."""
    good, refused = [], []
    for data in bundles(reg, repository, digest):
        try:
            good.append(verify(data, digest, policy))
        except KeylessError as exc:
            refused.append(str(exc))
    return good, refused


def verified_statements(reg: oci.Registry, repository: str, digest: str, policy: KeylessPolicy
                        ) -> tuple[dict[str, tuple[dict[str, Any], Signer]], list[str]]:
    """predicate type → (statement, signer): the first verified bundle of each; the refusals."""
    good, refused = checked(reg, repository, digest, policy)
    first: dict[str, tuple[dict[str, Any], Signer]] = {}
    for statement, signer in good:
        first.setdefault(str(statement.get("predicateType")), (statement, signer))
    return first, refused


# ---- signing -------------------------------------------------------------------------------------


AMBIENT = ""  # the token of identity_token for "ask the CI job's OIDC provider when signing"


def identity_token(path: Path | None, environ: dict[str, str]) -> str | None:
    """The OIDC token to sign with: --identity-token FILE, else SIGSTORE_ID_TOKEN, else AMBIENT
    in a GitHub Actions job that may ask for one (`id-token: write` sets
    ACTIONS_ID_TOKEN_REQUEST_URL and _TOKEN), else None (no keyless signing)."""
    if path is not None:
        try:
            return path.read_text().strip()
        except OSError as exc:
            raise BuilderError(f"--identity-token {path}: {exc.strerror}") from None
    if token := environ.get("SIGSTORE_ID_TOKEN"):
        return token
    github = ("GITHUB_ACTIONS", "ACTIONS_ID_TOKEN_REQUEST_URL", "ACTIONS_ID_TOKEN_REQUEST_TOKEN")
    return AMBIENT if all(environ.get(name) for name in github) else None


def ambient_token() -> str:
    """A token from the CI job's OIDC provider, asked for when signing rather than when the job's
    step starts: GitHub's tokens are short-lived, and a CUDA build or a rebuild that signs at
    its end outlasts one fetched before it (cosign asks at signing time too). sigstore-python's
    `detect_credential` makes the request (GitHub Actions, GitLab, Buildkite, CircleCI, GCP)."""
    from sigstore.oidc import IdentityError, detect_credential

    try:
        token = detect_credential()
    except IdentityError as exc:
        raise BuilderError(f"keyless signing: the CI job's OIDC provider: {_one_line(exc)}",
                           hint="the job needs `permissions: id-token: write`") from None
    if not token:
        raise BuilderError("keyless signing: the CI job's OIDC provider gave no token",
                           hint="the job needs `permissions: id-token: write`, or set "
                           "SIGSTORE_ID_TOKEN")
    return token


def sign_statements(token: str, trust_config: Path | None, statements: list[dict[str, Any]]
                    ) -> list[bytes]:
    """One sigstore bundle per in-toto statement, all under one short-lived Fulcio certificate
    for the token's identity, each logged in Rekor. `trust_config` is sigstore's client trust
    config (trusted root + signing config: which Fulcio, Rekor, TSA); None: public good. A token
    of AMBIENT is asked of the CI job's OIDC provider now (ambient_token)."""
    from sigstore import dsse
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import ClientTrustConfig
    from sigstore.oidc import IdentityToken
    from sigstore.sign import ExpiredCertificate, ExpiredIdentity, SigningContext

    try:
        config = (ClientTrustConfig.from_json(trust_config.read_text()) if trust_config
                  else ClientTrustConfig.production())
        context = SigningContext.from_trust_config(config)
        with context.signer(IdentityToken(token or ambient_token())) as signer:
            return [signer.sign_dsse(dsse.Statement(json.dumps(x).encode())).to_json().encode()
                    for x in statements]
    except ExpiredCertificate:
        raise BuilderError("keyless signing failed: Fulcio's certificate is not valid now",
                           hint="check this machine's clock against Fulcio's") from None
    except (SigstoreError, ExpiredIdentity, OSError, ValueError) as exc:
        raise BuilderError(f"keyless signing failed: {_one_line(exc)}",
                           hint="check the identity token (not expired, audience `sigstore`) "
                           "and --sigstore-config") from None


def sign_and_attach(reg: oci.Registry, repository: str, digest: str, token: str,
                    trust_config: Path | None, statements: list[dict[str, Any]],
                    optional: dict[str, str] | None = None) -> Signer:
    """Sign the image and `statements` (its attestations) keylessly and attach each bundle as a
    referrer of `digest`; who the certificate names. `optional` (the variant and the tags it is
    published under, as in a simple-signing payload) goes into the image statement."""
    from sigstore.models import Bundle

    # cosign 3's image signature in the bundle format: a statement of the digest; publish's
    # names its tags as the key's `.sig` does (builder.core.vouch reads both alike).
    claims = {"optional": dict(sorted(optional.items()))} if optional else {}
    docs = [sign.statement(f"{reg.registry}/{repository}", digest, IMAGE_PREDICATE, claims),
            *statements]
    made = sign_statements(token, trust_config, docs)
    for doc, data in zip(docs, made, strict=True):
        attach(reg, repository, digest, data, doc["predicateType"])
    return signer_of(Bundle.from_json(made[0]).signing_certificate)


def evidence_statements(reg: oci.Registry, repository: str, digest: str
                        ) -> list[dict[str, Any]]:
    """An in-toto statement for each piece of evidence attached to `digest` (SBOM, smoke
    report, provenance; the provenance is a statement already: its predicate is taken)."""
    name = f"{reg.registry}/{repository}"
    found = []
    for kind, predicate_type in sign.PREDICATES.items():
        data = reg.fetch_artifact(repository, digest, kind)
        try:
            doc = None if data is None else json.loads(data)
        except ValueError:
            continue
        if doc is not None:
            found.append(sign.statement(name, digest, predicate_type,
                                        sign.predicate_of(kind, doc)))
    return found


def attest_digest(reg: oci.Registry, repository: str, digest: str, token: str,
                  trust_config: Path | None, optional: dict[str, str] | None = None
                  ) -> tuple[Signer, list[str]]:
    """Sign `digest` and the evidence attached to it keylessly (`builder attest`, and
    `builder publish --identity-token` for each digest it promotes, `optional` naming its
    tags): who signed, and the predicate types of the evidence attested."""
    statements = evidence_statements(reg, repository, digest)
    signer = sign_and_attach(reg, repository, digest, token, trust_config, statements,
                             optional)
    return signer, [x["predicateType"] for x in statements]



def verified_signers(reg: oci.Registry, repository: str, digest: str, policy: KeylessPolicy
                     ) -> list[Signer]:
    """Who signed the image's own verified bundles (cosign's image predicate), each once."""
    found = [signer for statement, signer in checked(reg, repository, digest, policy)[0]
             if statement.get("predicateType") == IMAGE_PREDICATE]
    return list(dict.fromkeys(found))
