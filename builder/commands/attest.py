"""`builder attest REF`: keyless signing of a published image and its evidence."""

from __future__ import annotations

import argparse
import os

from builder.commands.options import (
    REGISTRY_CA_HELP,
    add_ca_bundle_option,
    add_command,
    add_keyless_options,
    sigstore_config,
)
from builder.commands.verify import reference_of
from builder.core import keyless, oci
from builder.core.errors import BuilderError
from builder.core.output import emit_json


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "attest", cmd_attest, ("matrix", "json", "registries"),
                    "sign an image and its evidence keylessly (sigstore bundles as referrers)")
    p.add_argument("reference", metavar="REF",
                   help="REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:DIGEST")
    add_keyless_options(p)
    add_ca_bundle_option(p, REGISTRY_CA_HELP)


def cmd_attest(args: argparse.Namespace) -> int:
    """Sign REF's digest keylessly with the identity of an OIDC token: a short-lived Fulcio
    certificate names the workflow (`https://github.com/O/R/.github/workflows/F@REF`), Rekor logs
    each signature, and one sigstore bundle (application/vnd.dev.sigstore.bundle.v0.3+json) per
    statement is attached to the digest as an OCI referrer (the `sha256-<hex>` fallback index):
    the image's own (cosign's `https://sigstore.dev/cosign/sign/v1`) and one per piece of
    evidence attached to it (SBOM, smoke report, provenance). `builder verify
    --certificate-identity … --certificate-oidc-issuer …` checks them (the layout `gh attestation
    verify oci://…` and cosign's --new-bundle-format read). No private key is involved."""
    token = keyless.identity_token(args.identity_token, dict(os.environ))
    if token is None:
        raise BuilderError("no identity token to sign with",
                           hint="give --identity-token FILE, set SIGSTORE_ID_TOKEN, or run in "
                           "a GitHub Actions job with `permissions: id-token: write`")
    reference = reference_of(args.reference, args.matrix)
    reg = oci.Registry(reference.registry)
    desc = reg.head(reference.repository, reference.ref)
    if desc is None:
        raise BuilderError(f"`{reference.registry}/{reference.repository}` has no image "
                           f"`{reference.ref}`")
    signer, kinds = keyless.attest_digest(reg, reference.repository, desc.digest, token,
                                          sigstore_config(args))
    if args.json:
        emit_json({"digest": desc.digest, "signer": signer.subject, "issuer": signer.issuer,
                   "attested": [keyless.IMAGE_PREDICATE, *kinds]})
    else:
        print(f"attested {desc.digest[:19]} as {signer.describe()}: the image and "
              f"{len(kinds)} evidence statement(s)")
    return 0
