"""`builder build`: its options and output; the work is `builder.flows.build`."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from builder.commands.options import (
    add_ca_bundle_option,
    add_command,
    add_identity_options,
    add_key_option,
    add_keyless_options,
    keyless_signer,
    load_selected,
    vouchers,
)
from builder.core import keypair
from builder.core.errors import UsageError
from builder.core.output import emit_json, human_bytes, step, table
from builder.flows import bases
from builder.flows.build import BuildOptions, Outcome, build_images, build_lock
from builder.model import platforms
from builder.model.matrix import Variant
from builder.stages import render


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "base", cmd_base, ("matrix", "select", "json", "registries"),
                    "make the selected variants' base images available")
    add_base_trust_option(p, "the matrix's `trust.keys`")

    p = add_command(sub, "build", cmd_build, ("matrix", "select", "json", "registries", "locks"),
                    "build images for the selected variants")
    p.add_argument("--force", action="store_true", help="rebuild even up-to-date variants")
    p.add_argument("--relock", action="store_true",
                   help="re-lock variants whose lock is out of date (instead of refusing them)")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed variant")
    p.add_argument("--no-smoke", action="store_true", help="skip the smoke suite")
    p.add_argument("--no-sbom", action="store_true", help="skip the SBOM")
    p.add_argument("--resmoke", action="store_true",
                   help="run the smoke suite and the SBOM again even for an image whose id "
                   "already has them in the state folder (a rebuild that gave the same id "
                   "reuses them; --force also runs them again)")
    p.add_argument("--stage", action="store_true",
                   help="push each new image by digest to `<repository>-staging` with its smoke "
                   "report and SBOM attached, for other machines (GPU smoke, publish)")
    add_key_option(p, "the smoke report and SBOM attached at --stage (their attestations), "
                   "the build cache image and the bootstrapped base kept in the registry")
    add_keyless_options(p)  # --stage with an OIDC token: the kept base signed keylessly
    add_base_trust_option(p, "the matrix's `trust.keys`, else the --key's own public key")
    p.add_argument("--require-gpu", action="store_true",
                   help="GPU checks that cannot run on this host fail instead of being skipped")
    # The install steps fetch missing wheels themselves, so they get the host's trust store (a
    # TLS-intercepting proxy's CA included) — only ever as a secret mount.
    add_ca_bundle_option(p, "CA bundle for downloads inside the build, passed as a BuildKit "
                         "secret (never stored in a layer); default: $BUILDER_CA_BUNDLE, else "
                         "the host's")
    p.add_argument("--no-registry-cache", action="store_true",
                   help="do not reuse the layers the registry holds for the variant (its "
                   "`<repository>-staging:cache-<tag>` image, pushed and signed by --stage --key, "
                   "used only when that signature verifies) nor its signed bootstrapped base "
                   "(bootstrapped here instead)")
    p.add_argument("--verify-reproducible", action="store_true",
                   help="with --stage: build each new image again with no cache at all and "
                   "stage it only when that gives the same image id (a full second build)")
    p.add_argument("--apt-refresh", default="", metavar="TOKEN",
                   help="re-run the apt upgrade step (security rebuilds pass a new token)")


def add_base_trust_option(p: argparse.ArgumentParser, default: str) -> None:
    p.add_argument("--trust-key", action="append", type=Path, default=[], metavar="FILE",
                   help="public key (cosign.pub) a bootstrapped base or build cache taken from "
                   f"the registry must be signed by (repeatable; default: {default}; none: the "
                   "base is bootstrapped here, the build runs without the registry's cache)")
    add_identity_options(p, "a bootstrapped base or build cache taken from the registry",
                         "the matrix's `trust.identities`")


def cmd_base(args: argparse.Namespace) -> int:
    """Pull each base image ref, or make `mmdebstrap:<suite>` a local image: today's signed
    bootstrap from the registry when it verifies against --trust-key or an identity (or the
    matrix's `trust:`), else bootstrapped here (reused while suite, packages and day are unchanged).
    Prints each base's digest, which is part of every variant's content hash."""
    matrix, variants = load_selected(args)
    # One per base and platform (keys: platforms.base_key); off linux/amd64 a bootstrapped base
    # is served from the registry, a pulled one is left to BuildKit (digest unknown: None).
    first = {platforms.base_key(v.base.image, v.platform): v for v in variants}
    options = bases.BaseOptions(vouchers(args, matrix))
    digests = {key: bases.ensure(matrix, v, options, step) for key, v in first.items()}
    if args.json:
        emit_json(digests)
    else:
        table(["base", "image", "digest"],
              [(key, render.base_ref(first[key], matrix), d or "-") for key, d in digests.items()])
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    """Build the plan's `build` variants (default selection: the matrix's `default`) with
    BuildKit, skip up-to-date ones, then smoke-test and write an SBOM for each new image. Logs:
    .state/logs/<variant>.log."""
    by_default = not args.select
    if by_default:
        args.select = ["default=true"]
    with build_lock():
        outcomes = run_build(args, leave_foreign=by_default)
    if args.json:
        emit_json([o.as_json() for o in outcomes])
    else:
        table(["variant", "state", "smoke", "sbom", "size", "time", "image"],
              [(o.variant_id, o.state + (f" ({o.message})" if o.message else ""), o.smoke,
                "-" if o.sbom_components is None else f"{o.sbom_components} components",
                human_bytes(o.size) if o.size else "-",
                f"{o.seconds:.0f} s" if o.seconds else "-", o.image) for o in outcomes])
    return exit_status(outcomes)


def exit_status(outcomes: list[Outcome]) -> int:
    """1 for a failed build or smoke test, else 2 when a platform could not be built here."""
    states = {o.state for o in outcomes}
    if states - {"built", "up-to-date", "skipped"}:
        return 1
    return 2 if "skipped" in states else 0


def run_build(args: argparse.Namespace, leave_foreign: bool = False) -> list[Outcome]:
    """The selected variants built; with `leave_foreign` (the default selection) only this
    host's own platform: the others are named and left to a runner of theirs."""
    matrix, variants = load_selected(args)
    if leave_foreign:
        variants = left_to_other_runners(variants)
    options = build_options(args)
    return build_images(matrix, variants, replace(options, trusted=vouchers(args, matrix)))


