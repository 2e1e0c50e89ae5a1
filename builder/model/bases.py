"""What a base image is called and how a bootstrapped one is trimmed: read by `builder base`
(which makes it), by render (its FROM line and the dpkg excludes later apt steps keep) and by
build (its SOURCE_DATE_EPOCH), so none of them imports another's step."""

from __future__ import annotations

from builder.core import labels
from builder.model import platforms
from builder.model.matrix import Base, Variant

SOURCE_DATE_EPOCH = str(labels.SOURCE_DATE_EPOCH)  # same packages → byte-identical rootfs
# What no image reads at run time never enters the base layer (a later layer could only white it
# out): translations, docs except copyright (the SBOM reads those), man/info pages. The dpkg
# excludes stay in the image, so later apt installs skip them too.
DPKG_EXCLUDES = ("path-exclude=/usr/share/locale/*", "path-exclude=/usr/share/man/*",
                 "path-exclude=/usr/share/info/*", "path-exclude=/usr/share/doc/*",
                 "path-include=/usr/share/doc/*/copyright")


def bootstrap_ref(suite: str, slim: bool = True) -> str:
    """The local name of a base bootstrapped with mmdebstrap (`builder base` tags it)."""
    return f"torch-images-base:{suite}-slim" if slim else f"torch-images-base:{suite}"


def local_ref(base: Base) -> str:
    """The engine's name for a variant's base: the bootstrapped image, or the pulled ref."""
    suite = base.bootstrap_suite
    return bootstrap_ref(suite) if suite else base.image


def registry_served(variant: Variant) -> str | None:
    """The suite of the variant's base when the registry serves it (a bootstrap for a foreign
    platform: BuildKit resolves such a FROM in a registry, so the Dockerfile takes it as the
    build argument BASE_IMAGE, by the digest the build verified); None otherwise."""
    foreign = platforms.get(variant.platform).suffix
    return variant.base.bootstrap_suite if foreign else None
