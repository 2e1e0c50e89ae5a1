"""The steps of `builder publish`: gate, stage, promote, attach, sign and tag one image.

Publishing is promotion by digest; it never builds. Per variant, in this order (each step
idempotent; what users and `builder plan` read comes last):
  find     the staged image of the plan's content hash (`<repository>-staging:build-<hash20>`);
           a local image with that content hash is staged first (`docker push`)
  gate     its smoke report passed (CUDA: on a GPU unless --allow-cpu-smoke, which is recorded)
           and its SBOM validates — read from the registry (attached to the staged digest) or,
           when only this machine has them, from .state/ and then attached
  copy     into the vetted repository by digest (blob mounts; no tag yet)
  attach   SBOM, smoke report and SLSA provenance as OCI artifacts whose subject is that digest
           (also tagged `sha256-<hex>.sbom` / `.smoke` / `.provenance`)
  tag      `<floating>-YYYYMMDD` (UTC; `.1`, `.2`… when taken by another digest, never
           overwritten), the content tag `build-<hash20>`, the floating tag, then the aliases
The steps are composed, for a single manifest and an image index alike, in builder.flows.publish.
A run stopped at any step leaves no tag on an image without its evidence; run it again to
complete it. Credentials: docker's own config for `docker push`; REGISTRY_USERNAME/PASSWORD
for the registry API.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from builder.core import engine, keypair, labels, limits, oci, sign, state
from builder.core.oci import RegistryError
from builder.model import smokereport
from builder.model.matrix import Matrix
from builder.model.planned import PlannedVariant
from builder.model.publication import Signed
from builder.model.staged import Staged
from builder.stages import staging
from smoke.checks import gpu_checks_not_run

MAX_SUFFIX = 99


@dataclass
class Candidate:
    """One variant after the gate: what to promote, or why not."""

    planned: PlannedVariant
    image: str
    image_id: str = ""
    staged: Staged | None = None
    reason: str = ""  # non-empty: refused
    evidence: dict[str, bytes] = field(default_factory=dict)  # kind → the attached file
    smoke_gpu: bool = False
    allow_cpu_smoke: bool = False
    trust: keypair.Trust = keypair.UNSIGNED


# ---- the gate ---------------------------------------------------------------------------------


def gate(matrix: Matrix, p: PlannedVariant, *, allow_cpu_smoke: bool,
         trust: keypair.Trust = keypair.UNSIGNED) -> Candidate:
    """The staged (else local) image of the plan's content hash, and its evidence, checked:
    its config is the plan's, its smoke report and SBOM are signed by a trusted key (unless
    `trust.unsigned`), the report passed every check on this very image, the SBOM is valid."""
    cand = Candidate(p, p.local_image, trust=trust)
    cand.staged = staging.find_staged(matrix, p.hash_tag)
    cand.image_id = cand.staged.image_id if cand.staged else _local_image(cand)
    if cand.reason:
        return cand
    for kind in ("smoke", "sbom"):
        data = staging.fetch(cand.staged, kind) if cand.staged else _local_evidence(cand, kind)
        if data is not None:
            cand.evidence[kind] = data
    cand.reason = (_staged_config_gate(cand) or _signed_gate(cand)
                   or _smoke_gate(cand, allow_cpu_smoke) or _sbom_gate(cand))
    return cand


def _local_image(cand: Candidate) -> str:
    """The id of the local image with the plan's content hash (not staged yet), or a reason."""
    info = engine.inspect_image(cand.image)
    if info is None:
        cand.reason = (f"`{cand.planned.hash_tag}` is not staged and there is no local image "
                       f"`{cand.image}`: build it first (builder build)")
        return ""
    have = (info["Config"].get("Labels") or {}).get(labels.CONTENT_HASH, "")
    if have != cand.planned.content_hash:
        cand.reason = (f"stale image: its content hash {have[:12] or '(none)'} is not the plan's "
                       f"{cand.planned.content_hash[:12]}; rebuild it (builder build)")
    return info["Id"]


def config_problem(p: PlannedVariant, config: dict[str, Any]) -> str:
    """What makes an image config (from the registry) not the plan's image: its content hash,
    lock hash, os and architecture must all be the plan's."""
    found = (config.get("config") or {}).get("Labels") or {}
    want_os, _, want_arch = p.variant.platform.partition("/")
    wanted = {f"label {labels.CONTENT_HASH}": (found.get(labels.CONTENT_HASH), p.content_hash),
              f"label {labels.LOCK_HASH}": (found.get(labels.LOCK_HASH), p.lock_hash),
              "os": (config.get("os"), want_os),
              "architecture": (config.get("architecture"), want_arch.split("/")[0])}
    wrong = [f"{what} {have!r} is not the plan's {want!r}"
             for what, (have, want) in wanted.items() if have != want]
    return "; ".join(wrong)


def _staged_config_gate(cand: Candidate) -> str:
    if cand.staged is None:
        return ""
    problem = config_problem(cand.planned, staging.image_config(cand.staged))
    return f"the staged image {cand.staged.digest[:19]} is not the plan's: {problem}" if problem \
        else ""


EVIDENCE_NAMES = {"smoke": "smoke report", "sbom": "SBOM"}


def _signed_gate(cand: Candidate) -> str:
    """Staged evidence counts only as signed by a trusted key: the gate reads the attested
    documents, and a file attached beside them must be the same document."""
    if cand.staged is None or cand.trust.unsigned:
        return ""  # a local image's evidence was made here: signed when publish stages it
    files, problems = staging.signed(cand.staged, list(cand.trust.keys))
    reg = oci.Registry(cand.staged.registry)
    for kind, name in EVIDENCE_NAMES.items():
        if kind not in files:
            return (f"the staged {name} has no attestation signed by a trusted key: "
                    f"{problems[kind]} (sign where it is made with --key, or publish --unsigned)")
        attached = reg.fetch_artifact(cand.staged.repository, cand.staged.digest, kind)
        if attached is not None and _parsed(attached) != json.loads(files[kind]):
            return f"the attached {name} differs from its signed attestation"
        cand.evidence[kind] = files[kind]
    return ""


