"""`builder rebuild [--check]`: rebuild published images when their sources moved.

For each variant in published.json (its latest publication) four sources are asked:

  debian-security  `apt list --upgradable` inside the published image (as root, after an update)
  python-vuln      pip-audit on the variant's lock: vulnerabilities that have a fixed version
                   (torch itself is pinned by the matrix: reported as `matrix-change`)
  base-moved       the base's digest now vs the image's `org.opencontainers.image.base.digest`
  inputs-changed   the plan's content hash (with the published base) vs the image's label

A source that cannot be asked is reported as `unknown` with its error, never as clean.
`--skip-source NAME` (repeatable) does not ask that source at all; it is reported as `skipped`
(the --json `sources` map and `skipped` list, and the human summary), never as clean.
`--check` exits 0 when nothing needs rebuilding, 1 when something does, 2 when a source is
unknown. Without `--check` exactly the variants needing it are re-locked / rebuilt (build runs
smoke + SBOM), published under a new dated tag, and the SBOM diff old → new is printed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import tempfile
import uuid
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builder.core import engine, labels, layerdiff, oci, proc, sign, state
from builder.core.errors import BuilderError, ConfigError
from builder.core.output import step
from builder.model import platforms, publication
from builder.model.matrix import Matrix, Variant
from builder.model.publication import Publication
from builder.stages import base, locks, multiarch, plan, publish
from builder.stages import build as build_mod

REASONS = ("debian-security", "python-vuln", "base-moved", "inputs-changed")
BASE_DIGEST_LABEL = labels.OCI + "base.digest"
# apt as an unprivileged user on a read-only root: its lists and cache go to the /tmp tmpfs.
APT_OPTIONS = ("-o Dir::State::Lists=/tmp/apt/lists -o Dir::Cache=/tmp/apt/cache "
               "-o Debug::NoLocking=true -o APT::Sandbox::User=nobody")
APT_CMD = ("mkdir -p /tmp/apt/lists/partial /tmp/apt/cache/archives/partial && "
           f"apt-get update -qq --error-on=any {APT_OPTIONS} && "
           f"apt list --upgradable {APT_OPTIONS} 2>/dev/null")
# The published image is not trusted to run with privileges: no host network (the default
# bridge reaches the mirrors), nobody's uid, a read-only root, no capabilities.
UNPRIVILEGED = ("--network", "bridge", "--user", "65534:65534", "--read-only",
                "--tmpfs", "/tmp:rw,exec,nosuid,nodev", "--cap-drop", "ALL",
                "--security-opt", "no-new-privileges")
# `libssl3/stable-security 3.0.15-1~deb12u1 amd64 [upgradable from: 3.0.14-1~deb12u2]`
_APT_LINE = re.compile(r"^(\S+?)/\S*\s+(\S+)\s+\S+\s+\[upgradable from:\s*([^\]\s]+)\]")
# `Inst libssl3 [3.0.14-1~deb12u2] (3.0.15-1~deb12u1 Debian-Security:12/stable-security [amd64])`
_APT_SIM = re.compile(r"^Inst\s+(\S+)\s+\[([^\]]+)\]\s+\((\S+)")

# Status of a finding: rebuild (this tool fixes it), matrix-change (a person must: torch CVE),
# unknown (the source could not be asked: never clean).
REBUILD, MATRIX_CHANGE, UNKNOWN = "rebuild", "matrix-change", "unknown"


@dataclass
class Finding:
    variant_id: str
    reason: str  # one of REASONS
    status: str  # rebuild | matrix-change | unknown
    detail: str
    data: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


class SourceError(BuilderError):
    """A source could not be asked (unreachable, command failed, unreadable answer)."""


# ---- the published record and image ------------------------------------------------------------


def latest_publications(manifest: Path) -> dict[str, Publication]:
    """variant id → its latest publication in published.json."""
    return publication.latest(manifest)


def published_image(pub: Publication) -> tuple[str, dict[str, Any]]:
    """A local reference to the published image (pulled by digest when absent) and its inspect."""
    for ref in (pub.reference, pub.image_id):
        info = engine.inspect_image(ref) if ref else None
        if info:
            return ref, info
    result = engine.docker("pull", pub.reference, check=False, timeout=3600)
    if result.returncode != 0:
        raise SourceError(f"cannot pull {pub.reference}: {result.stderr.strip()[-300:]}")
    info = engine.inspect_image(pub.reference)
    if not info:
        raise SourceError(f"pulled {pub.reference} but the engine does not show it")
    return pub.reference, info


# ---- the sources ------------------------------------------------------------------------------


def parse_upgradable(text: str) -> dict[str, tuple[str, str]]:
    """name → (installed, candidate) from `apt list --upgradable` or `apt-get -s upgrade`."""
    found: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        line = line.strip()
        m = _APT_LINE.match(line)
        if m:
            found[m.group(1)] = (m.group(3), m.group(2))
            continue
        m = _APT_SIM.match(line)
        if m:
            found[m.group(1)] = (m.group(2), m.group(3))
    return dict(sorted(found.items()))


def debian_upgradable(image: str) -> dict[str, tuple[str, str]]:
    """Packages with a newer version in the image's apt sources, asked in an unprivileged
    container (UNPRIVILEGED)."""
    name = f"builder-apt-{uuid.uuid4().hex[:12]}"
    result = engine.run_container(name, ["run", "--rm", "--name", name, *UNPRIVILEGED,
                                         "--entrypoint", "sh", image, "-c", APT_CMD],
                                  check=False, timeout=900)
    if result.returncode != 0:
        raise SourceError(f"apt in {image} exited with {result.returncode}: "
                          + "\n".join((result.stderr or result.stdout).strip().splitlines()[-5:]))
    return parse_upgradable(result.stdout)


def audit_lock(lock_path: Path, timeout: float = 300) -> dict[str, Any]:
    """pip-audit of a lock's pins: {"vulns": [{name, version, id, fix_versions, aliases}],
    "unknown": [{name, version, reason}]}. Local versions are audited as their public release
    (`2.13.0+cpu` is built from the `2.13.0` sources); one PyPI does not know stays unknown."""
    if not lock_path.is_file():
        raise SourceError(f"no lock {lock_path}")
    pins = locks.parse_pins(lock_path.read_text())
    if not pins:
        raise SourceError(f"{lock_path} has no pins")
    public = {name: version.split("+", 1)[0] for name, version in pins.items()}
    with tempfile.TemporaryDirectory(prefix="rebuild-audit-") as tmp:
        req = Path(tmp, "requirements.txt")
        req.write_text("".join(f"{n}=={v}\n" for n, v in sorted(public.items())))
        argv = ["pip-audit", "-r", req, "--disable-pip", "--no-deps", "-f", "json",
                "--progress-spinner", "off", "--cache-dir", Path(tmp, "cache")]
        try:
            result = proc.run(argv, check=False, timeout=timeout)
        except BuilderError as exc:
            raise SourceError(f"pip-audit: {exc}") from None
    if result.returncode not in (0, 1):
        tail = "\n".join((result.stderr or "").strip().splitlines()[-5:])
        raise SourceError(f"pip-audit exited with {result.returncode}: {tail}")
    try:
        data = json.loads(result.stdout)
    except json.JSONDecodeError as exc:
        raise SourceError(f"pip-audit printed no JSON: {exc}") from None
    out: dict[str, Any] = {"vulns": [], "unknown": []}
    answered = 0
    for dep in data.get("dependencies", []):
        name = locks.normalize(dep.get("name", ""))
        version = pins.get(name, dep.get("version", ""))
        if "skip_reason" in dep:
            out["unknown"].append({"name": name, "version": version,
                                   "reason": dep["skip_reason"]})
            continue
        answered += 1
        for v in dep.get("vulns", []):
            out["vulns"].append({"name": name, "version": version, "id": v["id"],
                                 "fix_versions": v.get("fix_versions") or [],
                                 "aliases": v.get("aliases") or []})
    if not answered:
        raise SourceError("PyPI's vulnerability data knew none of the pinned releases "
                          "(offline or blocked?)")
    return out


def base_digest_now(variant: Variant) -> str:
    try:
        return base.ensure(variant.base, progress=step)
    except BuilderError as exc:
        raise SourceError(f"base {variant.base.image}: {exc}") from None


def planned_hash(matrix: Matrix, variant: Variant, locks_dir: Path, base_digest: str | None,
                 smoke_hash: str) -> str:
    """The content hash the plan gives today's inputs on the published image's base."""
    return plan.plan_variant(matrix, variant, locks_dir, base_digest, smoke_hash).content_hash


# ---- the check --------------------------------------------------------------------------------


def _unknown(vid: str, reason: str, exc: Exception) -> Finding:
    return Finding(vid, reason, UNKNOWN, str(exc))


def signature_problem(pub: Publication, keys: tuple[Any, ...]) -> str:
    """Why the published digest must not be run ('' when its signature verifies, or when it
    was published unsigned and no key is given)."""
    if not keys:
        return ("its publication is signed: give --trust-key (cosign.pub) to verify it before "
                "running it") if pub.signed else ""
    name, _, digest = pub.reference.partition("@")
    registry, _, repository = name.partition("/")
    try:
        sign.verify_image(oci.Registry(registry), repository, digest, list(keys))
    except sign.SignatureError as exc:
        return f"not run: its signature does not verify ({exc})"
    return ""


def check_variant(matrix: Matrix, variant: Variant, pub: Publication, locks_dir: Path,
                  smoke_hash: str, base_digests: dict[str, str],
                  skip: frozenset[str] = frozenset(), keys: tuple[Any, ...] = ()
                  ) -> list[Finding]:
    """Ask each source not in `skip` about one published variant."""
    vid = variant.id
    findings: list[Finding] = []
    image, info, image_error = "", {}, None
    if {"debian-security", "base-moved", "inputs-changed"} - skip:
        try:
            image, info = published_image(pub)
        except BuilderError as exc:
            image_error = exc
    image_labels = (info.get("Config") or {}).get("Labels") or {}

    # (a) Debian updates inside the published image
    if "debian-security" in skip:
        pass
    elif image_error is not None:
        findings.append(_unknown(vid, "debian-security", image_error))
    elif untrusted := signature_problem(pub, keys):
        findings.append(Finding(vid, "debian-security", UNKNOWN, untrusted))
    else:
        try:
            upgradable = debian_upgradable(image)
        except BuilderError as exc:
            findings.append(_unknown(vid, "debian-security", exc))
        else:
            if upgradable:
                findings.append(Finding(
                    vid, "debian-security", REBUILD,
                    ", ".join(f"{n} {o}→{nw}" for n, (o, nw) in upgradable.items()),
                    {"packages": {n: {"old": o, "new": nw} for n, (o, nw) in upgradable.items()},
                     "token": apt_token(upgradable)}))

    # (b) Python vulnerabilities with a fix
    try:
        audit = ({"vulns": [], "unknown": []} if "python-vuln" in skip
                 else audit_lock(locks.lock_paths(locks_dir, variant)[0]))
    except BuilderError as exc:
        findings.append(_unknown(vid, "python-vuln", exc))
    else:
        for v in audit["vulns"]:
            if not v["fix_versions"]:
                continue
            pinned = v["name"] == "torch"
            findings.append(Finding(
                vid, "python-vuln", MATRIX_CHANGE if pinned else REBUILD,
                f"{v['name']} {v['version']}: {v['id']} fixed in {', '.join(v['fix_versions'])}"
                + (" (torch is pinned: change the matrix)" if pinned else ""), v))
        for u in audit["unknown"]:
            findings.append(Finding(vid, "python-vuln", UNKNOWN,
                                    f"{u['name']} {u['version']}: {u['reason']}", u))

    # (c) base digest moved
    published_base = image_labels.get(BASE_DIGEST_LABEL) or None
    if "base-moved" in skip:
        pass
    elif image_error is not None:
        findings.append(_unknown(vid, "base-moved", image_error))
    else:
        try:
            key = platforms.base_key(variant.base.image, variant.platform)
            if key not in base_digests:
                base_digests[key] = (base_digest_now(variant)
                                     if variant.platform == platforms.DEFAULT
                                     else base.ensure_variant(matrix, variant, progress=step)
                                     or "unknown")
            now = base_digests[key]
        except BuilderError as exc:
            findings.append(_unknown(vid, "base-moved", exc))
        else:
            if not published_base:
                findings.append(Finding(vid, "base-moved", UNKNOWN,
                                        f"{image} has no {BASE_DIGEST_LABEL} label"))
            elif now != published_base:
                findings.append(Finding(vid, "base-moved", REBUILD,
                                        f"{variant.base.image}: {published_base[:19]}→{now[:19]}",
                                        {"old": published_base, "new": now}))

    # (d) inputs changed: the content hash on the published base, so a moved base is not
    # counted twice
    if "inputs-changed" in skip:
        return findings
    if image_error is not None:
        findings.append(_unknown(vid, "inputs-changed", image_error))
        return findings
    have = image_labels.get(labels.CONTENT_HASH) or pub.content_hash
    try:
        want = planned_hash(matrix, variant, locks_dir, published_base, smoke_hash)
    except BuilderError as exc:
        findings.append(_unknown(vid, "inputs-changed", exc))
    else:
        if want != have:
            findings.append(Finding(vid, "inputs-changed", REBUILD,
                                    f"content hash {have[:12] or '(none)'}→{want[:12]}",
                                    {"old": have, "new": want}))
    return findings


def check(matrix: Matrix, variants: list[Variant], manifest: Path, *,
          locks_dir: Path = Path("locks"), skip: Collection[str] = (),
          keys: tuple[Any, ...] = ()) -> list[Finding]:
    """Findings for the selected variants that have a publication in `manifest`; the sources in
    `skip` are not asked (see `source_summary`: they are `skipped`, not clean)."""
    unknown_names = set(skip) - set(REASONS)
    if unknown_names:
        raise ConfigError(f"unknown source {', '.join(sorted(unknown_names))}",
                          hint=f"sources: {', '.join(REASONS)}")
    skipped = frozenset(skip)
    pubs = latest_publications(manifest)
    smoke_hash = plan.smoke_files_hash()
    base_digests: dict[str, str] = {}
    findings: list[Finding] = []
    for v in variants:
        latest = pubs.get(v.id)
        pub = latest.for_platform(v.platform) if latest else None
        if pub is None:
            continue
        step(f"  [{v.id}] checking {pub.reference}")
        findings += check_variant(matrix, v, pub, locks_dir, smoke_hash, base_digests, skipped,
                                  keys)
    return findings


def source_summary(findings: list[Finding], skip: Collection[str] = ()) -> dict[str, str]:
    """source → skipped | unknown | rebuild | matrix-change | clean, over the checked variants
    (the worst status wins; `clean` only for a source that was asked)."""
    order = (UNKNOWN, REBUILD, MATRIX_CHANGE)
    out: dict[str, str] = {}
    for reason in REASONS:
        if reason in skip:
            out[reason] = "skipped"
            continue
        statuses = {f.status for f in findings if f.reason == reason}
        out[reason] = next((s for s in order if s in statuses), "clean")
    return out


def published_variants(matrix: Matrix, variants: list[Variant], manifest: Path) -> list[Variant]:
    pubs = latest_publications(manifest)
    known = {v.id for v in matrix.variants}
    for vid in sorted(set(pubs) - known):
        step(f"  {vid} is in {manifest} but no longer in {matrix.path}: skipped")
    return [v for v in variants if v.id in pubs]


def exit_code(findings: list[Finding]) -> int:
    if any(f.status == UNKNOWN for f in findings):
        return 2
    return 1 if findings else 0


def apt_token(upgradable: dict[str, tuple[str, str]]) -> str:
    """`YYYYMMDD-<hash of the upgradable list>`: a new token re-runs the apt upgrade step."""
    listing = "\n".join(f"{n} {o} {nw}" for n, (o, nw) in sorted(upgradable.items()))
    day = dt.datetime.now(dt.UTC).strftime("%Y%m%d")
    return f"{day}-{hashlib.sha256(listing.encode()).hexdigest()[:12]}"


# ---- re-locking one package -------------------------------------------------------------------


def upgrade_packages(matrix: Matrix, variant: Variant, locks_dir: Path,
                     packages: list[str]) -> bool:
    """Re-lock only `packages` (newest allowed) through the one lock store; did it change?"""
    locks.require_lock(locks_dir, variant)  # a missing or stale lock is refused, not re-made
    return locks.lock_variant(matrix, variant, locks_dir, upgrade_packages=packages)[1]


# ---- the rebuild ------------------------------------------------------------------------------


@dataclass
class Action:
    variant_id: str
    reasons: list[str]
    upgrade: list[str] = field(default_factory=list)
    apt_refresh: str = ""
    state: str = "planned"  # planned | built | published | failed | unchanged | would-rebuild
    message: str = ""
    changelog: dict[str, Any] | None = None
    # What a node that holds the previous digest downloads for the new one (compressed bytes of
    # the new blobs), and the new image's size: a security fix should cost megabytes.
    delta_bytes: int | None = None
    image_bytes: int | None = None


def plan_actions(findings: list[Finding]) -> list[Action]:
    """One action per variant with a `rebuild` finding."""
    actions: dict[str, Action] = {}
    for f in findings:
        if f.status != REBUILD:
            continue
        a = actions.setdefault(f.variant_id, Action(f.variant_id, []))
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
        for path in (state.sbom_path(image_id), publish.sbom_file(image_id)):
            if path.is_file():
                return json.loads(path.read_text())
    try:
        return fetch_artifact(pub.registry, pub.repository, pub.sbom.digest)
    except (BuilderError, OSError, ValueError, KeyError, IndexError) as exc:
        step(f"  old SBOM not available from {pub.registry}: {exc}")
        return None


def fetch_artifact(registry: str, repository: str, digest: str) -> dict[str, Any]:
    """The JSON payload of a one-layer OCI artifact, by its manifest digest."""
    reg = oci.Registry(registry)
    found = reg.manifest(repository, digest)
    if found is None:
        raise ValueError(f"`{repository}@{digest}` is not in the registry")
    return json.loads(reg.blob(repository, json.loads(found[0])["layers"][0]["digest"]))


def rebuild(matrix: Matrix, variants: list[Variant], manifest: Path, *, locks_dir: Path,
            allow_cpu_smoke: bool = False, dry_run: bool = False,
            findings: list[Finding] | None = None, skip: Collection[str] = (),
            build: Callable[..., list[Any]] | None = None,
            publish_fn: Callable[..., list[dict[str, Any]]] | None = None,
            trust: sign.Trust = sign.UNSIGNED) -> list[Action]:
    """Rebuild and publish exactly the variants whose findings say so (signing with
    `trust.key`); returns the actions."""
    if findings is None:
        findings = check(matrix, variants, manifest, locks_dir=locks_dir, skip=skip)
    actions = plan_actions(findings)
    if dry_run or not actions:
        for a in actions:
            a.state = "would-rebuild"
        return actions
    build = build or build_mod.build_images
    publish_fn = publish_fn or multiarch.publish_variants
    pubs = latest_publications(manifest)
    with build_mod.build_lock():
        for a in actions:
            # Every selected platform of the variant: its tags name one multi-arch index.
            group = [v for v in variants if v.id == a.variant_id]
            try:
                if a.upgrade:
                    step(f"  [{a.variant_id}] re-locking {', '.join(a.upgrade)}")
                    changed = [upgrade_packages(matrix, v, locks_dir, a.upgrade) for v in group]
                    if not any(changed) and a.reasons == ["python-vuln"]:
                        a.state, a.message = "unchanged", (
                            "re-locking found no newer allowed release of "
                            + ", ".join(a.upgrade) + ": the fix needs a matrix change")
                        continue
                options = build_mod.BuildOptions(locks=locks_dir, force=True, fail_fast=True,
                                                 apt_refresh=a.apt_refresh)
                outcomes = build(matrix, group, options)
                bad = [o for o in outcomes if o.state != "built"]
                if bad or not outcomes:
                    a.state = "failed"
                    a.message = "; ".join(f"{o.state}: {o.message}" for o in bad) or "not built"
                    continue
                a.state = "built"
                planned = [o.planned for o in outcomes if o.planned is not None]
                results = publish_fn(matrix, planned, allow_cpu_smoke=allow_cpu_smoke,
                                     dry_run=False, manifest=manifest, locks_dir=locks_dir,
                                 trust=trust)
                result = results[0] if results else {"status": "refused", "reason": "no result"}
                if result.get("status") != "published":
                    a.state, a.message = "failed", f"publish: {result.get('reason', '')}"
                    continue
                a.state = "published"
                a.message = ", ".join(result.get("tags", []))
                record_reasons(result, a, findings)
                a.changelog = changelog(pubs.get(a.variant_id), outcomes[0])
                a.delta_bytes, a.image_bytes = download_delta(pubs.get(a.variant_id), result)
            except BuilderError as exc:
                a.state, a.message = "failed", str(exc)
    return actions


REBUILD_TYPE = "application/vnd.torch-images.rebuild+json"


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
        reg.push_artifact(result["repository"], subject, REBUILD_TYPE,
                          (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode(),
                          kind="rebuild", title="rebuild.json")
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


__all__ = ["Action", "Finding", "check", "exit_code", "rebuild", "source_summary",
           "upgrade_packages"]
