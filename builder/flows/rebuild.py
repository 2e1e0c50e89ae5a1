"""`builder rebuild`: rebuild published images when their sources moved.

`builder.flows.rebuild_check` asks the sources (Debian updates, Python vulnerabilities, the base,
the inputs). Without `--check` exactly the variants whose findings say `rebuild` are re-locked /
rebuilt (build runs smoke + SBOM), published under a new dated tag, the reason is attached to the
new image, and the SBOM diff old → new is printed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.core import keypair, layerdiff, media, oci, state
from builder.core.errors import BuilderError
from builder.core.output import step
from builder.flows import build as build_flow
from builder.flows import publish as publish_flow
from builder.flows.rebuild_check import (
    REBUILD,
    Finding,
    artifact_json_by_digest,
    check,
    latest_publications,
)
from builder.model import lockfile
from builder.model.matrix import Matrix, Variant
from builder.model.publication import Publication
from builder.stages import locks

# ---- re-locking one package -------------------------------------------------------------------


def upgrade_packages(matrix: Matrix, variant: Variant, locks_dir: Path,
                     packages: list[str]) -> bool:
    """Re-lock only `packages` (newest allowed) through the one lock store; did it change?"""
    lockfile.require_lock(locks_dir, variant)  # a missing or stale lock is refused, not re-made
    return locks.lock_variant(matrix, variant, locks_dir, upgrade_packages=packages)[1]


# ---- the rebuild ------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Action:
    variant_id: str
    reasons: list[str]
    upgrade: list[str] = field(default_factory=list)
    apt_refresh: str = ""
    state: str = "planned"  # planned | built | published | failed | unchanged | would-rebuild
    message: str = ""
    hint: str = ""  # a failure's hint (e.g. a checkout behind the registry: update it)
    changelog: dict[str, Any] | None = None
    # What a node that holds the previous digest downloads for the new one (compressed bytes of
    # the new blobs), and the new image's size: a security fix should cost megabytes.
    delta_bytes: int | None = None
    image_bytes: int | None = None
    # The diff's header: the publication it replaces and the new one (dated tag @ digest).
    old_publication: str = ""
    new_publication: str = ""


def plan_actions(findings: list[Finding]) -> list[Action]:
    """One action per variant with a `rebuild` finding."""
    actions: dict[str, Action] = {}
    for f in findings:
        if f.status != REBUILD:
            continue
        a = actions.setdefault(f.variant_id, Action(variant_id=f.variant_id, reasons=[]))
        if f.reason not in a.reasons:
            a.reasons.append(f.reason)
        if f.reason == "debian-security":
            a.apt_refresh = f.data.get("token") or a.apt_refresh
        if f.reason == "python-vuln" and f.data.get("name") not in a.upgrade:
            a.upgrade.append(f.data["name"])
    return list(actions.values())


def old_sbom(pub: Publication) -> dict[str, Any] | None:
    """The published image's SBOM: local by image id, else its registry artifact."""
    image_id = pub.image_id
    if image_id:
        path = state.evidence_path("sbom", image_id)
        if path.is_file():
            return json.loads(path.read_text())
    try:
        return artifact_json_by_digest(pub.registry, pub.repository, pub.sbom.digest)
    except (BuilderError, OSError, ValueError, KeyError, IndexError) as exc:
        step(f"  old SBOM not available from {pub.registry}: {exc}")
        return None


@dataclass(frozen=True, kw_only=True)
class RebuildOptions:
    """What one rebuild is asked: `builder rebuild` makes it from its arguments
    (commands/rebuild.py); tests give their own `build` and `publish` here."""

    matrix: Matrix
    variants: list[Variant]
    manifest: Path
    locks_dir: Path
    allow_cpu_smoke: bool = False
    dry_run: bool = False
    findings: list[Finding] | None = None  # the sources' answers, when already asked
    skip: Collection[str] = ()  # sources left unasked (only when `findings` is None)
    trust: keypair.Trust = keypair.UNSIGNED  # signs what is published
    # The flows run per action; read when the options are made, not when this module is imported.
    build: Callable[..., list[Any]] = field(default_factory=lambda: build_flow.build_images)
    publish: Callable[..., list[dict[str, Any]]] = field(
        default_factory=lambda: publish_flow.publish_variants)


@dataclass(frozen=True)
class Run:
    """What every action of one rebuild shares: its options, the sources' findings and the
    publications the actions replace."""

    options: RebuildOptions
    findings: list[Finding]
    pubs: dict[str, Publication]


def rebuild(options: RebuildOptions) -> list[Action]:
    """Rebuild and publish exactly the variants whose findings say so (signing with
    `options.trust.key`); returns the actions."""
    findings = options.findings
    if findings is None:
        findings = check(options.matrix, options.variants, locks_dir=options.locks_dir,
                         skip=options.skip, keys=options.trust.vouchers)
    actions = plan_actions(findings)
    if options.dry_run or not actions:
        for a in actions:
            a.state = "would-rebuild"
        return actions
    run = Run(options, findings, latest_publications(options.matrix, options.trust.vouchers))
    with build_flow.build_lock():
        for a in actions:
            try:
                rebuild_one(run, a)
            except BuilderError as exc:
                a.state, a.message, a.hint = "failed", str(exc), exc.hint or ""
    return actions


