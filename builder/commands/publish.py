"""`builder publish`: its options and output; the work is `builder.flows.publish`."""

from __future__ import annotations

import argparse
import re
from typing import Any

from builder.commands.options import (
    REGISTRY_CA_HELP,
    add_ca_bundle_option,
    add_command,
    add_keyless_options,
    add_publishing_options,
    ignore_old_record,
    keyless_signer,
    load_selected,
    vouchers,
)
from builder.core import keypair
from builder.core.errors import GateRefused, UsageError
from builder.core.output import emit_json, step, table
from builder.flows import bases, rollback
from builder.flows.publish import publish_variants
from builder.stages import plan, render

GROUPS = ("matrix", "select", "json", "registries", "locks")


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "publish", cmd_publish, GROUPS,
                    "promote gated images from staging under dated tags (the registry: the record)")
    add_publishing_options(p, "print what would be pushed; push nothing")
    add_keyless_options(p)
    add_ca_bundle_option(p, REGISTRY_CA_HELP)
    p.add_argument("--rollback-to", metavar="DATED_TAG",
                   help="point the floating tag, aliases and twins of that signed dated "
                   "publication's variant back at it, signing the rollback (needs --key); "
                   "builds, gates and pushes nothing else")


def cmd_publish(args: argparse.Namespace) -> int:
    """Promote each selected variant (default: the matrix's default selection): find its staged
    image by content hash (staging a local image first), check that its config is the plan's,
    that its smoke report (every check, on this image; CUDA: on a GPU) and SBOM are attested by a
    trusted key or identity (--trust-key, --certificate-identity…, else the matrix's `trust:`)
    and valid, copy it into the vetted repository by digest, attach SBOM, smoke report and
    provenance with their signed attestations, sign the digest naming its tags (cosign's format:
    --key or COSIGN_PRIVATE_KEY; keyless with an OIDC token, --identity-token,
    SIGSTORE_ID_TOKEN or a GitHub Actions job's own (`id-token: write`): sigstore bundles of
    the digest and its evidence, as `builder attest` writes them; either or both), then tag
    `<tag>-YYYYMMDD` (never overwritten), `build-<hash>`, the floating tag and aliases. Never
    builds; a stopped run is completed by the next. Exit 1 when any image was refused."""
    if args.rollback_to and args.dry_run:
        raise UsageError("--rollback-to moves tags: it has no --dry-run",
                         hint="`builder verify --key` of the dated tag shows what it names")
    if not args.select:
        args.select = ["default=true"]
    matrix, variants = load_selected(args)
    ignore_old_record(args.manifest)
    trust = keypair.trust(args.key, vouchers(args, matrix), args.unsigned, keyless_signer(args))
    if args.rollback_to:
        return show([rollback.rollback_to(matrix, args.rollback_to, trust)], args.json)
    rendered = [render.render_locked(matrix, v, args.locks) for v in variants]
    planned = plan.make_plan(matrix, rendered,
                             bases.known_digests(matrix, variants, trust.vouchers),
                             check_registry=False)
    results = publish_variants(matrix, planned, allow_cpu_smoke=args.allow_cpu_smoke,
                               dry_run=args.dry_run, manifest=args.manifest,
                               locks_dir=args.locks, trust=trust)
    show(results, args.json)
    if line := nothing_to_do(results, args.dry_run):
        step(line)
    refused = [r for r in results if r["status"] == "refused"]
    if refused:
        reasons = "; ".join(f"{r['id']}: {r['reason']}" for r in refused)
        total = len({re.sub(r"\.linux-\w+$", "", r["id"]) for r in results})  # once each
        raise GateRefused(f"{len(refused)} of {total} variants refused: {reasons}",
                          hint=refusal_hint(args.select, refused), printed=args.json)
    return 0


def show(results: list[dict[str, Any]], as_json: bool) -> int:
    """The results, as JSON or as a table; 0."""
    if as_json:
        emit_json(results)
    else:
        table(["variant", "status", "tags / reason"],
              [(r["id"], r["status"] + (" UNSIGNED" if r.get("unsigned") else ""),
                r.get("reason") or ", ".join(r.get("tags", [])))
               for r in results])
    return 0


def nothing_to_do(results: list[dict[str, Any]], dry_run: bool) -> str | None:
    """The line a run with nothing new ends with: the registry already holds every selected
    variant with this content (a dry run then would push nothing)."""
    if not results or any(r["status"] != "already-published" for r in results):
        return None
    return ("nothing to do: " + ("the dry run would push nothing; " if dry_run else "")
            + f"every selected variant ({len(results)}) is already published with this content")


def refusal_hint(typed: list[str], refused: list[dict[str, object]]) -> str:
    """What to do, naming only what the user typed (a `--select platform=` they gave)."""
    narrowed = [s for s in typed if s.startswith("platform=")]
    if narrowed and any(r.get("missing_platforms") for r in refused):
        return (f"one index holds every declared platform: drop "
                f"{' '.join('`--select ' + s + '`' for s in narrowed)} once every platform "
                "is staged; nothing of them was pushed")
    return "nothing of them was pushed; see the reasons above"
