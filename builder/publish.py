"""`builder publish`: push gated images with immutable dated tags; record them in published.json.

Per variant, in this order (each step idempotent; what users and `builder plan` read comes last):
  gate     the local image matches the plan's content hash, its smoke report passed (CUDA: on a
           GPU unless --allow-cpu-smoke, which is recorded) and its SBOM validates
  stage    `docker push` to `<repository>-staging`, then copy into the vetted repository by digest
  attach   SBOM, smoke report and SLSA provenance as OCI artifacts whose subject is that
           digest (also tagged `sha256-<hex>.sbom` / `.smoke` / `.provenance`)
  tag      `<floating>-YYYYMMDD` (UTC; `.1`, `.2`… when taken by another digest, never
           overwritten), the content tag `build-<hash20>`, the floating tag, then the aliases
A run stopped at any step leaves no tag on an image without its evidence; run it again to
complete it. Credentials: docker's own config for `docker push`; REGISTRY_USERNAME/PASSWORD
for the registry API.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder import engine, labels, oci, plan, provenance, smoke, state
from builder.errors import BuilderError, CommandFailed, GateRefused
from builder.matrix import Matrix
from builder.matrix_cmd import known_base_digests, load_selected
from builder.oci import RegistryError
from builder.output import emit_json, step, table

SCHEMA_PATH = Path(__file__).resolve().parent / "schema" / "published.schema.json"
SCHEMA_VERSION = 1
SBOM_TYPE = "application/vnd.cyclonedx+json"
SMOKE_TYPE = "application/vnd.torch-images.smoke-report+json"
PUSH_DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64}) size:")
MAX_SUFFIX = 99


@dataclass
class Candidate:
    """One variant after the gate: what to push, or why not."""

    planned: plan.PlannedVariant
    image: str
    image_id: str = ""
    reason: str = ""  # non-empty: refused
    smoke_path: Path | None = None
    sbom_path: Path | None = None
    smoke_gpu: bool = False
    allow_cpu_smoke: bool = False


# ---- the gate ---------------------------------------------------------------------------------


def sbom_file(image_id: str) -> Path:
    """Where `builder build` stores an image's SBOM."""
    return state.sbom_path(image_id)


def gate(matrix: Matrix, p: plan.PlannedVariant, *, allow_cpu_smoke: bool) -> Candidate:
    image = f"{matrix.image_name}:{p.local_tag}"
    cand = Candidate(p, image)
    info = engine.inspect_image(image)
    if info is None:
        cand.reason = f"no local image `{image}`: build it first (builder build)"
        return cand
    cand.image_id = info["Id"]
    have = (info["Config"].get("Labels") or {}).get(labels.CONTENT_HASH, "")
    if have != p.content_hash:
        cand.reason = (f"stale image: its content hash {have[:12] or '(none)'} is not the plan's "
                       f"{p.content_hash[:12]}; rebuild it (builder build)")
        return cand
    cand.reason = _smoke_gate(cand, allow_cpu_smoke) or _sbom_gate(cand)
    return cand


def _smoke_gate(cand: Candidate, allow_cpu_smoke: bool) -> str:
    is_cuda = cand.planned.variant.accelerator == "cuda"
    report = smoke.load_report(cand.image_id)
    passed, why = smoke.report_passed(report, require_gpu=is_cuda and not allow_cpu_smoke)
    if not passed:
        return why
    assert report is not None
    accel = (report.get("facts") or {}).get("accelerator")
    if accel != cand.planned.variant.accelerator:
        want = cand.planned.variant.accelerator
        return f"the smoke report checked a `{accel}` image, not a `{want}` one"
    cand.smoke_path = smoke.report_file(cand.image_id)
    gpu_passed = all(c["status"] == "pass" for c in report["checks"]
                     if c["name"] in smoke.GPU_CHECKS)
    cand.smoke_gpu = is_cuda and bool(report.get("require_gpu")) and gpu_passed
    cand.allow_cpu_smoke = is_cuda and not cand.smoke_gpu  # the waiver was needed, and used
    return ""


