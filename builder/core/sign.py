"""Signatures and signed attestations in cosign's formats, so stock `cosign verify`, Kyverno,
policy-controller and containers-policy.json (`sigstoreSigned`) check what the pipeline vouches
for, and `builder verify --key` checks the same bytes.

Keys (cosign.key, cosign.pub, the trust of a run) are `builder.core.keypair`.

In the registry (sigstore's cosign/specifications.md), next to the image `REPO@sha256:H`:
  `REPO:sha256-H.sig`  an OCI manifest, one layer per signature: the simple-signing payload
                       (`application/vnd.dev.cosign.simplesigning.v1+json`), its base64 ECDSA
                       signature in the `dev.cosignproject.cosign/signature` annotation
  `REPO:sha256-H.att`  one layer per attestation: a DSSE envelope
                       (`application/vnd.dsse.envelope.v1+json`) of an in-toto Statement whose
                       subject is H, its predicate type in the `predicateType` annotation
DSSE: securesystemslib's Envelope does the envelope and its pre-authentication encoding; the
signature is cosign's (ECDSA P-256 over SHA-256, DER, base64, empty keyid). Envelopes are read
here, not by securesystemslib: cosign's may carry several signatures with the same empty keyid,
and one that verifies against a trusted key is enough.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cryptography.hazmat.primitives.asymmetric import ec
from securesystemslib.dsse import Envelope
from securesystemslib.signer import Signature

from builder.core import media, oci
from builder.core.errors import BuilderError
from builder.core.keypair import SigningKey, key_id, verifies

SIMPLE_SIGNING = media.SIMPLE_SIGNING
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
SIGNATURE_TYPE = "cosign container image signature"
DSSE_TYPE = media.DSSE_ENVELOPE
INTOTO_PAYLOAD = media.IN_TOTO
STATEMENT_V1 = "https://in-toto.io/Statement/v1"
STATEMENTS = (STATEMENT_V1, "https://in-toto.io/Statement/v0.1")
PREDICATE_ANNOTATION = "predicateType"
# What each kind of evidence is attested as.
PREDICATES = {
    "provenance": "https://slsa.dev/provenance/v1",
    "sbom": "https://cyclonedx.org/bom",
    "smoke": "https://github.com/torch-images/torch-images/smoke-report/v1",
}
# Attested when made, never required of a publication: the vulnerability report of its day
# (publish attaches one; an older publication, or one audited later, may have none), and the
# signed copy of the digest's own `.sig` layers (`keep_copy`: what an overwritten `.sig` is put
# back from, builder.flows.resign).
ATTESTED = {**PREDICATES, "audit": "https://cosign.sigstore.dev/attestation/vuln/v1",
            "signatures": "https://github.com/torch-images/torch-images/signatures/v1"}


class SignatureError(BuilderError):
    """A signature or attestation that does not verify: a finding (exit 1)."""

    exit_code = 1


# ---- simple signing ---------------------------------------------------------------------------


def simple_signing_payload(docker_reference: str, digest: str,
                           optional: dict[str, str] | None = None) -> bytes:
    """cosign's payload, its field order and spacing (Go's json.Marshal of cosign's struct:
    the `optional` map, cosign's `-a key=value` annotations, with its keys sorted)."""
    doc = {"critical": {"identity": {"docker-reference": docker_reference},
                        "image": {"docker-manifest-digest": digest},
                        "type": SIGNATURE_TYPE},
           "optional": dict(sorted(optional.items())) if optional else None}
    return json.dumps(doc, separators=(",", ":")).encode()


# The `optional` annotations publish signs: the variant, and one `tag:<TAG>` per tag the digest
# was promoted under (a map of strings, so Kyverno's `annotations` and `cosign verify -a` can
# require one tag: `-a tag:2.13.0-py3.11-cpu-runtime=signed`).
VARIANT_ANNOTATION, TAG_ANNOTATION, TAG_SIGNED = "variant", "tag:", "signed"
# A signed rollback (builder.flows.rollback): the dated tag taken back to, and the newest
# publication's dated tag at the time (a newer publication makes the rollback stale).
ROLLBACK_TO, ROLLBACK_FROM = "dev.torch-images.rollback-to", "dev.torch-images.rollback-from"