def left_to_other_runners(variants: list[Variant]) -> list[Variant]:
    """The variants of this host's platform; one line names each platform left to another
    runner (or to an explicit emulated build) and what it holds."""
    here = platforms.host()
    native = [v for v in variants if here is not None and v.platform == here.name]
    foreign: dict[str, list[str]] = {}
    for v in variants:
        if v not in native:
            foreign.setdefault(v.platform, []).append(v.id)
    for name, ids in sorted(foreign.items()):
        step(f"{name}: left to a {name} runner: {', '.join(ids)} (here, emulated: builder build "
             f"--select platform={name})")
    return native


def build_options(args: argparse.Namespace) -> BuildOptions:
    """What `builder build` was asked for, as the build stage takes it."""
    if args.verify_reproducible and not args.stage:
        raise UsageError("--verify-reproducible without --stage",
                         hint="it checks an image before it is staged: add --stage")
    return BuildOptions(locks=args.locks, force=args.force, relock=args.relock,
                        fail_fast=args.fail_fast, smoke=not args.no_smoke, sbom=not args.no_sbom,
                        resmoke=args.resmoke or args.force, stage=args.stage,
                        require_gpu=args.require_gpu, apt_refresh=args.apt_refresh,
                        registry_cache=not args.no_registry_cache,
                        verify_reproducible=args.verify_reproducible,
                        key=keypair.signing_key(args.key) if args.stage or args.key else None,
                        keyless=keyless_signer(args) if args.stage else None)
