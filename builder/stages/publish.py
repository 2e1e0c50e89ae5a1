"""The steps of `builder publish` for one image: the gate's checks, promote, sign and tag.

Publishing is promotion by digest; it never builds. Per variant, in this order (each step
idempotent; what users and `builder plan` read comes last):
  find     the staged image of the plan's content hash (`<repository>-staging:build-<hash20>`);
           a local image with that content hash is staged first (`docker push`)
  gate     its smoke report passed (CUDA: on a GPU unless --allow-cpu-smoke, which is recorded)
           and its SBOM validates — read from the registry (attached to the staged digest) or,
           when only this machine has them, from .state/ and then attached; the checks are
           here (config_problem, smoke_gate, sbom_gate), the reads in builder.flows.publish_gate
  copy     into the vetted repository by digest (blob mounts; no tag yet)
  attach   SBOM, smoke report and SLSA provenance as OCI artifacts whose subject is that digest
           (also tagged `sha256-<hex>.sbom` / `.smoke` / `.provenance`; builder.stages.staging)
  tag      `<floating>-YYYYMMDD` (UTC; `.1`, `.2`… when taken by another digest, never
           overwritten), the content tag `build-<hash20>`, the floating tag, then the aliases
The steps are composed, for a single manifest and an image index alike, in builder.flows.publish.
A run stopped at any step leaves no tag on an image without its evidence; run it again to
complete it. Credentials: docker's own config for `docker push`; REGISTRY_USERNAME/PASSWORD
for the registry API.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from builder.core import clock, keyless, keypair, labels, limits, oci, sign, vouch
from builder.core.oci import RegistryError
from builder.model import accelerators, smokereport
from builder.model.matrix import Matrix
from builder.model.planned import PlannedVariant
from builder.model.publication import Signed
from builder.model.staged import Staged
from smoke.checks import gpu_checks_not_run

MAX_SUFFIX = 99


@dataclass(kw_only=True)
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


def smoke_gate(cand: Candidate, allow_cpu_smoke: bool) -> str:
    """Why the smoke report does not let this image through (empty: it does); records whether
    it ran on a GPU and whether the CPU waiver was used."""
    needs_gpu = accelerators.needs_gpu_evidence(cand.planned.variant.accelerator)
    try:
        report = limits.parse_json(cand.evidence["smoke"]) if "smoke" in cand.evidence else None
    except ValueError as exc:
        return f"the smoke report is not JSON: {exc}"
    passed, why = smokereport.report_passed(report, require_gpu=needs_gpu and not allow_cpu_smoke)
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
    cand.smoke_gpu = needs_gpu and bool(report.get("require_gpu")) and gpu_passed
    cand.allow_cpu_smoke = needs_gpu and not cand.smoke_gpu  # the waiver was needed, and used
    return ""


def sbom_gate(cand: Candidate) -> str:
    """Why the SBOM does not let this image through (empty: it is valid CycloneDX 1.6)."""
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
              digest: str, vouchers: keypair.Vouchers = keypair.NOBODY
              ) -> tuple[str, bool]:
    """The first free `<floating>-<date>[.n]`, or the one already holding `digest`.

    Returns (tag, whether it already holds the digest). A tag holding another digest is never
    overwritten, unless `vouchers` are given and none of them signed that tag for its digest: an
    unsigned tag is no publication (anyone with push rights may write one) and takes no suffix.
    """
    for n in range(MAX_SUFFIX + 1):
        tag = f"{floating}-{date}" + (f".{n}" if n else "")
        desc = reg.head(repository, tag)
        if desc is None or (vouchers and not vouch.names_tag(reg, repository, desc.digest, tag,
                                                            vouchers)):
            return tag, False
        if desc.digest == digest:
            return tag, True
    raise RegistryError(f"`{floating}-{date}` has {MAX_SUFFIX} signed suffixes taken today")


def promote(matrix: Matrix, staged: Staged) -> Staged:
    """Copy the staged image into the vetted repository, by digest: no tag points at it yet.
    Staging may be another registry: each missing blob is then streamed across once."""
    oci.promote(oci.Registry(staged.registry), staged.repository, oci.Registry(matrix.registry),
                matrix.repository, staged.digest)
    return Staged(matrix.registry, matrix.repository, staged.descriptor, staged.image_id)


def sign_digest(vetted: Staged, trust: keypair.Trust,
                optional: dict[str, str] | None = None) -> dict[str, Any]:
    """Sign the promoted manifest or index, naming in `optional` the variant and the tags it
    is promoted under: with the key, cosign's `.sig`; with an OIDC token, a sigstore bundle of
    the image and one of each piece of evidence attached to it (referrers). Its publication
    fields. Only what the gate verified reaches here signing: keypair.trust refuses a key or a
    token with --unsigned."""
    if not trust.signs:
        return {"signed": False, "unsigned": trust.unsigned}
    assert not trust.unsigned, "signing with --unsigned is refused by keypair.trust"
    reg = oci.Registry(vetted.registry)
    signer = None
    if trust.keyless is not None:
        signer, _ = keyless.attest_digest(reg, vetted.repository, vetted.digest,
                                          trust.keyless.token, trust.keyless.config, optional)
    if trust.key is None:
        assert signer is not None
        ref = keyless.referrers_tag(vetted.digest)
        return {"signed": True, "unsigned": False,
                "signature": Signed(ref, ref, f"keyless: {signer.describe()}")}
    sign.sign_image(reg, vetted.repository, vetted.digest, trust.key, optional)
    return {"signed": True, "unsigned": False,
            "signature": Signed(sign.sig_tag(vetted.digest), sign.att_tag(vetted.digest),
                                keypair.key_id(trust.key.public))}


def sign_image_as(reg: oci.Registry, repository: str, digest: str, trust: keypair.Trust,
                  optional: dict[str, str]) -> None:
    """Sign `digest` again, its image signature alone (re-signing a lost signature, a
    rollback: its evidence stays as attested), with what `trust` signs with: the key's `.sig`,
    an OIDC token's sigstore bundle (the image statement naming `optional`'s tags), or both."""
    assert trust.signs, "the callers refuse to re-sign without a key or a token"
    if trust.keyless is not None:
        keyless.sign_and_attach(reg, repository, digest, trust.keyless.token,
                                trust.keyless.config, [], optional)
    if trust.key is not None:
        sign.sign_image(reg, repository, digest, trust.key, optional)


# ---- one variant ------------------------------------------------------------------------------


def dry_run_entry(matrix: Matrix, cand: Candidate) -> dict[str, Any]:
    p = cand.planned
    return {"id": p.variant.id, "status": "would-publish", "image_id": cand.image_id,
            "staged": cand.staged.reference if cand.staged else None,
            "tags": [f"{p.floating_tag}-{clock.stamp()}[.n]", p.hash_tag, *p.tags],
            "artifacts": ["sha256-<digest>.sbom", "sha256-<digest>.smoke",
                          "sha256-<digest>.provenance"],
            "registry": matrix.registry, "repository": matrix.repository}


def next_dated(vetted: Staged, floating: str,
               vouchers: keypair.Vouchers = keypair.NOBODY) -> tuple[str, bool]:
    """The dated tag this publication takes (signed before it is written), and whether it
    already holds the digest; with `vouchers`, unsigned dated tags are free (dated_tag)."""
    reg = oci.Registry(vetted.registry)
    return dated_tag(reg, vetted.repository, floating, clock.stamp(), vetted.digest, vouchers)


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