def tag_annotations(variant: str, tags: Iterable[str]) -> dict[str, str]:
    return {VARIANT_ANNOTATION: variant, **{TAG_ANNOTATION + t: TAG_SIGNED for t in tags}}


def signed_tags(optional: dict[str, Any] | None) -> set[str]:
    """The tags a verified payload's `optional` map names."""
    return {k.removeprefix(TAG_ANNOTATION) for k, v in (optional or {}).items()
            if isinstance(k, str) and k.startswith(TAG_ANNOTATION) and v == TAG_SIGNED}


def rollbacks(payloads: Iterable[dict[str, Any]]) -> list[tuple[str, str]]:
    """(rolled back to, from) for each verified payload that signs a rollback."""
    return [(str(o[ROLLBACK_TO]), str(o.get(ROLLBACK_FROM) or ""))
            for p in payloads if ROLLBACK_TO in (o := p.get("optional") or {})]


def check_payload(payload: bytes, docker_reference: str, digest: str) -> str:
    """What makes a verified simple-signing payload not about `docker_reference@digest`."""
    try:
        critical = json.loads(payload)["critical"]
        kind = critical["type"]
        signed = critical["image"]["docker-manifest-digest"]
        identity = critical["identity"]["docker-reference"]
    except (ValueError, KeyError, TypeError):
        return "its payload is not a cosign simple-signing payload"
    if kind != SIGNATURE_TYPE:
        return f"its payload type is {kind!r}"
    if signed != digest:
        return f"it signs {signed}, not {digest}"
    if identity.rsplit("@", 1)[0] not in (docker_reference, *_tagged(docker_reference, identity)):
        return f"it names {identity}, not {docker_reference}"
    return ""


def _tagged(repository: str, identity: str) -> list[str]:
    """cosign writes the repository; a tag after it (`repo:tag`) still names the repository."""
    name, _, tag = identity.rpartition(":")
    return [identity] if name == repository and "/" not in tag else []


# ---- DSSE + in-toto ---------------------------------------------------------------------------


def statement(name: str, digest: str, predicate_type: str, predicate: Any) -> dict[str, Any]:
    """An in-toto Statement v1 about the image `name@digest`."""
    return {"_type": STATEMENT_V1,
            "subject": [{"name": name, "digest": {"sha256": digest.removeprefix("sha256:")}}],
            "predicateType": predicate_type, "predicate": predicate}


def envelope(key: SigningKey, doc: dict[str, Any]) -> bytes:
    """The DSSE envelope of a statement, signed as cosign signs it (keyid empty)."""
    env = Envelope(json.dumps(doc, separators=(",", ":")).encode(), INTOTO_PAYLOAD, {})
    env.signatures[""] = Signature("", key.sign(env.pae()).hex())
    return json.dumps(env.to_dict(), separators=(",", ":")).encode()


def verify_envelope(data: bytes, keys: list[ec.EllipticCurvePublicKey]) -> Envelope:
    """A DSSE envelope one of whose signatures (over its pre-authentication encoding)
    verifies against one of `keys`; SignatureError otherwise. Any number of signatures, keyid
    empty or not and repeated (cosign writes `""`): securesystemslib's own parser keys them by
    keyid and refuses a repeated one, so the signature list is read here."""
    try:
        doc = json.loads(data)
        env = Envelope(_b64(doc["payload"]), doc["payloadType"], {})
        sigs = [_b64(s["sig"]) for s in doc["signatures"]]
        if not isinstance(env.payload_type, str) or not all(
                isinstance(s.get("keyid", ""), str) for s in doc["signatures"]):
            raise TypeError("keyid and payloadType are strings")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise SignatureError("not a DSSE envelope") from None
    if not sigs:
        raise SignatureError("the DSSE envelope has no signature")
    pae = env.pae()
    if not any(verifies(keys, pae, sig) for sig in sigs):
        raise SignatureError("its signature does not verify against the trusted key(s)")
    return env


