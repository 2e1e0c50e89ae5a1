"""The registry's build cache, an input like the base: signed when staged, used only verified.

`build --stage --key` pushes the variant's cache image (`<repository>-staging:cache-<tag>`: the
build as BuildKit wrote it, its config carrying the inline cache) and signs the digest the
engine pushed (cosign's `.sig`, its payload naming `cache-<tag>`: builder.stages.staging).
Anyone with push rights to the staging repository can replace that tag (a layer adding a `.pth`
file to site-packages, its diff id in the config): BuildKit would take the step from it
(`CACHED`) and the image would be signed.
So `choose` is the one decision for every build (`build`, `rebuild`, `reproduce`'s child build):
the cache is offered to BuildKit only as `<repository>@sha256:…` after a signature by a trusted
key or identity over that digest names its tag; otherwise the build runs without it and one
line says why.
"""

from __future__ import annotations

from dataclasses import dataclass

from builder.core import oci, sign, vouch
from builder.core.errors import BuilderError
from builder.core.keypair import Vouchers
from builder.model.matrix import Matrix

NO_KEY = ("no trusted key or identity (give --key, --trust-key, --certificate-identity or the "
          "matrix's `trust:`)")


@dataclass(frozen=True)
class Choice:
    """What the build gives BuildKit (`--cache-from` references, by digest) and the line that
    says whether the registry's cache was used and why (not)."""

    refs: tuple[str, ...]
    line: str


def cache_tag(ref: str) -> str:
    """`cache-<tag>` of a cache reference `<registry>/<repository>:cache-<tag>`."""
    return ref.rsplit(":", 1)[1]


def choose(matrix: Matrix, ref: str, vouchers: Vouchers, *,
           wanted: bool = True, reg: oci.Registry | None = None) -> Choice:
    """The registry's cache `ref` (build.cache_ref) by the digest a trusted key or identity
    signed for its tag (builder.core.vouch), or no cache and why: --no-registry-cache, nobody
    trusted, absent, unreadable, unsigned or signed by another key or identity, or a signature
    that does not name the tag (moved to another signed digest)."""
    if not wanted:
        return unused(ref, "--no-registry-cache")
    if not vouchers:
        return unused(ref, NO_KEY)
    repository, tag = matrix.staging_repository, cache_tag(ref)
    reg = reg or oci.Registry(matrix.staging_registry, backoff=())
    try:
        found = reg.head(repository, tag)
        if found is None:
            return unused(ref, "absent")
        signed = vouch.tags_signed_by(reg, repository, found.digest, vouchers)
    except sign.SignatureError as exc:
        return unused(ref, f"its signature did not verify: {exc}")
    except BuilderError as exc:
        return unused(ref, f"it cannot be read: {exc}")
    if tag not in signed:
        return unused(ref, f"its signature does not name the tag `{tag}` (the tag was moved "
                      "to another signed digest?)")
    pinned = f"{matrix.staging_registry}/{repository}@{found.digest}"
    return Choice((pinned,), f"registry cache `{ref}`: used as `{pinned}`, its signature "
                  f"verified against {vouch.describe(vouchers)}")


def unused(ref: str, why: str) -> Choice:
    return Choice((), f"registry cache `{ref}`: not used: {why}")
