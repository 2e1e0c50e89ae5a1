"""`builder attest REF`: keyless signing of a published image and its evidence."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from builder.commands.options import REGISTRY_CA_HELP, add_ca_bundle_option, add_command
from builder.commands.verify import reference_of
from builder.core import keyless, oci, sign
from builder.core.errors import BuilderError
from builder.core.output import emit_json


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "attest", cmd_attest, ("matrix", "json", "registries"),
                    "sign an image and its evidence keylessly (sigstore bundles as referrers)")
    p.add_argument("reference", metavar="REF",
                   help="REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:DIGEST")
    add_signing_options(p)
    add_ca_bundle_option(p, REGISTRY_CA_HELP)


def add_signing_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--identity-token", type=Path, metavar="FILE",
                   help="OIDC token to sign with (default: $SIGSTORE_ID_TOKEN; in GitHub Actions "
                   "the job's token for audience `sigstore`)")
    p.add_argument("--sigstore-config", type=Path, metavar="FILE",
                   help="sigstore client trust config (trusted root + signing config: which "
                   "Fulcio, Rekor, TSA); default: sigstore's public-good instance")


def cmd_attest(args: argparse.Namespace) -> int:
    """Sign REF's digest keylessly with the identity of an OIDC token: a short-lived Fulcio
    certificate names the workflow (`https://github.com/O/R/.github/workflows/F@REF`), Rekor logs
    each signature, and one sigstore bundle (application/vnd.dev.sigstore.bundle.v0.3+json) per
    statement is attached to the digest as an OCI referrer (the `sha256-<hex>` fallback index):
    the image's own (cosign's `https://sigstore.dev/cosign/sign/v1`) and one per piece of
    evidence attached to it (SBOM, smoke report, provenance). `builder verify
    --certificate-identity … --certificate-oidc-issuer …` checks them; so do `gh attestation
    verify` and `cosign verify --new-bundle-format`. No private key is involved."""
    token = keyless.identity_token(args.identity_token, dict(os.environ))
    if token is None:
        raise BuilderError("no identity token to sign with",
                           hint="give --identity-token FILE or set SIGSTORE_ID_TOKEN")
    reference = reference_of(args.reference, args.matrix)
    reg = oci.Registry(reference.registry)
    desc = reg.head(reference.repository, reference.ref)
    if desc is None:
        raise BuilderError(f"`{reference.registry}/{reference.repository}` has no image "
                           f"`{reference.ref}`")
    statements = evidence_statements(reg, reference.repository, desc.digest)
    signer = keyless.sign_and_attach(reg, reference.repository, desc.digest, token,
                                     args.sigstore_config, statements)
    kinds = [x["predicateType"] for x in statements]
    if args.json:
        emit_json({"digest": desc.digest, "signer": signer.subject, "issuer": signer.issuer,
                   "attested": [keyless.IMAGE_PREDICATE, *kinds]})
    else:
        print(f"attested {desc.digest[:19]} as {signer.describe()}: the image and "
            f"{len(kinds)} evidence statement(s)")
    return 0


def evidence_statements(reg: oci.Registry, repository: str, digest: str
                        ) -> list[dict[str, Any]]:
    """An in-toto statement for each piece of evidence attached to `digest` (the provenance is
    one already: its predicate is taken)."""
    name = f"{reg.registry}/{repository}"
    found = []
    for kind, predicate_type in sign.PREDICATES.items():
        data = reg.fetch_artifact(repository, digest, kind)
        if data is None:
            continue
        try:
            doc = json.loads(data)
        except ValueError:
            continue
        predicate = doc.get("predicate") if kind == "provenance" and isinstance(doc, dict) \
            else doc
        found.append(sign.statement(name, digest, predicate_type, predicate))
    return found
