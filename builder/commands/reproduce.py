"""`builder reproduce REF@sha256:…`: rebuild a published image from its provenance and compare
(builder.flows.reproduce)."""

from __future__ import annotations

import argparse
from pathlib import Path

from builder.commands.options import add_command
from builder.core.errors import FINDINGS
from builder.core.output import emit_json, human_bytes, step, table
from builder.flows.reproduce import Result, reproduce


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "reproduce", cmd_reproduce, ("matrix", "json", "registries"),
                    "rebuild a published image from its provenance and compare digests")
    p.add_argument("reference", metavar="REF@sha256:DIGEST",
                   help="a published image by digest (published.json `reference`)")


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Read the provenance attached to REF@sha256:… (commit, lock and its hash, base digest),
    check that commit out into a temporary worktree, make the recorded base present, rebuild
    the variant on this engine and compare. Exit 0: the same image (config digest, so every
    layer); 1: a table of the layers and, for each differing one, the first paths that differ;
    2: could not run."""
    # The commit's own matrix unless another one is named (e.g. one naming another registry).
    matrix = None if args.matrix == "matrix.yaml" else Path(args.matrix)
    result = reproduce(args.reference, matrix)
    if args.json:
        emit_json(result.as_json())
    elif result.identical:
        step(f"identical: the rebuild is {result.published_id} (base: {result.base})")
    else:
        print_table(result)
    return 0 if result.identical else FINDINGS


def print_table(result: Result) -> None:
    table(["layer", "published", "rebuilt", "size", "", "step"],
          [(str(r.index), r.a[7:19] or "-", r.b[7:19] or "-", human_bytes(r.size),
            "same" if r.same else "DIFFERENT", r.step[:60]) for r in result.layers])
    for r in result.layers:
        if not r.same:
            print(f"\nlayer {r.index} ({r.step[:60]}): first differing paths")
            for path in r.paths:
                print(f"  {path}")
    print(f"\nnot reproduced: the rebuild is {result.rebuilt_id[:19]}, the published image "
          f"{result.published_id[:19]}")