def _parsed(data: bytes) -> Any:
    try:
        return limits.parse_json(data)
    except ValueError:
        return None


def _local_evidence(cand: Candidate, kind: str) -> bytes | None:
    path = state.evidence_path(kind, cand.image_id)
    return path.read_bytes() if path.is_file() else None


def _smoke_gate(cand: Candidate, allow_cpu_smoke: bool) -> str:
    is_cuda = cand.planned.variant.accelerator == "cuda"
    try:
        report = limits.parse_json(cand.evidence["smoke"]) if "smoke" in cand.evidence else None
    except ValueError as exc:
        return f"the smoke report is not JSON: {exc}"
    passed, why = smokereport.report_passed(report, require_gpu=is_cuda and not allow_cpu_smoke)
    if not passed:
        return why
    assert report is not None
    accel = (report.get("facts") or {}).get("accelerator")
    if accel != cand.planned.variant.accelerator:
        want = cand.planned.variant.accelerator
        return f"the smoke report checked a `{accel}` image, not a `{want}` one"
    ran_on = (report.get("image") or {}).get("id")
    if ran_on != cand.image_id:
        return f"the smoke report ran on image {ran_on}, not on {cand.image_id[:19]}"
    if lacking := smokereport.required_checks_missing(report):
        return f"the smoke report lacks required checks: {', '.join(lacking)}"
    gpu_passed = not gpu_checks_not_run(report["checks"])  # the suite's own rule
    cand.smoke_gpu = is_cuda and bool(report.get("require_gpu")) and gpu_passed
    cand.allow_cpu_smoke = is_cuda and not cand.smoke_gpu  # the waiver was needed, and used
    return ""


def _sbom_gate(cand: Candidate) -> str:
    import sbom

    if "sbom" not in cand.evidence:
        return (f"no SBOM for image {cand.image_id[:19]}: run `builder build` (or "
                f"`builder sbom {cand.staged.reference if cand.staged else cand.image}`)")
    try:
        sbom.validate(limits.parse_json(cand.evidence["sbom"]))
    except ValueError as exc:
        return f"the SBOM is not JSON: {exc}"
    except sbom.SbomInvalid as exc:
        return "the SBOM is not valid CycloneDX 1.6" + (f": {exc.hint[:200]}"
                                                         if exc.hint else "")
    return ""


# ---- the registry -----------------------------------------------------------------------------


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


def promote(matrix: Matrix, staged: Staged) -> Staged:
    """Copy the staged image into the vetted repository, by digest: no tag points at it yet.
    Staging may be another registry: each missing blob is then streamed across once."""
    oci.promote(oci.Registry(staged.registry), staged.repository, oci.Registry(matrix.registry),
                matrix.repository, staged.digest)
    return Staged(matrix.registry, matrix.repository, staged.descriptor, staged.image_id)


def attach(vetted: Staged, kind: str, data: bytes, trust: keypair.Trust) -> dict[str, str]:
    return staging.attach(vetted, kind, data, key=trust.key)


def sign_digest(vetted: Staged, trust: keypair.Trust,
                optional: dict[str, str] | None = None) -> dict[str, Any]:
    """Sign the promoted manifest or index (cosign's `.sig`, naming in `optional` the variant
    and the tags it is promoted under); its publication fields. Only what the gate verified
    reaches here with a key: keypair.trust refuses a key with --unsigned."""
    if trust.key is None:
        return {"signed": False, "unsigned": trust.unsigned}
    assert not trust.unsigned, "a key with --unsigned is refused by keypair.trust"
    sign.sign_image(oci.Registry(vetted.registry), vetted.repository, vetted.digest, trust.key,
                    optional)
    return {"signed": True, "unsigned": False,
            "signature": Signed(sign.sig_tag(vetted.digest), sign.att_tag(vetted.digest),
                                keypair.key_id(trust.key.public))}


# ---- one variant ------------------------------------------------------------------------------


def today() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%d")


def dry_run_entry(matrix: Matrix, cand: Candidate) -> dict[str, Any]:
    p = cand.planned
    return {"id": p.variant.id, "status": "would-publish", "image_id": cand.image_id,
            "staged": cand.staged.reference if cand.staged else None,
            "tags": [f"{p.floating_tag}-{today()}[.n]", p.hash_tag, *p.tags],
            "artifacts": ["sha256-<digest>.sbom", "sha256-<digest>.smoke",
                          "sha256-<digest>.provenance"],
            "registry": matrix.registry, "repository": matrix.repository}


def next_dated(vetted: Staged, floating: str) -> tuple[str, bool]:
    """The dated tag this publication takes (signed before it is written), and whether it
    already holds the digest."""
    reg = oci.Registry(vetted.registry)
    return dated_tag(reg, vetted.repository, floating, today(), vetted.digest)


def write_tags(vetted: Staged, floating: str, tags: list[str],
               dated: tuple[str, bool] | None = None) -> str:
    """Point the first free dated tag of `floating` (or `dated`, from next_dated), then `tags`
    (content tag first, then the moving ones) at the vetted image or index; returns the dated
    tag."""
    name, held = dated or next_dated(vetted, floating)
    for tag in ([] if held else [name]) + tags:
        tag_image(vetted, tag)
    return name


def tag_image(vetted: Staged, tag: str) -> None:
    oci.Registry(vetted.registry).tag(vetted.repository, vetted.digest, tag)
