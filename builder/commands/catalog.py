"""`builder catalog [REGISTRY/REPOSITORY] --out DIR`: the static site platform teams read."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from builder.commands.options import (
    add_command,
    add_identity_options,
    identities,
    trusted_root,
)
from builder.core import keyless, keypair, state
from builder.core.output import emit_json, step
from builder.model import catalog_doc, matrix, startup
from builder.stages import catalog, catalog_site


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(sub, "catalog", cmd_catalog, ("matrix", "json", "registries"),
                    "write the static catalog site from the registry")
    p.add_argument("source", nargs="?", metavar="REGISTRY/REPOSITORY",
                   help="the vetted repository (default: `registry`/`repository` of --matrix)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="the site folder")
    p.add_argument("--key", action="append", default=[], type=Path, metavar="COSIGN.PUB",
                   help="verify cosign signatures and attestations with this public key "
                   "(repeatable; without it, pages say what is signed, unverified)")
    add_identity_options(p, "the dated tags shown as history (with --key: either)",
                         "none; every keyless signer whose bundle chains to --trusted-root is "
                         "shown either way")
    measured = p.add_mutually_exclusive_group()
    measured.add_argument("--startup", type=Path, metavar="RESULTS.JSON",
                          help="bench results (`python -m bench pull`'s results file) whose "
                          "measured startup working sets the pages show as bytes needed to "
                          f"start (default: {startup.DEFAULT} when present; a missing file: "
                          "not measured)")
    measured.add_argument("--no-startup", action="store_true", dest="no_startup",
                          help="read no bench results: every page says not measured")
    p.add_argument("--cache", type=Path, metavar="FILE",
                   help="the digest cache (default: DIR/.cache/catalog.json)")


def cmd_catalog(args: argparse.Namespace) -> int:
    """Read one vetted repository — its tags, manifests, image indexes, configs and the SBOM,
    smoke report, provenance, audit, rebuild reason and signature attached to each digest — and
    write a static site: index.html (a chooser by driver, GPU, platform, python and flavor; a
    sortable table without JavaScript), one page per floating and dated tag with its changelog
    (SBOM diff between consecutive dated builds), and catalog.json
    (builder/schema/catalog.schema.json). Needs nothing but registry access; a second run
    fetches only digests it has not seen (cache: DIR/.cache/catalog.json)."""
    started = time.monotonic()
    source = catalog.Source.parse(args.source) if args.source else matrix_source(args.matrix)
    try:
        args.out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise state.path_error(args.out, exc, folder=True,
                               hint="pass --out a folder this user can write") from exc
    cache = args.cache or args.out / ".cache" / "catalog.json"
    keys = [keypair.load_public(path) for path in args.key]
    doc, fetched = catalog.collect(source, args.out, cache, keys=keys, progress=step,
                                   trusted_root=trusted_root(args) or keyless.PUBLIC_GOOD_ROOT,
                                   identities=identities(args))
    startup.add(doc["images"], startup.load(startup.results_path(args.startup, args.no_startup)))
    same = catalog_doc.same_facts(doc, args.out / "catalog.json")
    if not same:
        catalog_doc.validate(doc)  # jsonschema's import alone takes seconds: only for new facts
    written = catalog_site.write_site(doc, args.out, same_facts=same)
    summary = {"out": str(args.out), "source": source.name, "tags": len(doc["tags"]),
               "images": len(doc["images"]), "variants": len(doc["variants"]),
               "fetched": fetched, "files_written": written,
               "seconds": round(time.monotonic() - started, 2)}
    if args.json:
        emit_json(summary)
    else:
        step(f"catalog: {summary['tags']} tags, {summary['images']} images, {fetched} digests "
             f"fetched, {written} files written in {summary['seconds']} s → "
             f"{args.out / 'index.html'}")
    return 0


def matrix_source(path: str) -> catalog.Source:
    m = matrix.load(path)
    return catalog.Source(m.registry, m.repository)