def _b64(text: str) -> bytes:
    """DSSE's base64: standard or URL-safe, padded or not (the spec allows both alphabets)."""
    if not isinstance(text, str):
        raise TypeError("not a base64 string")
    padded = text + "=" * (-len(text) % 4)
    alphabet = b"-_" if "-" in text or "_" in text else None
    return base64.b64decode(padded, altchars=alphabet, validate=True)


def open_envelope(data: bytes, keys: list[ec.EllipticCurvePublicKey], digest: str
                  ) -> dict[str, Any]:
    """The statement in a DSSE envelope signed by one of `keys` whose subject is `digest`;
    SignatureError saying what is wrong otherwise."""
    env = verify_envelope(data, keys)
    if env.payload_type != INTOTO_PAYLOAD:
        raise SignatureError(f"its payload type is {env.payload_type!r}, not {INTOTO_PAYLOAD}")
    try:
        doc = json.loads(env.payload)
        subjects = [s["digest"]["sha256"] for s in doc["subject"]]
    except (ValueError, KeyError, TypeError):
        raise SignatureError("its payload is not an in-toto Statement") from None
    if doc.get("_type") not in STATEMENTS:
        raise SignatureError(f"its payload type {doc.get('_type')!r} is not an in-toto Statement")
    if digest.removeprefix("sha256:") not in subjects:
        raise SignatureError(f"its subject is not {digest}")
    return doc


# ---- in the registry --------------------------------------------------------------------------


def sig_tag(digest: str) -> str:
    return oci.artifact_tag(digest, "sig")


def att_tag(digest: str) -> str:
    return oci.artifact_tag(digest, "att")


@dataclass(frozen=True)
class Layer:
    """One signature or attestation in a `.sig`/`.att` manifest, with its bytes."""

    media_type: str
    data: bytes
    annotations: dict[str, str]

    def descriptor(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "size": len(self.data),
                "digest": oci.sha256(self.data), "annotations": self.annotations}


def read_layers(reg: oci.Registry, repository: str, tag: str) -> list[Layer]:
    """The layers of a cosign `.sig`/`.att` manifest with their bytes ([] when there is none)."""
    found = reg.manifest(repository, tag)
    if found is None:
        return []
    try:
        layers = json.loads(found[0]).get("layers") or []
    except ValueError:
        return []
    return [Layer(x.get("mediaType", ""), reg.blob(repository, x["digest"]),
                  x.get("annotations") or {}) for x in layers if isinstance(x, dict)]


def write_layers(reg: oci.Registry, repository: str, tag: str, layers: list[Layer]) -> str:
    """Store `layers` as cosign stores them: an OCI manifest whose config lists them."""
    for layer in layers:
        reg.push_blob(repository, layer.data)
    config = json.dumps({
        "architecture": "", "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}], "os": "",
        "rootfs": {"type": "layers", "diff_ids": [oci.sha256(x.data) for x in layers]},
        "config": {}}, separators=(",", ":")).encode()
    manifest = {"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST,
                "config": {"mediaType": oci.OCI_CONFIG, "size": len(config),
                           "digest": reg.push_blob(repository, config)},
                "layers": [x.descriptor() for x in layers]}
    body = json.dumps(manifest, separators=(",", ":")).encode()
    return reg.put_manifest(repository, tag, body, oci.OCI_MANIFEST)


def sign_image(reg: oci.Registry, repository: str, digest: str, key: SigningKey,
               optional: dict[str, str] | None = None) -> None:
    """Add our signature of `registry/repository@digest` (with `optional`: the variant and
    tags) to its `.sig` (kept when one of this key over the same payload is there already, so
    a repeated run adds nothing; a publication under new tags adds a signature naming them)."""
    reference = f"{reg.registry}/{repository}"
    payload = simple_signing_payload(reference, digest, optional)
    layers = read_layers(reg, repository, sig_tag(digest))
    if any(x.data == payload and _layer_verifies(x, [key.public]) for x in layers):
        return
    sig = base64.b64encode(key.sign(payload)).decode()
    layers.append(Layer(SIMPLE_SIGNING, payload, {SIGNATURE_ANNOTATION: sig}))
    write_layers(reg, repository, sig_tag(digest), layers)