def _sbom_gate(cand: Candidate) -> str:
    import sbom

    path = sbom_file(cand.image_id)
    if not path.is_file():
        return f"no SBOM for this image ({path}): run `builder build` or `builder sbom IMAGE -o …`"
    try:
        sbom.validate(json.loads(path.read_text()))
    except ValueError as exc:
        return f"the SBOM {path} is not JSON: {exc}"
    except sbom.SbomInvalid as exc:
        return f"the SBOM {path} is not valid CycloneDX 1.6" + (f": {exc.hint[:200]}"
                                                                 if exc.hint else "")
    cand.sbom_path = path
    return ""


# ---- the registry -----------------------------------------------------------------------------


def staging_repository(matrix: Matrix) -> str:
    """Where images wait, by digest, until their artifacts are attached and they are tagged."""
    return f"{matrix.repository}-staging"


def docker_push(matrix: Matrix, ref: str) -> str:
    """`docker push ref` (retried); returns the digest it reports."""
    result = oci.retry(f"pushing `{ref}`", matrix.registry,
                       lambda: engine.docker("push", ref, timeout=3600), (CommandFailed,))
    found = PUSH_DIGEST.findall(result.stdout)
    if not found:
        raise RegistryError(f"`docker push {ref}` reported no digest", hint=result.stdout[-500:])
    return found[-1]


def stage(matrix: Matrix, reg: oci.Registry, cand: Candidate) -> oci.Descriptor:
    """Push the image to the staging repository, then copy it into the vetted one by digest:
    the vetted repository holds it, but no tag anyone reads points at it yet."""
    ref = f"{matrix.registry}/{staging_repository(matrix)}:{cand.planned.hash_tag}"
    engine.docker("tag", cand.image_id, ref)
    try:
        digest = docker_push(matrix, ref)
    finally:
        engine.docker("image", "rm", ref, check=False)
    return reg.copy(staging_repository(matrix), matrix.repository, digest)


def dated_tag(reg: oci.Registry, repository: str, floating: str, date: str,
              digest: str) -> tuple[str, bool]:
    """The first free `<floating>-<date>[.n]`, or the one already holding `digest`.

    Returns (tag, whether it already holds the digest). A tag holding another digest is never
    overwritten.
    """
    for n in range(MAX_SUFFIX + 1):
        tag = f"{floating}-{date}" + (f".{n}" if n else "")
        desc = reg.head(repository, tag)
        if desc is None:
            return tag, False
        if desc.digest == digest:
            return tag, True
    raise RegistryError(f"`{floating}-{date}` has {MAX_SUFFIX} suffixes taken today")


def tag_image(reg: oci.Registry, matrix: Matrix, digest: str, tag: str) -> None:
    reg.tag(matrix.repository, digest, tag)


def attach(reg: oci.Registry, matrix: Matrix, subject: oci.Descriptor, kind: str, path: Path,
           media_type: str) -> dict[str, str]:
    """Push `path` as an artifact whose subject is the image (tag `sha256-<hex>.<kind>`)."""
    return attach_bytes(reg, matrix, subject, kind, path.read_bytes(), path.name, media_type)


