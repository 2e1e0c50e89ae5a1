"""The bases of a build: a bootstrapped base taken from the registry, signed, when this engine
lacks it, and kept there signed when the build stages with a key.

  absent here   with a trusted key: `<repository>-base:<suite>-<bootstrap key>` verified
                (builder.stages.signed_base), fetched, loaded as a local bootstrap is, and used
                only when it loads to the image id its provenance states; otherwise bootstrapped
                (builder.stages.base), with one line saying why (absent / did not verify: … /
                no trusted key / --no-registry-cache)
  --stage --key the local bootstrap pushed there once, signed and attested (a failure is one
                warning line: the build goes on)
A foreign-platform bootstrap (`ensure_foreign`) is served from the registry (BuildKit resolves a
foreign-platform FROM there): today's keyed `<suite>-slim-<arch>-<bootstrap key>` is used when its
signature and provenance verify against a trusted key (or the signer's), else it is bootstrapped
here (emulated) and pushed, signed under the keyed tag when staging with a key, unsigned under the
floating tag `<suite>-slim-<arch>` only otherwise. The build takes it by the verified digest
(`Bases.pins`, BASE_IMAGE), never by the floating tag, and checks its image's first layer against
the base digest returned here (builder.stages.build). Pulled refs are builder.stages.base's.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from builder.core import clock, engine, oci, reproducible, rootfs_image, vouch
from builder.core.errors import BuilderError
from builder.core.keypair import NOBODY, KeylessSigner, SigningKey, Vouchers, key_id
from builder.core.output import step
from builder.model import platforms
from builder.model.bases import bootstrap_ref, registry_served
from builder.model.matrix import Matrix, Variant
from builder.stages import base, signed_base

Progress = Callable[[str], None]
STAGED_DAYS = 7  # how many days back plan/publish look for the signed base a staged image names
NO_KEY = ("no trusted key or identity (give --key, --trust-key, --certificate-identity or the "
          "matrix's `trust:` to take it from the registry)")


@dataclass(frozen=True)
class BaseOptions:
    """What the build lends its bases: who a registry base must be signed by, the key
    that signs a pushed one (None: nothing pushed), and whether the registry may be read."""

    trusted: Vouchers = NOBODY
    signer: SigningKey | None = None
    from_registry: bool = True
    keyless: KeylessSigner | None = None  # signs a pushed base keylessly (an OIDC token)

    @property
    def signs(self) -> bool:
        return self.signer is not None or self.keyless is not None

    @property
    def verifying(self) -> Vouchers:
        """The trusted keys and identities, and the signer's own key: a base it signed is not
        made again."""
        signer = (self.signer.public,) if self.signer else ()
        known = {t.public_numbers() for t in self.trusted.keys}
        return replace(self.trusted, keys=self.trusted.keys + tuple(
            k for k in signer if k.public_numbers() not in known))


@dataclass(frozen=True)
class Bases:
    """What the bases of a build came to, by platforms.base_key: each one's digest (part of the
    content hash; None when unknown) and, for a base the registry serves (a foreign-platform
    bootstrap), the verified `<registry>/<repository>@<digest>` its FROM takes."""

    digests: dict[str, str | None]
    pins: dict[str, str]


def ensure(matrix: Matrix, variant: Variant, options: BaseOptions,
           progress: Progress = step) -> str | None:
    """The variant's base made available and its digest: a foreign-platform bootstrap by
    `ensure_foreign`; a native one taken from the registry first when it is absent here, and
    kept there signed with `options.signer`; a pulled ref by base.ensure_variant."""
    if suite := registry_served(variant):
        return ensure_foreign(matrix, suite, platforms.get(variant.platform), options,
                              progress).base_digest
    suite = variant.base.bootstrap_suite
    if suite is None:
        return base.ensure_variant(matrix, variant, progress=progress)
    if not base.have_bootstrapped(suite):
        take(matrix, suite, options, progress)
    digest = base.ensure_variant(matrix, variant, progress=progress)
    if options.signs:
        keep(matrix, suite, options, progress)
    return digest


def ensure_all(matrix: Matrix, variants: list[Variant], options: BaseOptions,
               progress: Progress = step) -> Bases:
    """`ensure` for each distinct base of `variants`."""
    made = Bases({}, {})
    for v in variants:
        key = platforms.base_key(v.base.image, v.platform)
        if key in made.digests:
            continue
        if suite := registry_served(v):
            served = ensure_foreign(matrix, suite, platforms.get(v.platform), options, progress)
            made.digests[key], made.pins[key] = served.base_digest, served.pinned
        else:
            made.digests[key] = ensure(matrix, v, options, progress)
    return made


@dataclass(frozen=True)
class Served:
    """A foreign-platform base in the registry: its base digest and the reference by digest
    that a build's FROM takes (never the floating tag, which anyone with push rights moves)."""

    base_digest: str
    pinned: str