def rebuild_one(run: Run, a: Action) -> None:
    """Re-lock, build and publish one variant (every selected platform of it: its tags name
    one multi-arch index); `a` records how far it got."""
    opts = run.options
    group = [v for v in opts.variants if v.id == a.variant_id]
    if a.upgrade and not relocked(opts, a, group):
        return
    # the registry's build cache only as signed by a trusted key (builder.stages.signed_cache);
    # forced, never `up to date`, but an image id this state folder has evidence for reuses it
    build_options = build_flow.BuildOptions(locks=opts.locks_dir, force=True, fail_fast=True,
                                           apt_refresh=a.apt_refresh,
                                           trusted=opts.trust.vouchers)
    outcomes = opts.build(opts.matrix, group, build_options)
    bad = [o for o in outcomes if o.state != "built"]
    if bad or not outcomes:
        a.state = "failed"
        a.message = "; ".join(f"{o.state}: {o.message}" for o in bad) or "not built"
        return
    a.state = "built"
    planned = [o.planned for o in outcomes if o.planned is not None]
    results = opts.publish(opts.matrix, planned, allow_cpu_smoke=opts.allow_cpu_smoke,
                           dry_run=False, manifest=opts.manifest, locks_dir=opts.locks_dir,
                           trust=opts.trust)
    result = results[0] if results else {"status": "refused", "reason": "no result"}
    if result.get("status") != "published":
        a.state, a.message = "failed", f"publish: {result.get('reason', '')}"
        return
    a.state = "published"
    a.message = ", ".join(result.get("tags", []))
    record_reasons(result, a, run.findings)
    previous = run.pubs.get(a.variant_id)
    if previous is not None:
        a.old_publication = f"{previous.dated_tag} @ {previous.digest}"
    a.new_publication = f"{result.get('dated_tag', '')} @ {result.get('digest', '')}"
    a.changelog = changelog(run.pubs.get(a.variant_id), outcomes[0])
    a.delta_bytes, a.image_bytes = download_delta(run.pubs.get(a.variant_id), result)


def relocked(opts: RebuildOptions, a: Action, group: list[Variant]) -> bool:
    """Re-lock the vulnerable packages; False (the action `unchanged`) when nothing newer is
    allowed and a Python fix was the only reason to rebuild."""
    step(f"  [{a.variant_id}] re-locking {', '.join(a.upgrade)}")
    changed = [upgrade_packages(opts.matrix, v, opts.locks_dir, a.upgrade) for v in group]
    if not any(changed) and a.reasons == ["python-vuln"]:
        a.state, a.message = "unchanged", (
            "re-locking found no newer allowed release of "
            + ", ".join(a.upgrade) + ": the fix needs a matrix change")
        return False
    return True



def record_reasons(result: dict[str, Any], action: Action, findings: list[Finding]) -> None:
    """Attach why this image was rebuilt to it (`sha256-<hex>.rebuild` on its first platform's
    manifest, beside its SBOM), so `builder catalog` shows the reason from the registry alone.
    A failure is a warning: the image is published and its history lacks only the reason."""
    digests = [p.get("digest") for p in result.get("platforms") or []] or [result.get("digest")]
    if not (result.get("registry") and result.get("repository") and digests[0]):
        return
    details = [f.detail for f in findings if f.variant_id == action.variant_id
               and f.status == REBUILD and f.detail]
    doc = {"reasons": action.reasons, "detail": "; ".join(details)[:2000],
           "upgraded": action.upgrade, "tags": result.get("tags", [])}
    try:
        reg = oci.Registry(result["registry"])
        subject = reg.head(result["repository"], digests[0])
        if subject is None:
            raise BuilderError(f"{digests[0]} is not in `{result['repository']}`")
        reg.push_artifact(result["repository"], subject, media.REBUILD,
                          (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode(),
                          kind="rebuild", title=media.KINDS["rebuild"].title)
    except BuilderError as exc:
        step(f"  [{action.variant_id}] warning: the rebuild reason was not attached: {exc}")


def download_delta(pub: Publication | None, result: dict[str, Any]
                   ) -> tuple[int | None, int | None]:
    """(new blob bytes, image bytes) of the republished image against the previous digest."""
    if pub is None or not result.get("digest"):
        return None, None
    try:
        return layerdiff.delta(oci.Registry(pub.registry), pub.repository, pub.digest,
                               result["digest"])
    except BuilderError:
        return None, None


def changelog(pub: Publication | None, outcome: Any) -> dict[str, Any] | None:
    import sbom

    old = old_sbom(pub) if pub else None
    new_path = Path(outcome.sbom_path) if getattr(outcome, "sbom_path", "") else None
    if old is None or new_path is None or not new_path.is_file():
        return None
    return sbom.diff_sboms(old, json.loads(new_path.read_text()))


__all__ = ["Action", "RebuildOptions", "plan_actions", "rebuild", "upgrade_packages"]
