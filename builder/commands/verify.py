"""`builder verify`: its options and output; the work is `builder.flows.verify`."""

from __future__ import annotations

import argparse

from builder.commands.options import REGISTRY_CA_HELP, add_ca_bundle_option
from builder.core import proc
from builder.core.errors import FINDINGS
from builder.core.output import emit_json, table
from builder.flows.verify import OK, Reference, verify


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "verify", parents=[common], help="check what is attached to a published image digest",
        description="Fetch, by digest, an image's labels and the smoke report, SBOM and "
        "provenance attached to it, and check them against each other. Needs no checkout. "
        "Exit 0 when all are there and agree, 1 when something is missing or wrong, 2 when the "
        "registry cannot be asked.")
    p.add_argument("reference", metavar="REGISTRY/REPOSITORY@sha256:DIGEST")
    add_ca_bundle_option(p, REGISTRY_CA_HELP)
    p.set_defaults(func=cmd_verify)


def cmd_verify(args: argparse.Namespace) -> int:
    proc.use_ca_bundle(args.ca_bundle)
    reference = Reference.parse(args.reference)
    digest, rows = verify(reference)
    ok = all(r.status == OK for r in rows)
    if args.json:
        emit_json({"reference": f"{reference.registry}/{reference.repository}@{digest}",
                   "ok": ok, "checks": [r.__dict__ for r in rows]})
    else:
        table(["check", "status", "detail"], [(r.what, r.status, r.detail) for r in rows],
              title=f"{reference.registry}/{reference.repository}@{digest}")
    return 0 if ok else FINDINGS

