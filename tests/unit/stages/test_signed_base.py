"""builder.stages.signed_base and builder.core.rootfs_image against an in-memory registry: a
base pushed, signed and attested verifies and comes back byte for byte; one signed by another
key, one whose tag was moved, one whose provenance disagrees with its manifest and one whose
layer bytes were swapped are each refused, saying why."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from memregistry import MemoryRegistry

from builder.core import keypair, oci, reproducible, rootfs_image
from builder.core.keypair import Vouchers
from builder.model import platforms
from builder.stages import signed_base

WHERE = signed_base.Where("r.example:5000", "torch-base", "bookworm-0123456789abcdef")
INPUTS = {"suite": "bookworm", "bootstrap_key": "0123456789abcdef", "packages": ["ca-certificates"],
          "options": ["--dpkgopt=x"], "SOURCE_DATE_EPOCH": "1704067200", "mmdebstrap": "1.3.5"}


def new_key() -> keypair.SigningKey:
    return keypair.SigningKey(ec.generate_private_key(ec.SECP256R1()))


def rootfs(tmp_path: Path, content: bytes = b"a rootfs") -> tuple[bytes, Path]:
    """A tarball and the config the engine would hold for it (as load_rootfs writes it)."""
    tar = tmp_path / "rootfs.tar"
    tar.write_bytes(content * 500)
    config = reproducible.rootfs_config(reproducible.file_digest(tar), "mmdebstrap", ["bash"])
    return reproducible.config_bytes(config), tar


@pytest.fixture
def pushed(tmp_path: Path) -> tuple[MemoryRegistry, keypair.SigningKey, bytes, Path]:
    reg, key = MemoryRegistry(), new_key()
    config, tar = rootfs(tmp_path)
    signed_base.publish(reg, WHERE, config, tar, key, INPUTS)  # type: ignore[arg-type]
    return reg, key, config, tar


def test_a_published_base_verifies_and_comes_back_byte_for_byte(pushed, tmp_path) -> None:
    reg, key, config, tar = pushed
    verified = signed_base.verify(reg, WHERE, Vouchers((key.public,)), "bookworm")
    assert verified.image_id == oci.sha256(config)  # the engine's image id of that config
    assert verified.base_digest == platforms.layers_digest([reproducible.file_digest(tar)])
    dest = tmp_path / "back.tar"
    signed_base.fetch(reg, WHERE, verified, dest)  # type: ignore[arg-type]
    assert dest.read_bytes() == tar.read_bytes()


def test_publishing_again_adds_nothing(pushed) -> None:
    reg, key, config, tar = pushed
    before = dict(reg.manifests)
    signed_base.publish(reg, WHERE, config, tar, key, INPUTS)  # type: ignore[arg-type]
    assert reg.manifests == before


def test_an_absent_base_says_so() -> None:
    with pytest.raises(signed_base.Unverified, match="is absent"):
        signed_base.verify(MemoryRegistry(), WHERE, Vouchers((new_key().public,)), "bookworm")


def test_a_base_signed_by_another_key_is_refused(pushed) -> None:
    reg, *_ = pushed
    with pytest.raises(signed_base.Unverified,
                       match="did not verify: no valid signature: a signature by another key"):
        signed_base.verify(reg, WHERE, Vouchers((new_key().public,)), "bookworm")


def test_a_tag_moved_to_another_signed_base_is_refused(pushed, tmp_path) -> None:
    reg, key, *_ = pushed
    other = signed_base.Where(WHERE.registry, WHERE.repository, "bookworm-fedcba9876543210")
    config, tar = rootfs(tmp_path, b"yesterday's rootfs")
    digest = signed_base.publish(reg, other, config, tar, key,  # type: ignore[arg-type]
                                 {**INPUTS, "bootstrap_key": "fedcba9876543210"})
    reg.put_manifest(WHERE.repository, WHERE.tag, reg.manifests[(WHERE.repository, digest)],
                     oci.OCI_MANIFEST)
    with pytest.raises(signed_base.Unverified, match="does not name the tag"):
        signed_base.verify(reg, WHERE, Vouchers((key.public,)), "bookworm")


def test_swapped_layer_bytes_are_refused_and_nothing_is_left(pushed, tmp_path) -> None:
    reg, key, *_ = pushed
    verified = signed_base.verify(reg, WHERE, Vouchers((key.public,)), "bookworm")
    reg.tamper(verified.layout.layer_digest, gzip.compress(b"another rootfs" * 500))
    dest = tmp_path / "back.tar"
    with pytest.raises(signed_base.Unverified, match="not the diff id"):
        signed_base.fetch(reg, WHERE, verified, dest)  # type: ignore[arg-type]
    assert not dest.exists()


def layout() -> rootfs_image.Layout:
    return rootfs_image.Layout(digest="sha256:" + "1" * 64, config_digest="sha256:" + "2" * 64, layer_digest="sha256:" + "3" * 64,
                               layer_size=10, diff_id="sha256:" + "4" * 64)


def provenance(**changes: str) -> dict:
    image = layout()
    doc = signed_base.predicate({**INPUTS, **changes}, image.config_digest,
                                platforms.layers_digest([image.diff_id]))
    return json.loads(json.dumps(doc))


def test_provenance_that_matches_the_signed_manifest_gives_what_a_load_must_give() -> None:
    verified = signed_base.check_provenance(provenance(), layout(), "bookworm", WHERE.tag)
    assert verified.image_id == layout().config_digest
    assert verified.base_digest == platforms.layers_digest([layout().diff_id])


@pytest.mark.parametrize(("doc", "suite", "why"), [
    (provenance(suite="trixie"), "bookworm", "about the bootstrap `trixie-0123456789abcdef`"),
    (provenance(bootstrap_key="ffff"), "bookworm", "not `bookworm-0123456789abcdef`"),
    ({}, "bookworm", "about the bootstrap `None-None`"),
])
def test_provenance_about_another_bootstrap_is_refused(doc, suite, why) -> None:
    with pytest.raises(signed_base.Unverified, match=why.replace("(", r"\(")):
        signed_base.check_provenance(doc, layout(), suite, WHERE.tag)


def test_a_foreign_bases_provenance_must_name_its_platform() -> None:
    """An arm64 bootstrap's signed provenance cannot stand for the amd64 one, nor the reverse:
    the tag it is about is derived from its suite, key and arch."""
    arm = signed_base.bootstrap_tag("bookworm", "0123456789abcdef", "arm64")
    assert arm == "bookworm-slim-arm64-0123456789abcdef"
    assert signed_base.check_provenance(provenance(arch="arm64"), layout(), "bookworm", arm)
    for doc in (provenance(), provenance(arch="riscv64")):
        with pytest.raises(signed_base.Unverified, match=f"not `{arm}`"):
            signed_base.check_provenance(doc, layout(), "bookworm", arm)
    with pytest.raises(signed_base.Unverified, match="about the bootstrap `bookworm-slim-arm64-"):
        signed_base.check_provenance(provenance(arch="arm64"), layout(), "bookworm", WHERE.tag)


def test_provenance_naming_another_image_id_is_refused() -> None:
    doc = provenance()
    doc["runDetails"]["byproducts"][0]["digest"]["sha256"] = "9" * 64
    with pytest.raises(signed_base.Unverified, match="names the image id sha256:9999"):
        signed_base.check_provenance(doc, layout(), "bookworm", WHERE.tag)


def test_a_base_pushed_with_an_oidc_token_alone_is_signed_keylessly(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No key: the base's image statement names its tag and its provenance is attested, both
    as sigstore bundles (what a runner trusting the workflow identity verifies); no `.sig`."""
    from builder.core import keyless, sign

    made = []
    monkeypatch.setattr(keyless, "sign_and_attach", lambda reg, repository, digest, token,
                        config, statements, optional: made.append((token, statements, optional)))
    reg = MemoryRegistry()
    config, tar = rootfs(tmp_path)
    digest = signed_base.publish(reg, WHERE, config, tar, None, INPUTS,  # type: ignore[arg-type]
                                 keypair.KeylessSigner("TOKEN"))
    [(token, [statement], optional)] = made
    assert token == "TOKEN" and sign.signed_tags(optional) == {WHERE.tag}
    assert statement["predicateType"] == sign.PREDICATES["provenance"]
    assert statement["subject"][0]["digest"]["sha256"] == digest.removeprefix("sha256:")
    assert reg.head(WHERE.repository, sign.sig_tag(digest)) is None