def attach_provenance(reg: oci.Registry, matrix: Matrix, subject: oci.Descriptor,
                      cand: Candidate) -> dict[str, str]:
    """The SLSA provenance statement, from the image's labels, attached like the others."""
    info = engine.inspect_image(cand.image_id) or {}
    doc = provenance.statement(matrix.image_name, subject.digest,
                               (info.get("Config") or {}).get("Labels") or {})
    data = (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
    return attach_bytes(reg, matrix, subject, "provenance", data, "provenance.intoto.json",
                        provenance.MEDIA_TYPE)


def attach_bytes(reg: oci.Registry, matrix: Matrix, subject: oci.Descriptor, kind: str,
                 data: bytes, title: str, media_type: str) -> dict[str, str]:
    desc = reg.push_artifact(matrix.repository, subject, media_type, data, kind=kind,
                             title=title)
    return {"tag": oci.artifact_tag(subject.digest, kind), "digest": desc.digest,
            "media_type": media_type, "reference": f"{matrix.image_name}@{desc.digest}"}


# ---- one variant ------------------------------------------------------------------------------


def today() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%d")


def dry_run_entry(matrix: Matrix, cand: Candidate) -> dict[str, Any]:
    p = cand.planned
    return {"id": p.variant.id, "status": "would-publish", "image_id": cand.image_id,
            "tags": [f"{p.floating_tag}-{today()}[.n]", p.hash_tag, *p.tags],
            "artifacts": ["sha256-<digest>.sbom", "sha256-<digest>.smoke"],
            "registry": matrix.registry, "repository": matrix.repository}


def publish_one(matrix: Matrix, cand: Candidate) -> dict[str, Any]:
    """Publish one gated image; returns its publication record (see the published.json schema).

    Every step is idempotent, and what users and `builder plan` read comes last: a run that
    stops anywhere leaves no tag on an image without its evidence, and the next run completes.
    """
    p = cand.planned
    date = today()
    reg = oci.Registry(matrix.registry)
    subject, refs = stage_and_attach(reg, matrix, cand)
    digest = subject.digest
    tag, held = dated_tag(reg, matrix.repository, p.floating_tag, date, digest)
    for name in ([] if held else [tag]) + [p.hash_tag, *p.tags]:
        tag_image(reg, matrix, digest, name)  # dated, content (`plan` reads it), then moving
    return publication(matrix, cand, digest, date, tag, [tag, p.hash_tag, *p.tags], refs)


def stage_and_attach(reg: oci.Registry, matrix: Matrix,
                     cand: Candidate) -> tuple[oci.Descriptor, dict[str, dict[str, str]]]:
    """The image in the vetted repository by digest, with SBOM, smoke report and provenance
    attached; no tag a user reads points at it yet."""
    subject = stage(matrix, reg, cand)
    assert cand.sbom_path is not None and cand.smoke_path is not None
    refs = {"sbom": attach(reg, matrix, subject, "sbom", cand.sbom_path, SBOM_TYPE),
            "smoke_report": attach(reg, matrix, subject, "smoke", cand.smoke_path, SMOKE_TYPE),
            "provenance": attach_provenance(reg, matrix, subject, cand)}
    return subject, refs


def publication(matrix: Matrix, cand: Candidate, digest: str, date: str, dated: str,
                tags: list[str], refs: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The published.json record of one image (see its schema)."""
    p = cand.planned
    facts = p.rendered.facts
    return {
        "date": f"{date[:4]}-{date[4:6]}-{date[6:]}",
        "published_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "registry": matrix.registry, "repository": matrix.repository,
        "digest": digest, "reference": f"{matrix.image_name}@{digest}",
        "image_id": cand.image_id, "content_hash": p.content_hash,
        "tags": tags, "dated_tag": dated, "hash_tag": p.hash_tag,
        "floating_tag": p.floating_tag, "aliases": list(p.tags[1:]),
        "torch": facts.get("torch"), "python": facts.get("python") or p.variant.python,
        "accelerator": p.variant.accelerator, "cuda": facts.get("cuda"),
        "cudnn": facts.get("cudnn"), "nccl": facts.get("nccl"),
        "min_driver": facts.get("min_driver"), "flavor": p.variant.flavor,
        **refs, "smoke_gpu": cand.smoke_gpu, "allow_cpu_smoke": cand.allow_cpu_smoke,
    }


# ---- published.json ---------------------------------------------------------------------------


def load_manifest(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {"schema_version": SCHEMA_VERSION, "variants": {}}
    try:
        doc = json.loads(path.read_text())
    except ValueError as exc:
        raise BuilderError(f"{path} is not JSON: {exc}", hint="restore it from git") from None
    _validate(doc, path)
    return doc


def _validate(doc: dict[str, Any], path: Path) -> None:
    schema = json.loads(SCHEMA_PATH.read_text())
    import jsonschema  # slow import; only when validating

    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(doc), key=str)
    if errors:
        where = "/".join(str(x) for x in errors[0].absolute_path)
        raise BuilderError(f"{path}: {where}: {errors[0].message}",
                           hint=f"schema: {SCHEMA_PATH}")


def record(path: Path, publications: dict[str, dict[str, Any]]) -> None:
    """Append publications to each variant's history (a repeat of the last one is not added)."""
    if not publications:
        return
    doc = load_manifest(path)
    for vid, pub in publications.items():
        history = doc["variants"].setdefault(vid, {"publications": []})["publications"]
        last = history[-1] if history else {}
        if (last.get("digest"), last.get("dated_tag"), last.get("registry")) != (
                pub["digest"], pub["dated_tag"], pub["registry"]):
            history.append(pub)
    doc["variants"] = dict(sorted(doc["variants"].items()))
    _validate(doc, path)
    state.atomic_write(path, json.dumps(doc, indent=2) + "\n")


# ---- all selected variants --------------------------------------------------------------------


def publish_variants(matrix: Matrix, planned: list[plan.PlannedVariant], *,
                     allow_cpu_smoke: bool, dry_run: bool = False,
                     manifest: Path = Path("published.json")) -> list[dict[str, Any]]:
    """Gate and publish each variant. Returns one result per variant (`status`: published,
    refused, would-publish). Records what was published even when a later variant fails.
    A variant with several platforms is published as one image index (builder.multiarch)."""
    from builder import multiarch

    engine.ensure_engine()
    results: list[dict[str, Any]] = []
    done: dict[str, dict[str, Any]] = {}
    try:
        single = [p for p in planned if not multiarch.is_multi(matrix, p.variant)]
        for group in multiarch.groups([p for p in planned if p not in single]):
            results += multiarch.publish_group(matrix, group, allow_cpu_smoke=allow_cpu_smoke,
                                               dry_run=dry_run, done=done)
        for p in single:
            cand = gate(matrix, p, allow_cpu_smoke=allow_cpu_smoke)
            if cand.reason:
                step(f"  [{p.variant.id}] refused: {cand.reason}")
                results.append({"id": p.variant.id, "status": "refused", "reason": cand.reason,
                                "image_id": cand.image_id})
            elif dry_run:
                results.append(dry_run_entry(matrix, cand))
            else:
                step(f"  [{p.variant.id}] publishing {cand.image}")
                try:
                    pub = publish_one(matrix, cand)
                except RegistryError as exc:
                    exc.hint = ((exc.hint or "") + "\n\nno tag points at an image without its "
                                "SBOM and smoke report; run `builder publish` again to finish")
                    raise
                done[p.variant.id] = pub
                results.append({"id": p.variant.id, "status": "published", **pub})
    finally:
        record(manifest, done)
    return results


# ---- CLI --------------------------------------------------------------------------------------


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "publish", parents=[common], help="push gated images with dated tags; write published.json",
        description="Publish each selected variant (default: the matrix's default selection) "
        "whose local image matches the plan, passed smoke (CUDA: on a GPU) and has a valid SBOM. "
        "Pushes `<tag>-YYYYMMDD` (never overwritten) and `build-<hash>`, verifies the digest, "
        "attaches SBOM + smoke report as OCI artifacts, then moves the floating tag and aliases. "
        "Exit 1 when any image was refused.")
    p.add_argument("--locks", default="locks", type=Path)
    p.add_argument("--allow-cpu-smoke", action="store_true",
                   help="publish CUDA images whose smoke ran without a GPU (recorded)")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be pushed; push nothing")
    p.add_argument("--manifest", default=Path("published.json"), type=Path, metavar="FILE",
                   help="publication record (default: %(default)s)")
    p.add_argument("--by-digest", action="store_true",
                   help="per platform image: push, attach evidence and tag build-<hash> only, "
                   "and write a digest record to --digests; `builder index` then joins the "
                   "platforms under the tags (CI: one job per platform runner)")
    p.add_argument("--digests", type=Path, default=None, metavar="DIR",
                   help="digest records (default: <state>/digests)")
    p.set_defaults(func=cmd_publish)


def cmd_publish(args: argparse.Namespace) -> int:
    if not args.select:
        args.select = ["default=true"]
    matrix, variants = load_selected(args)
    planned = plan.make_plan(matrix, variants, args.locks, known_base_digests(variants, matrix),
                             check_registry=False)
    if args.by_digest:
        from builder import multiarch

        results = multiarch.publish_by_digest(matrix, planned, args.digests,
                                              allow_cpu_smoke=args.allow_cpu_smoke,
                                              dry_run=args.dry_run)
    else:
        results = publish_variants(matrix, planned, allow_cpu_smoke=args.allow_cpu_smoke,
                                   dry_run=args.dry_run, manifest=args.manifest)
    if args.json:
        emit_json(results)
    else:
        table(["variant", "status", "tags / reason"],
              [(r["id"], r["status"], r.get("reason") or ", ".join(r.get("tags", [])))
               for r in results])
    refused = [r["id"] for r in results if r["status"] == "refused"]
    if refused:
        raise GateRefused(f"{len(refused)} of {len(results)} images refused: {', '.join(refused)}",
                          hint="nothing of them was pushed; see the reasons above")
    return 0
