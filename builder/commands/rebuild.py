"""`builder rebuild`: its options and output; the work is `builder.flows.rebuild`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Collection
from dataclasses import asdict, replace
from pathlib import Path

from builder.commands.options import (
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
from builder.core.output import emit_json, human_bytes, table
from builder.flows import audit_check, audit_daily, relock_report
from builder.flows.rebuild import Action, RebuildOptions, plan_actions, rebuild
from builder.flows.rebuild_check import (
    REASONS,
    UNKNOWN,
    Finding,
    check,
    exit_code,
    latest_publications,
    published_variants,
    source_summary,
)
from builder.model.matrix import Matrix, Variant


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "rebuild", cmd_rebuild, ("matrix", "select", "json", "registries",
                    "locks"), "rebuild published images whose sources moved")
    p.add_argument("--check", action="store_true",
                   help="report only; build and publish nothing (each image is audited afresh: "
                   "with --key, a report whose findings changed is attached, signed)")
    add_publishing_options(p, "say what would be rebuilt and why; change, build and push nothing")
    add_keyless_options(p)
    add_ca_bundle_option(p, "CA bundle for every download: the Debian and PyPI checks and "
                         "the builds (see builder build)")
    p.add_argument("--skip-source", action="append", default=[], choices=REASONS,
                   metavar="NAME", dest="skip_source",
                   help="do not ask this source (repeatable; one of: %(choices)s); it is "
                   "reported as skipped, never as clean")
    p.add_argument("--relock-report", type=Path, default=None, metavar="FILE",
                   dest="relock_report",
                   help="write what the relock pull-request job needs: the re-locked lock "
                   "files and the SBOM diff (written even when nothing was re-locked)")


def _selected(args: argparse.Namespace) -> tuple[Matrix, list[Variant]]:
    matrix, variants = load_selected(args)
    return matrix, published_variants(matrix, variants, trusted(args, matrix))


def print_findings(findings: list[Finding], skip: Collection[str] = ()) -> None:
    skipped = [r for r in REASONS if r in skip]
    if skipped:
        print(f"skipped (not asked, so not known to be clean): {', '.join(skipped)}")
    if not findings:
        print("nothing needs rebuilding: every source asked is clean" if skipped
              else "nothing needs rebuilding: every source was asked and is clean")
        return
    table(["variant", "reason", "status", "detail"],
          [(f.variant_id, f.reason, f.status, f.detail) for f in findings])


def trusted(args: argparse.Namespace, matrix: Matrix | None) -> keypair.Vouchers:
    """Who a published image's signature must be made by before it is run: --trust-key and the
    identity options, else the matrix's `trust:` (options.vouchers); no key among them: the
    signing key's own public key (nobody at all: unsigned publications only)."""
    found = vouchers(args, matrix)
    if found.keys or (key := keypair.signing_key(args.key)) is None:
        return found
    return replace(found, keys=(key.public,))


