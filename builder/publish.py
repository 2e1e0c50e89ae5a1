"""`builder publish`: push gated images with immutable dated tags; record them in published.json.

Per variant, in this order (a failure stops before any floating tag moves):
  gate     the local image matches the plan's content hash, its smoke report passed (CUDA: on a
           GPU unless --allow-cpu-smoke, which is recorded) and its SBOM validates
  push     `<floating>-YYYYMMDD` (UTC; `.1`, `.2`… when taken by another digest, never
           overwritten), then the content tag `build-<hash20>`
  verify   the registry's manifest digest of the dated tag equals the digest `docker push` reported
  attach   SBOM and smoke report as OCI artifacts tagged `sha256-<hex>.sbom` / `.smoke`
  move     the floating tag, then the matrix aliases
Credentials stay with docker (its config) and oras (that config, or REGISTRY_USERNAME/PASSWORD).
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from builder import engine, labels, plan, smoke, state
from builder.errors import BuilderError, CommandFailed, GateRefused
from builder.matrix import Matrix
from builder.matrix_cmd import known_base_digests, load_selected
from builder.output import emit_json, step, table
from builder.registry import RegistryError

SCHEMA_PATH = Path(__file__).resolve().parent / "schema" / "published.schema.json"
SCHEMA_VERSION = 1
SBOM_TYPE = "application/vnd.cyclonedx+json"
SMOKE_TYPE = "application/vnd.torch-images.smoke-report+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
BACKOFF_S: tuple[float, ...] = (1, 2, 4)  # 4 tries in all
PUSH_DIGEST = re.compile(r"digest: (sha256:[0-9a-f]{64}) size:")
MAX_SUFFIX = 99

T = TypeVar("T")


@dataclass(frozen=True)
class Descriptor:
    digest: str
    media_type: str
    size: int


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
    image = f"{matrix.image_name}:{p.floating_tag}"
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


def retry(what: str, registry: str, fn: Callable[[], T]) -> T:
    """`fn()` with bounded backoff; the last failure becomes a RegistryError naming the registry."""
    last: Exception | None = None
    for delay in (*BACKOFF_S, None):
        try:
            return fn()
        except (CommandFailed, OSError, urllib.error.URLError, _RequestError) as exc:
            last = exc
            if delay is not None:
                time.sleep(delay)
    hint = getattr(last, "hint", None) or str(last)
    raise RegistryError(f"{what}: registry `{registry}` failed after {len(BACKOFF_S) + 1} tries",
                        hint=f"{hint}\n\nno floating tag was moved; run `builder publish` again")


class _RequestError(Exception):
    """A registry HTTP answer that should be retried (5xx, bad gateway…)."""


def head_manifest(registry: str, repository: str, ref: str) -> Descriptor | None:
    """The registry's descriptor of `ref` (tag or digest); None when it has no such manifest."""
    url = f"{plan.registry_url(registry)}/v2/{repository}/manifests/{ref}"
    request = urllib.request.Request(url, method="HEAD",
                                     headers={"Accept": ", ".join(plan.MANIFEST_TYPES)})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return Descriptor(response.headers["Docker-Content-Digest"],
                              response.headers["Content-Type"].split(";")[0],
                              int(response.headers["Content-Length"]))
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        if exc.code == 401:
            raise BuilderError(f"registry `{registry}` wants credentials to read manifests",
                               hint="log in with `docker login`") from None
        raise _RequestError(f"HEAD {url}: HTTP {exc.code}") from None


def remote(registry: str, repository: str, ref: str) -> Descriptor | None:
    return retry(f"reading `{repository}:{ref}`", registry,
                 lambda: head_manifest(registry, repository, ref))


def docker_push(registry: str, ref: str) -> str:
    """`docker push ref` (retried); returns the digest it reports."""
    result = retry(f"pushing `{ref}`", registry, lambda: engine.docker("push", ref, timeout=3600))
    found = PUSH_DIGEST.findall(result.stdout)
    if not found:
        raise RegistryError(f"`docker push {ref}` reported no digest", hint=result.stdout[-500:])
    return found[-1]


def push_tag(matrix: Matrix, image_id: str, tag: str, expect: str | None) -> str:
    """Tag the image as `tag`, push it and check the registry now holds `expect` there."""
    ref = f"{matrix.image_name}:{tag}"
    engine.docker("tag", image_id, ref)
    digest = docker_push(matrix.registry, ref)
    if expect is not None and digest != expect:
        raise RegistryError(f"`{ref}` was pushed as {digest}, expected {expect}")
    return digest


