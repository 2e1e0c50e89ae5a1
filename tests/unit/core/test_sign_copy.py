"""sign.keep_copy / copied_layers / reattach: a `.sig` overwritten by anyone with push rights is
put back from the signed copy of its layers, each layer checked again; nothing else is."""

from __future__ import annotations

import base64
import json

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from memregistry import MemoryRegistry  # type: ignore[import-not-found]

from builder.core import keypair, sign

DIGEST, OTHER = "sha256:" + "a" * 64, "sha256:" + "b" * 64
VID = "2.13.0-py3.11-cpu-runtime"
TAGS = [f"{VID}-20261206", VID]
REF = "r.example:5000/torch"


def new_key() -> keypair.SigningKey:
    return keypair.SigningKey(ec.generate_private_key(ec.SECP256R1()))


def overwritten(reg: MemoryRegistry, key: keypair.SigningKey) -> None:
    """DIGEST signed naming TAGS and its copy kept, then its `.sig` overwritten with junk."""
    sign.sign_image(reg, "torch", DIGEST, key, sign.tag_annotations(VID, TAGS))
    sign.keep_copy(reg, "torch", DIGEST, key)
    junk = [sign.Layer(sign.SIMPLE_SIGNING, b"{}", {sign.SIGNATURE_ANNOTATION: "AAAA"})]
    sign.write_layers(reg, "torch", sign.sig_tag(DIGEST), junk)


def copy_of(reg: MemoryRegistry, key: keypair.SigningKey) -> dict:
    found, _ = sign.verified_attestations(reg, "torch", DIGEST, [key.public])
    return found["signatures"]


def test_an_overwritten_sig_is_put_back_from_its_signed_copy() -> None:
    reg, key = MemoryRegistry(), new_key()
    overwritten(reg, key)
    with pytest.raises(sign.SignatureError):
        sign.verified_payloads(reg, "torch", DIGEST, [key.public])
    layers = sign.copied_layers(copy_of(reg, key), REF, DIGEST, [key.public])
    sign.reattach(reg, "torch", DIGEST, layers)
    assert sign.tags_signed_by(reg, "torch", DIGEST, [key.public]) == set(TAGS)
    sign.reattach(reg, "torch", DIGEST, layers)  # again: nothing added
    assert len(sign.read_layers(reg, "torch", sign.sig_tag(DIGEST))) == 2  # junk + the copy


def test_a_copy_counts_only_for_its_key_and_its_digest() -> None:
    reg, key = MemoryRegistry(), new_key()
    overwritten(reg, key)
    statement = copy_of(reg, key)
    assert sign.copied_layers(statement, REF, DIGEST, [new_key().public]) == []
    assert sign.copied_layers(statement, REF, OTHER, [key.public]) == []
    assert sign.copied_layers(statement, "r.example:5000/other", DIGEST, [key.public]) == []


def test_an_edited_entry_of_the_copy_is_dropped() -> None:
    """The copy's statement is verified as a whole, and each entry's signature again: a payload
    edited to name another tag (were the statement's check ever skipped) does not verify."""
    reg, key = MemoryRegistry(), new_key()
    overwritten(reg, key)
    statement = copy_of(reg, key)
    [entry] = statement["predicate"]["signatures"]
    payload = json.loads(base64.b64decode(entry["payload"]))
    payload["optional"][sign.TAG_ANNOTATION + f"{VID}-20261206.7"] = sign.TAG_SIGNED
    edited = {"payload": base64.b64encode(json.dumps(payload).encode()).decode(),
              "signature": entry["signature"]}
    statement["predicate"]["signatures"] = [edited, "not an entry", {"payload": 1}]
    assert sign.copied_layers(statement, REF, DIGEST, [key.public]) == []


def test_the_copy_holds_every_signature_of_the_key_only() -> None:
    """A rollback signs the digest again (builder.flows.rollback), maybe after its `.sig` was
    overwritten: the copy then holds both signatures of the key, never another key's."""
    reg, key = MemoryRegistry(), new_key()
    overwritten(reg, key)
    sign.sign_image(reg, "torch", DIGEST, key, sign.tag_annotations(VID, [f"{VID}-x"]))
    sign.sign_image(reg, "torch", DIGEST, new_key(), sign.tag_annotations(VID, ["theirs"]))
    sign.keep_copy(reg, "torch", DIGEST, key)
    layers = sign.copied_layers(copy_of(reg, key), REF, DIGEST, [key.public])
    signed = [sign.signed_tags(json.loads(x.data)["optional"]) for x in layers]
    assert signed == [{f"{VID}-x"}, set(TAGS)]