def cmd_rebuild(args: argparse.Namespace) -> int:
    """For each variant the registry records as published (its dated tags and their signed
    evidence; narrow with --select) ask: Debian updates inside the image, Python vulnerabilities
    with a fix (pip-audit on the lock), a moved base digest, changed inputs. --check only
    reports (exit 0 nothing to do, 1 something to rebuild, 2 nothing decided: only sources that
    could not be asked; each image's latest signed audit is reported too, its vulnerabilities
    with a fix one line each); otherwise rebuilds, publishes and prints the SBOM diff of exactly
    those variants. --skip-source leaves a source unasked (reported as skipped, never clean)."""
    ignore_old_record(args.manifest)
    matrix, variants = _selected(args)
    skip = sorted(set(getattr(args, "skip_source", None) or ()))
    if not variants:
        return nothing_checked(args, skip)
    vouched = trusted(args, matrix)
    findings = check(matrix, variants, locks_dir=args.locks, skip=skip, vouchers=vouched)
    unknown = warn_unknown(findings)
    summary = {"checked": sorted({v.id for v in variants}),
               "sources": source_summary(findings, skip), "skipped": skip, "unknown": unknown}
    if args.check:
        audits = daily_audits(args, matrix, variants, vouched)
        if args.json:
            emit_json({"findings": [f.as_json() for f in findings], **summary,
                       "audits": [a.as_json() for a in audits], "exit_code": exit_code(findings)})
        else:
            print_findings(findings, skip)
            for line in audit_check.lines(audits):
                print(line)
        return exit_code(findings)
    publishes = not args.dry_run and bool(plan_actions(findings))
    trust = (keypair.trust(args.key, vouchers(args, matrix), args.unsigned, keyless_signer(args))
             if publishes else keypair.UNSIGNED)
    actions = rebuild(RebuildOptions(
        matrix=matrix, variants=variants, manifest=args.manifest, locks_dir=args.locks,
        allow_cpu_smoke=args.allow_cpu_smoke, dry_run=args.dry_run, findings=findings,
        trust=trust))
    if args.relock_report is not None:
        relock_report.write(args.relock_report, actions, variants, args.locks)
    if args.json:
        emit_json({"findings": [f.as_json() for f in findings], **summary,
                   "actions": [asdict(a) for a in actions]})
    else:
        print_findings(findings, skip)
        if not actions:
            print("nothing rebuilt, nothing pushed")
        else:
            table(["variant", "reasons", "state", "node download", "detail"],
                  [(a.variant_id, ", ".join(a.reasons), a.state, download_text(a), a.message)
                   for a in actions])
            print_changelogs(actions)
    for a in actions:  # a failure's hint, as every error gives one (stderr)
        if a.state == "failed" and a.hint:
            print(f"hint: [{a.variant_id}] {a.hint}", file=sys.stderr)
    if any(a.state == "failed" for a in actions):
        return 1
    # What it did decides: a publication succeeded (unknown sources were warned about above);
    # 2 only when nothing was done because the sources that answered asked for nothing.
    return 2 if unknown and not actions else 0


def daily_audits(args: argparse.Namespace, matrix: Matrix, variants: list[Variant],
                 vouched: keypair.Vouchers) -> list[audit_check.Audit]:
    """Each image audited afresh (builder.flows.audit_daily): a CVE published since is in the
    daily output; with the signing key or an identity token (not --dry-run), a report whose
    findings changed is attached, signed. Without either, one line (stderr) says so."""
    signer = keypair.UNSIGNED if args.dry_run else keypair.Trust(
        key=keypair.signing_key(args.key), keyless=keyless_signer(args))
    audits = audit_check.audits(latest_publications(matrix, vouched), variants, vouched,
                                audit_daily.refresher(signer))
    if not signer.signs and any(a.refresh == audit_daily.NOT_ATTACHED for a in audits):
        print(audit_daily.NO_KEY_LINE, file=sys.stderr)
    return audits


def warn_unknown(findings: list[Finding]) -> list[dict[str, str]]:
    """The sources that could not be asked, each as one warning line (stderr); listed in the
    JSON too. They never block what the other sources decided."""
    unknown = [{"variant_id": f.variant_id, "source": f.reason, "detail": f.detail}
               for f in findings if f.status == UNKNOWN]
    for u in unknown:
        print(f"warning: {u['variant_id']}: source {u['source']} could not be asked: "
              f"{u['detail'][:300]}", file=sys.stderr)
    return unknown


def nothing_checked(args: argparse.Namespace, skip: list[str]) -> int:
    """No selected variant has a publication: no source was asked, so none is called clean."""
    why = (f"nothing checked: the registry records no publication of the selected variants"
           f"{' (' + ' '.join(args.select) + ')' if args.select else ''}")
    if args.json:
        emit_json({"findings": [], "sources": dict.fromkeys(REASONS, "not-asked"),
                   "skipped": skip, "checked": 0, "message": why, "exit_code": 0})
    else:
        print(why)
    return 0


def download_text(a: Action) -> str:
    """`12.3 MB of 1.2 GB (1.0%)`: new blob bytes a node holding the previous digest pulls."""
    if a.delta_bytes is None or not a.image_bytes:
        return "-"
    return (f"{human_bytes(a.delta_bytes)} of {human_bytes(a.image_bytes)} "
            f"({100 * a.delta_bytes / a.image_bytes:.1f}%)")


def print_changelogs(actions: list[Action]) -> None:
    from sbom.diff import format_diff

    for a in actions:
        if a.state != "published":
            continue
        print(f"\nchanges in {a.variant_id}: {a.old_publication or '(no earlier publication)'}"
              f" → {a.new_publication}")
        print(format_diff(a.changelog) if a.changelog else "  (old SBOM not available: no diff)")