def verify(matrix: Matrix, tag: str, digest: str) -> Descriptor:
    desc = remote(matrix.registry, matrix.repository, tag)
    if desc is None or desc.digest != digest:
        found = desc.digest if desc else "nothing"
        raise RegistryError(f"registry `{matrix.registry}` has {found} at `{tag}`, but "
                            f"`docker push` reported {digest}")
    return desc


def local_digests(matrix: Matrix, image_id: str) -> set[str]:
    """Digests this very image already has in the matrix's repository (docker's RepoDigests)."""
    info = engine.inspect_image(image_id) or {}
    prefix = matrix.image_name + "@"
    return {d.removeprefix(prefix) for d in info.get("RepoDigests") or [] if d.startswith(prefix)}


def dated_tag(matrix: Matrix, floating: str, date: str, mine: set[str]) -> tuple[str, str | None]:
    """The first free `<floating>-<date>[.n]`, or the one already holding this image's digest.

    Returns (tag, digest when reused). A tag holding another digest is never overwritten.
    """
    for n in range(MAX_SUFFIX + 1):
        tag = f"{floating}-{date}" + (f".{n}" if n else "")
        desc = remote(matrix.registry, matrix.repository, tag)
        if desc is None:
            return tag, None
        if desc.digest in mine:
            return tag, desc.digest
    raise RegistryError(f"`{floating}-{date}` has {MAX_SUFFIX} suffixes taken today")


# ---- OCI artifacts ----------------------------------------------------------------------------


def oras_client(registry: str) -> Any:
    import oras.client

    client = oras.client.OrasClient(hostname=registry,
                                    insecure=plan.registry_url(registry).startswith("http:"))
    user, password = os.environ.get("REGISTRY_USERNAME"), os.environ.get("REGISTRY_PASSWORD")
    if user and password:
        client.auth.set_basic_auth(user, password)  # in memory only; never written or printed
    return client


def push_artifact(matrix: Matrix, subject: Descriptor, kind: str, path: Path,
                  media_type: str) -> dict[str, str]:
    """Push `path` as an artifact whose subject is the image; tag `sha256-<hex>.<kind>`."""
    tag = f"{subject.digest.replace(':', '-')}.{kind}"
    digest = retry(f"pushing the {kind} artifact `{tag}`", matrix.registry,
                   lambda: _oras_push(matrix, tag, subject, path, media_type))
    return {"tag": tag, "digest": digest, "media_type": media_type,
            "reference": f"{matrix.image_name}@{digest}"}


def _oras_push(matrix: Matrix, tag: str, subject: Descriptor, path: Path,
               media_type: str) -> str:
    import requests

    client = oras_client(matrix.registry)
    container = client.get_container(f"{matrix.image_name}:{tag}")
    client.auth.load_configs(container)  # credentials from the Docker config, if any
    with tempfile.TemporaryDirectory() as tmp:
        config_path = Path(tmp) / "config.json"
        config_path.write_bytes(b"{}")
        config = _descriptor(config_path, EMPTY_CONFIG)
        layer = _descriptor(path, media_type) | {"annotations": {
            "org.opencontainers.image.title": path.name}}
        try:
            for blob, desc in ((config_path, config), (path, layer)):
                _check(client.upload_blob(str(blob), container, desc))
            manifest = {
                "schemaVersion": 2, "mediaType": OCI_MANIFEST, "artifactType": media_type,
                "config": config, "layers": [layer],
                "subject": {"mediaType": subject.media_type, "digest": subject.digest,
                            "size": subject.size},
                "annotations": {REF_NAME: tag,
                                "io.torch-images.subject": subject.digest},
            }
            response = client.upload_manifest(manifest, container)
        except requests.RequestException as exc:
            raise _RequestError(str(exc)) from None
    _check(response)
    return response.headers["Docker-Content-Digest"]


def _descriptor(path: Path, media_type: str) -> dict[str, Any]:
    data = path.read_bytes()
    return {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
            "size": len(data)}