def keep_copy(reg: oci.Registry, repository: str, digest: str, key: SigningKey) -> None:
    """Attest the `.sig` layers `key` made for `digest` (evidence `signatures`): anyone with
    push rights can overwrite a `.sig`, and what it held is then put back from this copy, each
    layer checked again (`copied_layers`), never signed anew naming tags read off the
    registry. The copy already attested is kept in it: a `.sig` overwritten before a later
    signing (a rollback) loses nothing."""
    found, _ = verified_attestations(reg, repository, digest, [key.public])
    kept = copied_layers(found["signatures"], f"{reg.registry}/{repository}", digest,
                         [key.public]) if "signatures" in found else []
    mine = [x for x in read_layers(reg, repository, sig_tag(digest))
            if x.media_type == SIMPLE_SIGNING and _layer_verifies(x, [key.public])]
    mine += [x for x in kept if x.data not in {y.data for y in mine}]
    attest(reg, repository, digest, key, "signatures", {"signatures": [
        {"payload": base64.b64encode(x.data).decode(),
         "signature": x.annotations[SIGNATURE_ANNOTATION]} for x in mine]})


def copied_layers(statement: dict[str, Any], reference: str, digest: str,
                  keys: list[ec.EllipticCurvePublicKey]) -> list[Layer]:
    """The `.sig` layers in a verified `signatures` statement (`keep_copy`) whose signature
    verifies against `keys` and whose payload signs `reference@digest`: what may be put back."""
    predicate = statement.get("predicate")
    entries = predicate.get("signatures") if isinstance(predicate, dict) else None
    found = []
    for entry in entries if isinstance(entries, list) else []:
        try:
            layer = Layer(SIMPLE_SIGNING, base64.b64decode(entry["payload"], validate=True),
                          {SIGNATURE_ANNOTATION: str(entry["signature"])})
        except (TypeError, KeyError, ValueError):
            continue
        if _layer_verifies(layer, keys) and not check_payload(layer.data, reference, digest):
            found.append(layer)
    return found


def reattach(reg: oci.Registry, repository: str, digest: str, layers: list[Layer]) -> None:
    """Put `layers` back into the `.sig` of `digest`, after the layers it holds now."""
    held = read_layers(reg, repository, sig_tag(digest))
    write_layers(reg, repository, sig_tag(digest), held + [x for x in layers if x not in held])


def _layer_verifies(layer: Layer, keys: list[ec.EllipticCurvePublicKey]) -> bool:
    try:
        sig = base64.b64decode(layer.annotations.get(SIGNATURE_ANNOTATION, ""), validate=True)
    except ValueError:
        return False
    return verifies(keys, layer.data, sig)


def verify_image(reg: oci.Registry, repository: str, digest: str,
                 keys: list[ec.EllipticCurvePublicKey]) -> str:
    """A line for the table when a simple signing of `.sig` verifies; SignatureError naming
    what is wrong otherwise."""
    verified_payloads(reg, repository, digest, keys)
    return signature_line(digest, keys)


def predicate_of(kind: str, doc: Any) -> Any:
    """What an attestation of the attached `kind` document states: the document itself, or a
    provenance file's predicate (the file is a whole in-toto statement already)."""
    return doc.get("predicate") if kind == "provenance" and isinstance(doc, dict) else doc


def signature_line(digest: str, keys: list[Any]) -> str:
    """The table's line for a `.sig` of `digest` that verified against `keys`."""
    return f"cosign signature over {digest[:19]} by key {key_id(keys[0])}"


