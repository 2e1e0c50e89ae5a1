"""A bootstrapped base kept in the registry, signed: `<repository>-base:<suite>-<bootstrap key>`.

A build that stages with a key pushes its local bootstrap there once (our registry client, the
engine's own config bytes and rootfs tarball), signs the manifest digest (cosign's `.sig`, its
payload naming the tag) and attests its provenance (cosign's `.att`: the mmdebstrap inputs, the
image id and the base digest). A runner without the base reads it back only after the signature
and the attestation verify against the trusted keys or identities (builder.core.vouch) — never
by tag alone — and every byte it then fetches is checked against those signed digests
(builder.core.rootfs_image). Anything that does not verify is an `Unverified` naming why; the
caller bootstraps instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import keyless, oci, rootfs_image, sign, vouch
from builder.core.errors import BuilderError
from builder.core.keypair import KeylessSigner, SigningKey, Vouchers
from builder.model import platforms
from builder.model.matrix import Matrix
from builder.model.platforms import Platform

BUILD_TYPE = "https://github.com/torch-images/torch-images/buildtypes/mmdebstrap-base@v1"


class Unverified(BuilderError):
    """The registry's base cannot be used: absent, or not verified (the message says which)."""


class Absent(Unverified):
    """No base under that tag at all (not one that failed to verify)."""


@dataclass(frozen=True)
class Where:
    """Where a bootstrap of one suite and key is kept."""

    registry: str
    repository: str
    tag: str

    @property
    def reference(self) -> str:
        return f"{self.registry}/{self.repository}:{self.tag}"


@dataclass(frozen=True)
class Verified:
    """A base whose signature and provenance verified (or that this run pushed): its layout
    (every digest to fetch by), and what loading it must give, read from that layout."""

    layout: rootfs_image.Layout

    @property
    def image_id(self) -> str:
        return self.layout.config_digest

    @property
    def base_digest(self) -> str:
        return platforms.layers_digest([self.layout.diff_id])


def where(matrix: Matrix, suite: str, key: str, platform: Platform | None = None) -> Where:
    """Where the bootstrap of `suite` with `key` is kept (for a foreign `platform`: its own)."""
    return Where(matrix.registry, platforms.base_repository(matrix.repository),
                 bootstrap_tag(suite, key, platform.arch if platform else None))


def bootstrap_tag(suite: str, key: str, arch: str | None = None) -> str:
    """`<suite>-<key>`, or a foreign platform's `<suite>-slim-<arch>-<key>` (the floating tag
    that BuildKit's FROM names, plus the key)."""
    return f"{platforms.base_tag(suite, arch) if arch else suite}-{key}"


def predicate(inputs: dict[str, Any], image_id: str, base_digest: str) -> dict[str, Any]:
    """The SLSA provenance v1 predicate of a bootstrap: its mmdebstrap inputs, and the image
    id and base digest (builder.stages.base.digest_of) a load of it gives."""
    return {
        "buildDefinition": {
            "buildType": BUILD_TYPE, "externalParameters": inputs, "internalParameters": {},
            "resolvedDependencies": [{"uri": f"pkg:generic/mmdebstrap@{inputs['suite']}",
                                      "name": f"mmdebstrap:{inputs['suite']}"}],
        },
        "runDetails": {
            "builder": {"id": f"pkg:generic/mmdebstrap@{inputs.get('mmdebstrap', '')}"},
            "byproducts": [{"name": "image id", "digest": _sha(image_id)},
                           {"name": "base digest", "digest": _sha(base_digest)}],
        },
    }


def _sha(digest: str) -> dict[str, str]:
    return {"sha256": digest.removeprefix("sha256:")}


def publish(reg: oci.Registry, at: Where, config: bytes, tar: Path, key: SigningKey | None,
            inputs: dict[str, Any], keyless_signer: KeylessSigner | None = None) -> str:
    """Push the base (config bytes and rootfs tarball) under `at`, sign its digest naming the
    tag and attest its provenance, with the key (cosign's `.sig`, `.att`) and/or keylessly
    (sigstore bundles of the same statements); returns the manifest digest. Each step is
    idempotent."""
    digest = rootfs_image.push(reg, at.repository, tar, config, [at.tag])
    image = rootfs_image.layout(reg, at.repository, digest)
    named = sign.tag_annotations("base", [at.tag])
    doc = predicate(inputs, image.config_digest, platforms.layers_digest([image.diff_id]))
    if key is not None:
        sign.sign_image(reg, at.repository, digest, key, named)
        sign.attest(reg, at.repository, digest, key, "provenance", doc)
    if keyless_signer is not None:
        statement = sign.statement(f"{reg.registry}/{at.repository}", digest,
                                   sign.PREDICATES["provenance"], doc)
        keyless.sign_and_attach(reg, at.repository, digest, keyless_signer.token,
                                keyless_signer.config, [statement], named)
    return digest


