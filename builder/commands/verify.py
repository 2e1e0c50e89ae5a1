"""`builder verify`: its options and output; the work is `builder.flows.verify`."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.commands.options import (
    REGISTRY_CA_HELP,
    add_ca_bundle_option,
    add_command,
    add_identity_options,
    identities,
    trusted_root,
)
from builder.core import keyless, keypair
from builder.core.errors import BuilderError, CheckFailed
from builder.core.output import emit_json, table
from builder.flows.verify import PASSING, Policy, Reference, verify
from builder.model import matrix


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "verify", cmd_verify, ("matrix", "json", "registries"),
                    "check a published image: signature, attestations, evidence")
    p.add_argument("reference", metavar="REF",
                   help="REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:DIGEST; a bare "
                   "TAG or sha256:DIGEST is one of --matrix's `registry`/`repository`")
    p.add_argument("--key", action="append", type=Path, default=[], metavar="FILE",
                   help="trusted public key (cosign.pub; repeatable): the signature and every "
                   "attestation must verify against one of them")
    add_identity_options(p, "the image and its attestations", "none")
    p.add_argument("--require-all", action="store_true",
                   help="with both --key and identities: every one must verify, not either")
    p.add_argument("--contents-only", action="store_true",
                   help="without --key: check labels and evidence only (the signature row says "
                   "`unsigned: contents only`); never what a platform team should rely on")
    p.add_argument("--require-gpu", action="store_true",
                   help="fail a CUDA image whose GPU smoke checks ran only as CPU stand-ins")
    add_ca_bundle_option(p, REGISTRY_CA_HELP)


def cmd_verify(args: argparse.Namespace) -> int:
    """Resolve REF (a tag or a digest) to a digest and check, by that digest: with --key, its
    cosign signature and the signature and subject of each attestation (SBOM, SLSA provenance,
    smoke report), whose documents are then the ones checked; with --certificate-identity[-
    regexp] and --certificate-oidc-issuer, the same through sigstore bundles attached as OCI
    referrers (certificate chained to --trusted-root, log entry verified, signer and issuer
    trusted, subject the digest; either keys or identities suffice unless --require-all); then
    the image's labels, smoke report, SBOM and provenance against each other. Asked by a tag,
    TAG must be among the tags signed for the digest, agree with the labels of every platform
    (torch, python, accelerator, CUDA, cuDNN, flavor; `build-<hash>`: the content hash), and a
    floating tag or alias must not point at an older publication than its latest dated tag.
    Without --key or an identity it exits 1 (`signature not checked`) unless --contents-only
    asks for the contents alone. Needs no checkout (a bare TAG takes registry and repository
    from --matrix). Exit 0 when all passes, 1 naming what failed, 2 when the registry cannot be
    asked."""
    reference = reference_of(args.reference, args.matrix)
    named = identities(args)
    root = trusted_root(args) or keyless.PUBLIC_GOOD_ROOT
    policy = Policy(keys=tuple(keypair.load_public(path) for path in args.key),
                    require_gpu=args.require_gpu,
                    contents_only=args.contents_only and not (args.key or named),
                    by_identity=keyless.KeylessPolicy(named, root),
                    require_all=args.require_all)
    digest, rows = verify(reference, policy)
    failed = [r for r in rows if r.status not in PASSING]
    if args.json:
        emit_json({"reference": f"{reference.registry}/{reference.repository}@{digest}",
                   "ok": not failed, "checks": [r.__dict__ for r in rows]})
    else:
        table(["check", "status", "detail"], [(r.what, r.status, r.detail) for r in rows],
              title=f"{reference.registry}/{reference.repository}@{digest}")
    if failed:
        more = f" (and {len(failed) - 1} more failed checks)" if len(failed) > 1 else ""
        raise CheckFailed(f"{failed[0].what}: {failed[0].detail}{more}", printed=args.json)
    return 0


def reference_of(text: str, matrix_path: str) -> Reference:
    """REF as given, or a bare TAG (or `sha256:…` digest) in the matrix's registry and
    repository, so that the README's commands hold for any `repository:`."""
    if "/" in text or (":" in text and not text.startswith("sha256:")):
        return Reference.parse(text)
    if not Path(matrix_path).is_file():
        raise BuilderError(f"`{text}` names no registry and repository, and there is no "
                           f"{matrix_path} to take them from",
                           hint="give REGISTRY/REPOSITORY:TAG, or --matrix FILE")
    m = matrix.load(matrix_path)
    return Reference.parse(f"{m.registry}/{m.repository}{'@' if ':' in text else ':'}{text}")