def ensure_foreign(matrix: Matrix, suite: str, platform: platforms.Platform,
                   options: BaseOptions, progress: Progress = step) -> Served:
    """Today's bootstrap of `suite` for the foreign `platform`: the registry's keyed one when
    it verifies against the trusted keys (or the signer's own), else bootstrapped here and
    pushed (module docstring)."""
    reg, key = oci.Registry(matrix.registry), base.bootstrap_key(suite, options=base.SLIM_OPTIONS)
    at = signed_base.where(matrix, suite, key, platform)
    trusted = options.verifying
    try:
        if why := skip_reason(replace(options, trusted=trusted)):
            raise signed_base.Unverified(why)
        verified = signed_base.verify(reg, at, trusted, suite)
        progress(f"base {at.reference}: taken ({verified.layout.digest[:19]}), its signature "
                 f"and provenance verified against {vouch.describe(trusted)}")
    except signed_base.Unverified as exc:
        progress(f"base {at.reference}: bootstrapping: {exc}")
        verified = push_foreign(reg, at, suite, key, platform, options, progress)
    return Served(verified.base_digest, f"{at.registry}/{at.repository}@{verified.layout.digest}")


def push_foreign(reg: oci.Registry, at: signed_base.Where, suite: str, key: str,
                 platform: platforms.Platform, options: BaseOptions,
                 progress: Progress) -> signed_base.Verified:
    """Bootstrap today's suite for `platform` and push it: signed and attested under its keyed
    tag `at` with the options' key or OIDC token; without either, under the floating tag only
    (the keyed tag is a signed base's alone). The floating tag names it either way. Returns
    what was pushed (ours)."""
    floating = platforms.base_tag(suite, platform.arch)
    with tempfile.TemporaryDirectory() as tmp:
        config, tar = base.bootstrap_foreign(suite, platform, key, Path(tmp), progress)
        if not options.signs:
            digest = rootfs_image.push(reg, at.repository, tar, config, [floating])
        else:
            digest = signed_base.publish(reg, at, config, tar, options.signer,
                                         base.mmdebstrap_inputs(suite, platform.arch, key),
                                         options.keyless)
            reg.tag(at.repository, digest, floating)
    layout = rootfs_image.layout(reg, at.repository, digest)
    progress(f"base {at.reference}: pushed ({digest[:19]})" + (
        f", signed and attested by {signed_by(options)}" if options.signs else
        f", unsigned: as `{floating}` only"))
    return signed_base.Verified(layout)


def skip_reason(options: BaseOptions) -> str:
    """Why the registry is not even asked for the base ("" when it is)."""
    if not options.from_registry:
        return "--no-registry-cache"
    return "" if options.trusted else NO_KEY


def take(matrix: Matrix, suite: str, options: BaseOptions, progress: Progress) -> bool:
    """The registry's signed bootstrap of today's `suite` loaded here, when it verifies; else
    one line saying why it will be bootstrapped. Returns whether it was taken."""
    ref = bootstrap_ref(suite)
    if why := skip_reason(options):
        progress(f"base {ref}: bootstrapping: {why}")
        return False
    at = where(matrix, suite)
    try:
        image_id = load_verified(oci.Registry(matrix.registry), at, options.trusted, suite)
    except signed_base.Unverified as exc:
        progress(f"base {ref}: bootstrapping: {exc}")
        return False
    progress(f"base {ref}: taken from `{at.reference}` ({image_id[:19]}), its signature and "
             f"provenance verified against {vouch.describe(options.trusted)}")
    return True


def load_verified(reg: oci.Registry, at: signed_base.Where,
                  vouchers: Vouchers, suite: str) -> str:
    """Verify, fetch and load the registry's base; returns its image id. Unverified (and the
    loaded tags removed again) unless it loads to the image id and digest its provenance says."""
    verified = signed_base.verify(reg, at, vouchers, suite)
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "rootfs.tar"
        signed_base.fetch(reg, at, verified, tar)
        image_id = base.load_bootstrapped(suite, tar)
    got = base.digest_of(engine.inspect_image(bootstrap_ref(suite)) or {"RootFS": {"Layers": []}})
    if (image_id, got) != (verified.image_id, verified.base_digest):
        forget(suite)
        raise signed_base.Unverified(
            f"`{at.reference}` loaded as image {image_id[:19]} (base digest {got[:19]}), not "
            f"the {verified.image_id[:19]} ({verified.base_digest[:19]}) its provenance states")
    return image_id


def forget(suite: str) -> None:
    for ref in (base.keyed_ref(suite), bootstrap_ref(suite)):
        engine.docker("image", "rm", ref, check=False)