def verify(reg: oci.Registry, at: Where, vouchers: Vouchers, suite: str) -> Verified:
    """The base at `at`, verified: a signature by one of `vouchers` over its digest that names
    its tag, and a signed provenance about this suite and key whose image id is the manifest's
    config and whose base digest is its layer's. `Unverified` saying why not."""
    return _verified(reg, at, vouchers, suite,
                     lambda signed: [at.tag] if at.tag in signed else [],
                     f"does not name the tag `{at.tag}` (the tag was moved to another signed "
                     "digest?)")


def _verified(reg: oci.Registry, at: Where, vouchers: Vouchers, suite: str,
              keyed: Callable[[set[str]], list[str]], unnamed: str) -> Verified:
    """verify's path: `keyed` picks, from the tags the signatures
    name, those the provenance may be about (`unnamed` says why there are none)."""
    try:
        found = reg.head(at.repository, at.tag)
        if found is None:
            raise Absent(f"`{at.reference}` is absent")
        tags = keyed(signed_tags(reg, at, found.digest, vouchers))
        if not tags:
            raise Unverified(f"the signature of `{at.reference}` {unnamed}")
        doc = provenance(reg, at, found.digest, vouchers)
        image = rootfs_image.layout(reg, at.repository, found.digest)
    except oci.RegistryError as exc:
        raise Unverified(f"`{at.reference}` cannot be read: {exc}") from None
    about = provenance_about(doc)
    return check_provenance(doc, image, suite, about if about in tags else tags[0])


def signed_tags(reg: oci.Registry, at: Where, digest: str,
                vouchers: Vouchers) -> set[str]:
    """The tags that the signatures of `digest` by `vouchers` (keys, identities) name."""
    try:
        return vouch.tags_signed_by(reg, at.repository, digest, vouchers)
    except sign.SignatureError as exc:
        raise Unverified(f"the signature of `{at.reference}` did not verify: {exc}") from None


def provenance(reg: oci.Registry, at: Where, digest: str,
               vouchers: Vouchers) -> dict[str, Any]:
    found, problems = vouch.attestations(reg, at.repository, digest, vouchers)
    if "provenance" not in found:
        raise Unverified(f"the provenance of `{at.reference}` did not verify: "
                         f"{problems.get('provenance', 'none')}")
    return found["provenance"].get("predicate") or {}


def check_provenance(doc: dict[str, Any], image: rootfs_image.Layout, suite: str,
                     tag: str) -> Verified:
    """What the verified provenance states, checked against the signed manifest (a pure
    function: the unit tests give it documents)."""
    inputs = _inputs(doc)
    made = {p.get("name"): "sha256:" + str((p.get("digest") or {}).get("sha256"))
            for p in (doc.get("runDetails") or {}).get("byproducts") or [] if isinstance(p, dict)}
    about = provenance_about(doc)
    if about != tag or inputs["suite"] != suite:
        raise Unverified(f"its provenance is about the bootstrap `{about}`, not `{tag}`")
    if made.get("image id") != image.config_digest:
        raise Unverified(f"its provenance names the image id {str(made.get('image id'))[:19]}, "
                         f"not its config {image.config_digest[:19]}")
    layers = platforms.layers_digest([image.diff_id])
    if made.get("base digest") != layers:
        raise Unverified(f"its provenance names the base digest "
                         f"{str(made.get('base digest'))[:19]}, not its layer's {layers[:19]}")
    return Verified(image)


def _inputs(doc: dict[str, Any]) -> dict[str, Any]:
    return (doc.get("buildDefinition") or {}).get("externalParameters") or {}


def provenance_about(doc: dict[str, Any]) -> str:
    """The keyed tag of the bootstrap a provenance document states (its suite, key, arch)."""
    inputs = _inputs(doc)
    arch = inputs.get("arch")
    return bootstrap_tag(str(inputs.get("suite")), str(inputs.get("bootstrap_key")),
                         str(arch) if arch else None)


def fetch(reg: oci.Registry, at: Where, base: Verified, dest: Path) -> None:
    """The verified base's rootfs tarball into `dest`, every byte checked."""
    try:
        rootfs_image.fetch(reg, at.repository, base.layout, dest)
    except oci.RegistryError as exc:
        raise Unverified(f"`{at.reference}`: {exc}") from None