def verified_payloads(reg: oci.Registry, repository: str, digest: str,
                      keys: list[ec.EllipticCurvePublicKey]) -> list[dict[str, Any]]:
    """Every simple-signing payload of `.sig` that verifies against `keys` and names
    `registry/repository@digest` (at least one); SignatureError naming what is wrong otherwise
    — "published unsigned" when the digest carries no signature at all."""
    layers = [x for x in read_layers(reg, repository, sig_tag(digest))
              if x.media_type == SIMPLE_SIGNING]
    if not layers:
        raise SignatureError(f"published unsigned: no signature ({sig_tag(digest)} is missing)")
    problems, found = [], []
    for layer in layers:
        if not _layer_verifies(layer, keys):
            problems.append("a signature by another key")
        elif problem := check_payload(layer.data, f"{reg.registry}/{repository}", digest):
            problems.append(problem)
        else:
            found.append(json.loads(layer.data))
    if not found:
        raise SignatureError(f"no valid signature: {'; '.join(dict.fromkeys(problems))}")
    return found


def names_tag(reg: oci.Registry, repository: str, digest: str, tag: str,
              keys: Iterable[ec.EllipticCurvePublicKey]) -> bool:
    """Whether a signature of `digest` by one of `keys` names `tag` (a tag anyone with push
    rights could have written counts only then)."""
    try:
        return tag in tags_signed_by(reg, repository, digest, keys)
    except SignatureError:
        return False


def tags_signed_by(reg: oci.Registry, repository: str, digest: str,
                   keys: Iterable[ec.EllipticCurvePublicKey]) -> set[str]:
    """The tags that the signatures of `digest` by one of `keys` name (SignatureError when none
    verifies)."""
    payloads = verified_payloads(reg, repository, digest, list(keys))
    return {tag for p in payloads for tag in signed_tags(p.get("optional"))}


def attest(reg: oci.Registry, repository: str, digest: str, key: SigningKey,
           kind: str, predicate: Any) -> None:
    """Add the signed attestation of `predicate` (evidence `kind`) to `digest`'s `.att`,
    replacing earlier ones of its predicate type (like `cosign attest --replace`)."""
    ptype = ATTESTED[kind]
    doc = statement(f"{reg.registry}/{repository}", digest, ptype, predicate)
    layers = read_layers(reg, repository, att_tag(digest))
    for layer in layers:
        if layer.annotations.get(PREDICATE_ANNOTATION) == ptype and _same_statement(
                layer, doc, key.public, digest):
            return
    layers = [x for x in layers if x.annotations.get(PREDICATE_ANNOTATION) != ptype]
    layers.append(Layer(DSSE_TYPE, envelope(key, doc), {PREDICATE_ANNOTATION: ptype}))
    write_layers(reg, repository, att_tag(digest), layers)


def _same_statement(layer: Layer, doc: dict[str, Any], key: ec.EllipticCurvePublicKey,
                    digest: str) -> bool:
    try:
        return open_envelope(layer.data, [key], digest)["predicate"] == doc["predicate"]
    except SignatureError:
        return False


def verified_attestations(reg: oci.Registry, repository: str, digest: str,
                          keys: list[ec.EllipticCurvePublicKey]
                          ) -> tuple[dict[str, Any], dict[str, str]]:
    """(evidence kind → the statement of its verified attestation, kind → why none verified)
    for every kind in PREDICATES (and an audit's, when one is attested)."""
    found: dict[str, Any] = {}
    problems: dict[str, str] = {}
    kinds = {ptype: kind for kind, ptype in ATTESTED.items()}
    for layer in read_layers(reg, repository, att_tag(digest)):
        kind = kinds.get(layer.annotations.get(PREDICATE_ANNOTATION, ""), "")
        if not kind or kind in found:
            continue
        try:
            doc = open_envelope(layer.data, keys, digest)
        except SignatureError as exc:
            problems[kind] = str(exc)
            continue
        if doc.get("predicateType") != ATTESTED[kind]:
            problems[kind] = f"its statement's predicate type is {doc.get('predicateType')!r}"
            continue
        found[kind] = doc
        problems.pop(kind, None)
    for kind in PREDICATES:
        if kind not in found and kind not in problems:
            problems[kind] = f"no signed attestation ({att_tag(digest)})"
    return found, problems