def keep(matrix: Matrix, suite: str, options: BaseOptions, progress: Progress) -> None:
    """Today's local bootstrap of `suite` in the registry, signed and attested with the
    options' key and/or OIDC token, unless a base there verifies against the key (or a trusted
    identity) already; a failure is one warning line."""
    at = where(matrix, suite)
    reg = oci.Registry(matrix.registry)
    mine = replace(options.trusted, keys=(options.signer.public,)) if options.signer \
        else options.trusted
    try:
        if mine:
            signed_base.verify(reg, at, mine, suite)
            return
    except signed_base.Unverified:
        pass
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config, tar = base.export_bootstrapped(suite, Path(tmp))
            digest = signed_base.publish(reg, at, config, tar, options.signer,
                                         base.mmdebstrap_inputs(suite), options.keyless)
    except BuilderError as exc:
        progress(f"warning: the base was not kept signed in the registry ({exc}); a runner "
                 "without it bootstraps it again")
        return
    progress(f"base {bootstrap_ref(suite)}: pushed as `{at.reference}` ({digest[:19]}), signed "
             f"and attested by {signed_by(options)}")


def signed_by(options: BaseOptions) -> str:
    """Who signed a base this build pushed, for its line."""
    named = [f"key {key_id(options.signer.public)}"] if options.signer else []
    return " and ".join([*named, *(["this job's OIDC identity"] if options.keyless else [])])


def known_digests(matrix: Matrix, variants: list[Variant],
                  trusted: Vouchers) -> dict[str, str | None]:
    """base.known_digests; with `trusted` keys or identities, a bootstrapped base that is not
    this engine's own (a native one it lacks: a fresh runner that plans or publishes; a foreign
    one, which base.known_digests reads by its floating tag, unverified) is the digest
    `staged_digest` finds: the staged images' content hashes are then found without
    bootstrapping, on a later day too. Unknown otherwise (→ build)."""
    digests = base.known_digests(variants, matrix)
    checked: set[str] = set()
    for v in variants if trusted else ():
        suite, platform = v.base.bootstrap_suite, platforms.get(v.platform)
        key = platforms.base_key(v.base.image, v.platform)
        if suite is None or key in checked or (digests.get(key) and not platform.suffix):
            continue
        checked.add(key)
        found = staged_digest(matrix, suite, platform, trusted)
        if found or platform.suffix:  # a foreign base's unverified reading goes
            digests[key] = found
    return digests


def staged_digest(matrix: Matrix, suite: str, platform: platforms.Platform,
                  trusted: Vouchers) -> str | None:
    """The base digest of the newest signed bootstrap of `suite` (for `platform`) of the
    command's day or of the STAGED_DAYS before it: what an image staged then was built on (a
    build stages on the base it signs), so `plan`/`publish` on a later day, on a fresh runner,
    find its content hash. Only days with no base at all are passed over: a newer base that
    does not verify is None (→ unknown), never an older one in its place."""
    for back in range(STAGED_DAYS + 1):
        try:
            return verified_digest(matrix, suite, platform, trusted,
                                   clock.day() - dt.timedelta(days=back))
        except signed_base.Absent:
            continue
        except signed_base.Unverified:
            return None
    return None


def signed_digest(matrix: Matrix, suite: str, platform: platforms.Platform,
                  trusted: Vouchers) -> str | None:
    """The base digest of the registry's signed bootstrap of `suite` (for `platform`) of today;
    None when it does not verify against `trusted`. Never an older signed base that a floating
    tag points at: that would let anyone with push rights roll the base back (→ build)."""
    with contextlib.suppress(signed_base.Unverified):
        return verified_digest(matrix, suite, platform, trusted, clock.day())
    return None


def verified_digest(matrix: Matrix, suite: str, platform: platforms.Platform,
                    trusted: Vouchers, day: dt.date) -> str:
    """The base digest of `day`'s signed bootstrap, verified against `trusted` (Unverified,
    or Absent, saying why not)."""
    return signed_base.verify(oci.Registry(matrix.registry), where(matrix, suite, platform, day),
                              trusted, suite).base_digest


def foreign_digest_now(matrix: Matrix, suite: str, platform: platforms.Platform,
                       trusted: Vouchers,
                       progress: Progress = step) -> str:
    """Today's base digest of `suite` for `platform`, writing nothing to the registry (what
    `rebuild --check` compares): the registry's signed bootstrap of today when it verifies,
    else a bootstrap made here (emulated) and not pushed."""
    if trusted and (found := signed_digest(matrix, suite, platform, trusted)):
        return found
    with tempfile.TemporaryDirectory() as tmp:
        key = base.bootstrap_key(suite, options=base.SLIM_OPTIONS)
        _config, tar = base.bootstrap_foreign(suite, platform, key, Path(tmp), progress)
        return platforms.layers_digest([reproducible.file_digest(tar)])


def where(matrix: Matrix, suite: str, platform: platforms.Platform | None = None,
          day: dt.date | None = None) -> signed_base.Where:
    """Where today's (or `day`'s) slim bootstrap of `suite` (for the foreign `platform`) is
    kept."""
    key = base.bootstrap_key(suite, day, options=base.SLIM_OPTIONS)
    return signed_base.where(matrix, suite, key, platform if platform and platform.suffix else None)
