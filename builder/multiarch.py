"""Multi-platform publishing: each platform's image is vetted and pushed by digest, then one OCI
image index joins them under the variant's tags, so `docker pull TAG` gives each node its own
architecture.

  builder publish              a variant with several platforms (all selected): per platform
                               stage + SBOM/smoke/provenance + `build-<hash>`, then the index
  builder publish --by-digest  the per-platform half only, one record per image in
                               <state>/digests/<key>.json (CI: one job per platform runner)
  builder index                the other half, once every platform passed: the index from those
                               records, then the dated, floating and alias tags, published.json

Tags a user reads point at the index only once every platform's manifest, with its evidence,
is in the vetted repository; a platform missing from the records refuses the whole variant.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from builder import oci, plan, platforms, publish, smoke, state
from builder.errors import ConfigError, GateRefused
from builder.matrix import Matrix, Variant
from builder.matrix_cmd import load_selected
from builder.output import emit_json, step, table

# What each platform's entry in published.json keeps (the rest is the variant's).
PLATFORM_FIELDS = ("digest", "reference", "image_id", "content_hash", "hash_tag", "cuda", "cudnn",
                   "nccl", "min_driver", "sbom", "smoke_report", "provenance", "smoke_gpu",
                   "allow_cpu_smoke")


def declared(matrix: Matrix, variant_id: str) -> list[str]:
    """The platforms the matrix declares for a variant id, in matrix order."""
    return [v.platform for v in matrix.variants if v.id == variant_id]


def is_multi(matrix: Matrix, variant: Variant) -> bool:
    """Published as an index: several platforms, or one that is not linux/amd64."""
    names = declared(matrix, variant.id)
    return len(names) > 1 or names != [platforms.DEFAULT]


def groups(planned: Iterable[plan.PlannedVariant]) -> list[list[plan.PlannedVariant]]:
    by_id: dict[str, list[plan.PlannedVariant]] = {}
    for p in planned:
        by_id.setdefault(p.variant.id, []).append(p)
    return list(by_id.values())


def publication_for(pub: dict[str, Any] | None, platform: str) -> dict[str, Any] | None:
    """A variant's published.json record as seen by one platform: an index record's entry for
    that platform over the variant's fields (a plain record is linux/amd64's)."""
    if pub is None or "platforms" not in pub:
        return pub if platform == platforms.DEFAULT else None
    mine = [p for p in pub["platforms"] if p["platform"] == platform]
    return {**pub, **mine[0]} if mine else None


def digests_dir(folder: Path | None) -> Path:
    return folder if folder is not None else state.path("digests")


# ---- per platform -----------------------------------------------------------------------------


def push_platform(reg: oci.Registry, matrix: Matrix, cand: publish.Candidate) -> dict[str, Any]:
    """Stage one platform's image with its evidence and `build-<hash>` tag (what `plan` reads);
    returns its digest record."""
    p = cand.planned
    subject, refs = publish.stage_and_attach(reg, matrix, cand)
    publish.tag_image(reg, matrix, subject.digest, p.hash_tag)
    rec = publish.publication(matrix, cand, subject.digest, publish.today(), p.floating_tag,
                              [p.hash_tag], refs)
    report = smoke.load_report(cand.image_id) or {}
    return {"id": p.variant.id, "key": p.variant.key, "platform": p.variant.platform,
            "descriptor": subject.as_json(), "floating_tag": p.floating_tag,
            "tags": list(p.tags), "record": rec,
            "smoke_emulated": bool((report.get("runner") or {}).get("emulated"))}


def write_record(folder: Path, record: dict[str, Any]) -> Path:
    path = folder / f"{record['key']}.json"
    state.atomic_write(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return path


def read_records(folder: Path, ids: Iterable[str]) -> dict[str, list[dict[str, Any]]]:
    wanted = set(ids)
    found: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            rec = json.loads(path.read_text())
        except ValueError as exc:
            raise ConfigError(f"{path}: not a digest record: {exc}") from None
        if rec.get("id") in wanted:
            found.setdefault(rec["id"], []).append(rec)
    return found


def _gate_all(matrix: Matrix, group: list[plan.PlannedVariant], allow_cpu_smoke: bool
              ) -> tuple[list[publish.Candidate], list[dict[str, Any]]]:
    """Candidates, and refusals: one refused platform refuses the variant (no partial index)."""
    cands = [publish.gate(matrix, p, allow_cpu_smoke=allow_cpu_smoke) for p in group]
    refused = [c for c in cands if c.reason]
    missing = sorted(set(declared(matrix, group[0].variant.id)) - {p.variant.platform
                                                                  for p in group})
    out = [{"id": c.planned.variant.key, "status": "refused", "reason": c.reason,
            "image_id": c.image_id} for c in refused]
    if missing:
        out.append({"id": group[0].variant.id, "status": "refused", "image_id": "",
                    "reason": f"not selected: {', '.join(missing)}; an index needs every "
                    "platform (or use publish --by-digest per platform, then builder index)"})
    for entry in out:
        step(f"  [{entry['id']}] refused: {entry['reason']}")
    return cands, out


def publish_group(matrix: Matrix, group: list[plan.PlannedVariant], *, allow_cpu_smoke: bool,
                  dry_run: bool, done: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Gate every platform, push each by digest, then the index and its tags."""
    cands, refused = _gate_all(matrix, group, allow_cpu_smoke)
    if refused:
        return refused
    if dry_run:
        return [publish.dry_run_entry(matrix, c) | {"platform": c.planned.variant.platform}
                for c in cands]
    reg = oci.Registry(matrix.registry)
    records = []
    for cand in cands:
        step(f"  [{cand.planned.variant.key}] pushing {cand.image} by digest")
        records.append(push_platform(reg, matrix, cand))
    pub = assemble(reg, matrix, records)
    done[group[0].variant.id] = pub
    return [{"id": group[0].variant.id, "status": "published", **pub}]


