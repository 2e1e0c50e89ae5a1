"""`builder sbom` and `builder audit`: CycloneDX SBOMs of built images, diffs, vulnerabilities.

    builder sbom IMAGE -o FILE [--format json|xml] [--reproducible]
    builder sbom diff OLD NEW [--json]          (OLD/NEW: SBOM files)
    builder audit IMAGE|SBOM [--json] [--write-into SBOM]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from builder.commands.options import add_command, add_key_option
from builder.core import keypair, limits, state
from builder.core.errors import COULD_NOT_RUN, BuilderError, UsageError

SBOM_FILE_HINT = "pass a CycloneDX JSON file, as `builder sbom IMAGE -o FILE` writes it"
REATTACH_HINT = "attach a new one: builder sbom REGISTRY/REPOSITORY@sha256:DIGEST"
OUTPUT_HINT = "pass -o a file path in a folder this user can write, or - for stdout"

SBOM_USAGE = """%(prog)s IMAGE [-o FILE] [--format {json,xml}] [--key FILE] [--reproducible]
                    [--insecure-registry HOST[:PORT]|CIDR] [--json]
       %(prog)s diff OLD NEW [--json]"""


def register(subparsers: Any) -> None:
    p = add_command(subparsers, "sbom", run_sbom, ("matrix", "json", "registries"),
                    "write an image's CycloneDX 1.6 SBOM, or diff two SBOMs", usage=SBOM_USAGE)
    p.add_argument("target", nargs="+", metavar="IMAGE",
                   help="an image (id, tag or REGISTRY/REPOSITORY@sha256:DIGEST), or `diff` and "
                   "two SBOM files")
    p.add_argument("-o", "--output", metavar="FILE", help="SBOM file (default: stdout)")
    p.add_argument("--format", choices=("json", "xml"), default="json")
    add_key_option(p, "the SBOM attached to a staged image (its attestation)")
    p.add_argument("--reproducible", action="store_true",
                   help="serial number from the image id, timestamp from its created label "
                   "(also on when SOURCE_DATE_EPOCH is set)")

    a = add_command(subparsers, "audit", run_audit, ("matrix", "json", "registries"),
                    "known vulnerabilities of an image or SBOM")
    a.add_argument("target", metavar="IMAGE|SBOM")
    a.add_argument("--write-into", metavar="SBOM", type=Path,
                   help="add the findings to this SBOM's `vulnerabilities` (re-validated)")
    a.add_argument("--debian-security-suite", default="bookworm-security", metavar="SUITE")
    a.add_argument("--debian-mirror", default=None, metavar="URL",
                   help="debian-security mirror (default: $BUILDER_DEBIAN_SECURITY_MIRROR, else "
                   "http://deb.debian.org/debian-security)")
    a.add_argument("--attach", action="store_true",
                   help="IMAGE is REGISTRY/REPOSITORY@sha256:DIGEST: audit the SBOM attached to "
                   "that digest and attach the report to it (`sha256-<hex>.audit`, what "
                   "`builder catalog` shows as the latest audit)")


def run_sbom(args: argparse.Namespace) -> int:
    """Read the image's filesystem (dpkg, Python dist-info, bundled native libraries) into a
    validated CycloneDX 1.6 SBOM. `builder sbom diff OLD NEW` compares two SBOM files. IMAGE
    may be REGISTRY/REPOSITORY@sha256:DIGEST (a staged image): it is pulled, and the SBOM is
    attached to that digest in the registry for `builder publish`."""
    if args.target[0] == "diff":
        return _run_diff(args)
    if len(args.target) != 1:
        raise UsageError("`builder sbom` takes one image", hint="or: builder sbom diff OLD NEW")
    import sbom
    from builder.stages import staging

    start = time.monotonic()
    to_file = args.output not in (None, "-")
    if to_file:
        check_writable(Path(args.output))  # before the slow part, not after it
    staged = staging.from_reference(args.target[0])
    image = staging.pull(staged) if staged else args.target[0]
    doc = sbom.generate(image, reproducible=args.reproducible)
    staging.record(staged, "sbom", (json.dumps(doc, indent=2) + "\n").encode(),
                    keypair.signing_key(args.key) if staged else None)
    if not to_file:
        from sbom.validate import render

        sys.stdout.write(render(doc, args.format))
    else:
        try:
            sbom.write(doc, Path(args.output), args.format)
        except OSError as exc:
            raise state.path_error(Path(args.output), exc) from exc
    from sbom.diff import component_total

    count = component_total(doc)
    print(f"sbom: {args.target[0]} → {args.output or 'stdout'} ({count} components, "
          f"{time.monotonic() - start:.1f} s)", file=sys.stderr)
    return 0


def check_writable(target: Path) -> None:
    """Fail now, with a message, when `target` cannot be written (a folder, an unwritable or
    missing parent that cannot be made)."""
    if target.is_dir():
        raise BuilderError(f"cannot write {target}: it is a folder", hint=OUTPUT_HINT)
    parent = next((p for p in target.parents if p.exists()), Path("."))
    if not parent.is_dir():
        raise BuilderError(f"cannot write {target}: {parent} is a file, not a folder",
                           hint=OUTPUT_HINT)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise BuilderError(f"cannot write {target}: {parent} is not writable", hint=OUTPUT_HINT)


def _run_diff(args: argparse.Namespace) -> int:
    from sbom.diff import diff_sboms, format_diff

    if len(args.target) != 3:
        raise UsageError("`builder sbom diff` takes two SBOM files",
                         hint="builder sbom diff OLD NEW")
    result = diff_sboms(_load(Path(args.target[1])), _load(Path(args.target[2])))
    print(json.dumps(result, indent=2) if args.json else format_diff(result))
    return 0


def _load(path: Path) -> dict[str, Any]:
    """A CycloneDX JSON document from `path`, or an error naming the file and the problem."""
    try:
        doc = limits.parse_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BuilderError(f"no SBOM file `{path}`", hint=SBOM_FILE_HINT) from None
    except IsADirectoryError:
        raise BuilderError(f"`{path}` is a folder, not an SBOM file", hint=SBOM_FILE_HINT) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BuilderError(f"cannot read `{path}`: {exc}", hint=SBOM_FILE_HINT) from exc
    except ValueError as exc:  # invalid, or nested too deep
        raise BuilderError(f"`{path}` is not JSON: {exc}", hint=SBOM_FILE_HINT) from exc
    if not isinstance(doc, dict) or doc.get("bomFormat") != "CycloneDX":
        raise BuilderError(f"`{path}` is not a CycloneDX document (no \"bomFormat\": "
                           "\"CycloneDX\" at its top)", hint=SBOM_FILE_HINT)
    return doc


def run_audit(args: argparse.Namespace) -> int:
    """Check Python packages with pip-audit and Debian packages against the security suite.
    Exit 0: all sources answered, nothing found; 1: vulnerabilities; 2: a source was
    unreachable or failed (its packages are unknown, not clean)."""
    import sbom
    from sbom.audit import add_to_sbom

    staged = attached_to(args.target) if args.attach else None
    target = Path(args.target)
    # A path-like target is a file to read: never look such a name up in the engine.
    doc = _load(target) if not staged and (target.suffix == ".json" or target.exists()) else None
    if staged:
        doc = attached_sbom(staged)
    doc = doc if doc is not None else sbom.generate(args.target)
    from builder.flows import vuln_audit

    mirror = {"debian_mirror": args.debian_mirror} if args.debian_mirror else {}
    report = vuln_audit.report(doc, debian_security_suite=args.debian_security_suite, **mirror)
    if staged:
        vuln_audit.attach(staged, report)
    if args.write_into:
        base = _load(args.write_into) if args.write_into.exists() else doc
        sbom.write(add_to_sbom(base, report), args.write_into)
    print(json.dumps(report, indent=2) if args.json else format_audit(report))
    if report["vulnerabilities"]:
        return 1
    return 0 if report["ok"] else COULD_NOT_RUN


def attached_to(text: str) -> Any:
    """The image `REGISTRY/REPOSITORY@sha256:…` whose attached SBOM `--attach` audits."""
    from builder.stages import staging

    staged = staging.from_reference(text)
    if staged is None:
        raise BuilderError(f"--attach needs REGISTRY/REPOSITORY@sha256:DIGEST, not `{text}`",
                           hint="a platform manifest's digest (the catalog page lists them)")
    return staged


def attached_sbom(staged: Any) -> dict[str, Any]:
    from builder.core import oci

    data = oci.Registry(staged.registry).fetch_artifact(staged.repository, staged.digest, "sbom")
    if data is None:
        raise BuilderError(f"`{staged.reference}` has no SBOM attached",
                           hint="builder sbom REF@DIGEST attaches one (publish does it too)")
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise BuilderError(f"the SBOM attached to `{staged.reference}` is not JSON",
                           hint=REATTACH_HINT) from exc
    if not isinstance(doc, dict):
        raise BuilderError(f"the SBOM attached to `{staged.reference}` is not a JSON object",
                           hint=REATTACH_HINT)
    return doc


def format_audit(report: dict[str, Any]) -> str:
    lines = []
    for name, status in sorted(report["sources"].items()):
        detail = f" ({status['detail']})" if status.get("detail") else ""
        lines.append(f"{name}: {status['status']}, {status['checked']} checked{detail}")
    for v in report["vulnerabilities"]:
        fix = f" → fixed in {', '.join(v['fix_versions'])}" if v.get("fix_versions") else ""
        lines.append(f"  ! {v['name']} {v['version']}: {v['id']}{fix}")
    lines.append(f"{len(report['vulnerabilities'])} vulnerabilities, "
                 f"{len(report['unknown'])} components unknown")
    return "\n".join(lines)
