"""`builder smoke`: its options and output; the work is `builder.stages.smoketest`."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from builder.commands.options import add_command, add_key_option
from builder.core import keypair
from builder.model.smokereport import report_passed
from builder.stages.smoketest import format_table, report_row, run_smoke
from smoke.checks import CHECKS

HELP = f"""\
Run the smoke suite inside IMAGE and store its report for the publish gate.

The container runs with --rm --network none --read-only (tmpfs /tmp), --shm-size=8g and, on a
host with NVIDIA GPUs, --gpus all (or --gpus SPEC). Each check runs in its own process with its
own timeout: {", ".join(CHECKS)}. On a host
without GPUs the GPU checks of a CUDA image are `skip` or `substituted` (a CPU stand-in ran),
never `pass`; --require-gpu turns those into failures, and publishing a CUDA image needs a report
made with --require-gpu.

The report is stored at $BUILDER_STATE/reports/<image-id>.json (default .state/) and, with
--report, also written to FILE. IMAGE may be REGISTRY/REPOSITORY@sha256:DIGEST (a staged
image): it is pulled, and the report is attached to that digest in the registry, where
`builder publish` on any machine finds it. Exit status: 0 when the report passes, 1 when it
does not, 2 when it could not run.
"""


def register(subparsers: Any) -> None:
    p = add_command(subparsers, "smoke", _cmd, ("matrix", "json", "registries"),
                    "run the smoke suite inside an image",
                    description=HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("image", metavar="IMAGE", help="image reference or id")
    p.add_argument("--require-gpu", action="store_true",
                   help="fail GPU checks that did not fully run on a GPU (needed to publish CUDA)")
    p.add_argument("--gpus", metavar="SPEC",
                   help='GPUs for the container: "all", a count, "0,1" or "device=1" '
                   "(default: all when the host has NVIDIA GPUs, none otherwise)")
    add_key_option(p, "the report attached to a staged image (its attestation)")
    p.add_argument("--report", type=Path, metavar="FILE", help="also write the report here")
    p.add_argument("--timeout-scale", type=positive_float, default=1.0, metavar="X",
                   help="multiply every per-check timeout, e.g. 3 on a slow machine "
                   "(default %(default)s)")


def positive_float(text: str) -> float:
    """argparse type: a finite number above zero (a zero or negative scale times every check
    out at once, and its error report would replace the image's stored one)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} must be a number above 0")
    return value


def _cmd(args: argparse.Namespace) -> int:
    from builder.stages import staging

    staged = staging.from_reference(args.image)
    image = staging.pull(staged) if staged else args.image
    report = run_smoke(image, require_gpu=args.require_gpu, gpus=args.gpus,
                       report_path=args.report, timeout_scale=args.timeout_scale)
    staging.record(staged, "smoke", (json.dumps(report, indent=2) + "\n").encode(),
                    keypair.signing_key(args.key) if staged else None)
    passed, reason = report_passed(report, require_gpu=args.require_gpu)
    if args.json:
        print(json.dumps(report, indent=2))
    elif sys.stdout.isatty() and not os.environ.get("NO_COLOR"):
        _print_rich(report, passed, reason)
    else:
        print(format_table(report, passed, reason))
    return 0 if passed else 1


def _print_rich(report: dict[str, Any], passed: bool, reason: str) -> None:
    from rich.console import Console
    from rich.table import Table

    colours = {"pass": "green", "fail": "red", "error": "red", "skip": "yellow",
               "substituted": "yellow", "degraded": "yellow"}
    table = Table(title=f"smoke: {(report.get('image') or {}).get('ref')}")
    for column in ("check", "status", "time", "message"):
        table.add_column(column, justify="right" if column == "time" else "left")
    for check in report["checks"]:
        name, status, time_s, message = report_row(check)
        table.add_row(name, f"[{colours.get(check['status'], 'white')}]{status}[/]", time_s,
                      message, )
    console = Console()
    console.print(table)
    console.print(f"[{'green' if passed else 'red'}]{'PASS' if passed else 'FAIL'}[/]: {reason}")