def publish_by_digest(matrix: Matrix, planned: list[plan.PlannedVariant], folder: Path | None,
                      *, allow_cpu_smoke: bool, dry_run: bool) -> list[dict[str, Any]]:
    """`builder publish --by-digest`: the per-platform half, one record file per image."""
    reg, out = oci.Registry(matrix.registry), digests_dir(folder)
    results = []
    for p in planned:
        cand = publish.gate(matrix, p, allow_cpu_smoke=allow_cpu_smoke)
        if cand.reason:
            step(f"  [{p.variant.key}] refused: {cand.reason}")
            results.append({"id": p.variant.key, "status": "refused", "reason": cand.reason})
        elif dry_run:
            results.append(publish.dry_run_entry(matrix, cand) | {"id": p.variant.key})
        else:
            record = push_platform(reg, matrix, cand)
            path = write_record(out, record)
            results.append({"id": p.variant.key, "status": "pushed", "tags": [p.hash_tag],
                            "digest": record["descriptor"]["digest"], "record": str(path)})
    return results


# ---- the index --------------------------------------------------------------------------------


def assemble(reg: oci.Registry, matrix: Matrix, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Push the index of one variant's platform records and point its tags at it; returns the
    variant's published.json record (the reference platform's, with the index digest). A
    variant that is linux/amd64 alone keeps its plain manifest under its tags, as before."""
    vid = records[0]["id"]
    tags = {tuple(r["tags"]) for r in records}
    if len(tags) != 1:
        raise ConfigError(f"{vid}: its platforms resolved to different tags "
                          f"({' vs '.join(t[0] for t in sorted(tags))}): one tag cannot name "
                          "them all; give the platforms separate variants")
    manifests = [platforms.PlatformManifest(platforms.get(r["platform"]), oci.Descriptor(
        r["descriptor"]["digest"], r["descriptor"]["mediaType"], r["descriptor"]["size"]))
        for r in records]
    single = [r["platform"] for r in records] == [platforms.DEFAULT]
    desc = manifests[0].descriptor if single else reg.push_index(
        matrix.repository, platforms.index_document(
            manifests, {"org.opencontainers.image.title": f"{matrix.repository}:{vid}"}))
    date = publish.today()
    floating, *aliases = records[0]["tags"]
    dated, held = publish.dated_tag(reg, matrix.repository, floating, date, desc.digest)
    for name in ([] if held else [dated]) + [floating, *aliases]:
        reg.tag(matrix.repository, desc.digest, name)
    ordered = sorted(records, key=lambda r: list(platforms.KNOWN).index(r["platform"]))
    first = ordered[0]["record"]
    hash_tags = [r["record"]["hash_tag"] for r in ordered]
    step(f"  [{vid}] {'manifest' if single else 'index'} {desc.digest[:19]} "
         f"({', '.join(r['platform'] for r in ordered)}) → {dated}, {floating}")
    pub = {**first, "digest": desc.digest, "reference": f"{matrix.image_name}@{desc.digest}",
           "date": f"{date[:4]}-{date[4:6]}-{date[6:]}", "dated_tag": dated,
           "tags": [dated, *hash_tags, floating, *aliases]}
    if not single:
        pub["platforms"] = [{"platform": r["platform"], "smoke_emulated": r["smoke_emulated"],
                             **{k: r["record"][k] for k in PLATFORM_FIELDS}} for r in ordered]
    return pub


def assemble_from_records(matrix: Matrix, variants: list[Variant], folder: Path | None
                          ) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """`builder index`: (publications, refusals) for the selected variant ids."""
    ids = list(dict.fromkeys(v.id for v in variants))
    found = read_records(digests_dir(folder), ids)
    reg = oci.Registry(matrix.registry)
    done: dict[str, dict[str, Any]] = {}
    refused = []
    for vid in ids:
        records = found.get(vid, [])
        missing = sorted(set(declared(matrix, vid)) - {r["platform"] for r in records})
        if missing:
            refused.append({"id": vid, "status": "refused", "reason": "no digest record for "
                            f"{', '.join(missing)} (its build, smoke or push did not pass)"})
            continue
        done[vid] = assemble(reg, matrix, [r for r in records
                                           if r["platform"] in declared(matrix, vid)])
    return done, refused


# ---- CLI --------------------------------------------------------------------------------------


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "index", parents=[common], help="join per-platform images under one tag (image index)",
        description="For each selected variant, read the digest records `builder publish "
        "--by-digest` wrote for its platforms, push an OCI image index of them, point the "
        "dated, floating and alias tags at it and record it in published.json. A variant with "
        "a platform missing from the records is refused (exit 1) and nothing is tagged.")
    p.add_argument("--digests", type=Path, default=None, metavar="DIR",
                   help="digest records (default: <state>/digests)")
    p.add_argument("--manifest", default=Path("published.json"), type=Path, metavar="FILE",
                   help="publication record (default: %(default)s)")
    p.set_defaults(func=cmd_index)


def cmd_index(args: argparse.Namespace) -> int:
    matrix, variants = load_selected(args)
    done, refused = assemble_from_records(matrix, variants, args.digests)
    publish.record(args.manifest, done)
    results = [{"id": vid, "status": "published", **pub} for vid, pub in done.items()] + refused
    if args.json:
        emit_json(results)
    else:
        table(["variant", "status", "index / reason"],
              [(r["id"], r["status"], r.get("reason") or r["digest"]) for r in results])
    if refused:
        raise GateRefused(f"{len(refused)} variant(s) refused", hint="no tag was moved for them")
    return 0