def _check(response: Any) -> None:
    if response.status_code not in (200, 201, 202):
        raise _RequestError(f"{response.request.method} {response.url}: HTTP "
                            f"{response.status_code} {response.text[:200]}")


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
    """Push one gated image; returns its publication record (see the published.json schema)."""
    p = cand.planned
    date = today()
    tag, reused = dated_tag(matrix, p.floating_tag, date, local_digests(matrix, cand.image_id))
    digest = reused or push_tag(matrix, cand.image_id, tag, None)
    push_tag(matrix, cand.image_id, p.hash_tag, digest)
    subject = verify(matrix, tag, digest)
    assert cand.sbom_path is not None and cand.smoke_path is not None
    sbom_ref = push_artifact(matrix, subject, "sbom", cand.sbom_path, SBOM_TYPE)
    smoke_ref = push_artifact(matrix, subject, "smoke", cand.smoke_path, SMOKE_TYPE)
    # Only now, with the image verified and its evidence attached, do moving tags change.
    for moving in p.tags:
        push_tag(matrix, cand.image_id, moving, digest)
    _untag(matrix, [tag, p.hash_tag, *p.tags[1:]])
    facts = p.rendered.facts
    return {
        "date": f"{date[:4]}-{date[4:6]}-{date[6:]}",
        "published_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "registry": matrix.registry, "repository": matrix.repository,
        "digest": digest, "reference": f"{matrix.image_name}@{digest}",
        "image_id": cand.image_id, "content_hash": p.content_hash,
        "tags": [tag, p.hash_tag, *p.tags], "dated_tag": tag, "hash_tag": p.hash_tag,
        "floating_tag": p.floating_tag, "aliases": list(p.tags[1:]),
        "torch": facts.get("torch"), "python": facts.get("python") or p.variant.python,
        "accelerator": p.variant.accelerator, "cuda": facts.get("cuda"),
        "cudnn": facts.get("cudnn"), "nccl": facts.get("nccl"),
        "min_driver": facts.get("min_driver"), "flavor": p.variant.flavor,
        "sbom": sbom_ref, "smoke_report": smoke_ref,
        "smoke_gpu": cand.smoke_gpu, "allow_cpu_smoke": cand.allow_cpu_smoke,
    }


def _untag(matrix: Matrix, tags: list[str]) -> None:
    """Drop the extra local tags this run made; the image keeps its floating tag."""
    for tag in tags:
        engine.docker("image", "rm", f"{matrix.image_name}:{tag}", check=False)


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
                     manifest: Path = Path("published.json"),
                     locks_dir: Path = Path("locks")) -> list[dict[str, Any]]:
    """Gate and publish each variant. Returns one result per variant (`status`: published,
    refused, would-publish). Records what was published even when a later variant fails.
    Every tag of the whole matrix is checked for collisions before anything is pushed."""
    plan.check_tags(matrix, locks_dir)
    engine.ensure_engine()
    results: list[dict[str, Any]] = []
    done: dict[str, dict[str, Any]] = {}
    try:
        for p in planned:
            cand = gate(matrix, p, allow_cpu_smoke=allow_cpu_smoke)
            if cand.reason:
                step(f"  [{p.variant.id}] refused: {cand.reason}")
                results.append({"id": p.variant.id, "status": "refused", "reason": cand.reason,
                                "image_id": cand.image_id})
            elif dry_run:
                results.append(dry_run_entry(matrix, cand))
            else:
                step(f"  [{p.variant.id}] publishing {cand.image}")
                pub = publish_one(matrix, cand)
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
        "Exit 5 when any image was refused.")
    p.add_argument("--locks", default="locks", type=Path)
    p.add_argument("--allow-cpu-smoke", action="store_true",
                   help="publish CUDA images whose smoke ran without a GPU (recorded)")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would be pushed; push nothing")
    p.add_argument("--manifest", default=Path("published.json"), type=Path, metavar="FILE",
                   help="publication record (default: %(default)s)")
    p.set_defaults(func=cmd_publish)


def cmd_publish(args: argparse.Namespace) -> int:
    if not args.select:
        args.select = ["default=true"]
    matrix, variants = load_selected(args)
    planned = plan.make_plan(matrix, variants, args.locks, known_base_digests(variants),
                             check_registry=False)
    results = publish_variants(matrix, planned, allow_cpu_smoke=args.allow_cpu_smoke,
                               dry_run=args.dry_run, manifest=args.manifest,
                               locks_dir=args.locks)
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
