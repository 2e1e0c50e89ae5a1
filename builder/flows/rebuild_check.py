"""`builder rebuild --check`: ask five sources whether a published image must be rebuilt.

For each variant the registry records as published (its latest publication,
builder.flows.record) five sources are asked:

  debian-security  `apt list --upgradable` inside the published image (as root, after an update)
  python-vuln      pip-audit on the variant's lock: vulnerabilities that have a fixed version
                   (torch itself is pinned by the matrix: reported as `matrix-change`)
  base-moved       the base's digest now vs the image's `org.opencontainers.image.base.digest`
  inputs-changed   the plan's content hash (with the published base) vs the image's label
  tag-drift        floating tag, aliases, twins vs the newest signed publication (`repair`)

Each source is one small function over the published variant (`Subject`); one ladder in
`check_variant` asks them. A source that cannot be asked is reported as `unknown` with its
error, never as clean. `--skip-source NAME` (repeatable) does not ask that source at all; it is
reported as `skipped` (the --json `sources` map and `skipped` list, and the human summary), never
as clean. `--check` exits 0 when nothing needs rebuilding, 1 when something does, 2 when a source
is unknown. What is done about the findings is `builder.flows.rebuild`.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from builder.core import clock, engine, labels, oci, proc, sign, vouch
from builder.core.errors import BuilderError, ConfigError
from builder.core.keypair import NOBODY, Vouchers
from builder.core.output import step
from builder.flows import bases, record, resign, tag_repair
from builder.model import lockfile, platforms
from builder.model.apt import apt_token, parse_upgradable
from builder.model.bases import registry_served
from builder.model.matrix import Matrix, Variant
from builder.model.publication import Publication
from builder.stages import base, plan, render

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

# Status of a finding: rebuild (this tool fixes it), matrix-change (a person must: torch CVE),
# repair (`builder publish` re-points the tags, no rebuild), unknown (could not be asked).
REBUILD, MATRIX_CHANGE, REPAIR, UNKNOWN = "rebuild", "matrix-change", "repair", "unknown"


@dataclass(kw_only=True)
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


def latest_publications(matrix: Matrix, vouchers: Vouchers = NOBODY) -> dict[str, Publication]:
    """variant id → its latest publication, as the registry records it (builder.flows.record:
    with `vouchers`, only publications whose signature verifies count)."""
    return record.latest(matrix, vouchers)


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
    pins = lockfile.parse_pins(lock_path.read_text())
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
        name = lockfile.normalize(dep.get("name", ""))
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
    rendered = render.render_locked(matrix, variant, locks_dir)
    return plan.plan_variant(matrix, rendered, base_digest, smoke_hash).content_hash


# ---- the check --------------------------------------------------------------------------------


def _unknown(vid: str, reason: str, exc: Exception) -> Finding:
    return Finding(variant_id=vid, reason=reason, status=UNKNOWN, detail=str(exc))


def signature_problem(pub: Publication, vouchers: Vouchers) -> str:
    """Why the published digest must not be run ('' when it is vouched for, or published
    unsigned while nobody is trusted)."""
    if not vouchers:
        return "signed: give --trust-key or an identity to verify it first" if pub.signed else ""
    name, _, digest = pub.reference.partition("@")
    registry, _, repository = name.partition("/")
    try:
        vouch.verify_image(oci.Registry(registry), repository, digest, vouchers)
    except sign.SignatureError as exc:
        return f"not run: its signature does not verify ({exc})"
    return ""


@dataclass(kw_only=True)
class Subject:
    """One published variant as every source sees it; `image` and `image_labels` are set when a
    source that reads the image is asked and the image could be had (else `image_error`)."""

    matrix: Matrix
    variant: Variant
    pub: Publication
    locks_dir: Path
    smoke_hash: str
    base_digests: dict[str, str]  # base key → its digest now, shared by the checked variants
    vouchers: Vouchers = NOBODY
    image: str = ""
    image_labels: dict[str, str] = field(default_factory=dict)
    image_error: BuilderError | None = None

    @property
    def published_base(self) -> str | None:
        return self.image_labels.get(BASE_DIGEST_LABEL) or None


def ask_debian(s: Subject) -> list[Finding]:
    """(a) Debian updates inside the published image."""
    upgradable = debian_upgradable(s.image)
    if not upgradable:
        return []
    return [Finding(variant_id=s.variant.id, reason="debian-security", status=REBUILD,
                    detail=", ".join(f"{n} {o}→{nw}" for n, (o, nw) in upgradable.items()),
                    data={"packages": {n: {"old": o, "new": nw}
                                       for n, (o, nw) in upgradable.items()},
                          "token": apt_token(upgradable, clock.stamp())})]


def ask_python(s: Subject) -> list[Finding]:
    """(b) Python vulnerabilities with a fix; torch's are a matrix change, unknowns stay
    unknown."""
    audit = audit_lock(lockfile.lock_paths(s.locks_dir, s.variant)[0])
    findings = []
    for v in audit["vulns"]:
        if not v["fix_versions"]:
            continue
        pinned = v["name"] == "torch"
        findings.append(Finding(
            variant_id=s.variant.id, reason="python-vuln",
            status=MATRIX_CHANGE if pinned else REBUILD,
            detail=f"{v['name']} {v['version']}: {v['id']} fixed in {', '.join(v['fix_versions'])}"
            + (" (torch is pinned: change the matrix)" if pinned else ""), data=v))
    for u in audit["unknown"]:
        findings.append(Finding(variant_id=s.variant.id, reason="python-vuln", status=UNKNOWN,
                                detail=f"{u['name']} {u['version']}: {u['reason']}", data=u))
    return findings


def base_now(s: Subject) -> str:
    """The base's digest today, asked once per base and platform."""
    variant = s.variant
    key = platforms.base_key(variant.base.image, variant.platform)
    if key not in s.base_digests:
        s.base_digests[key] = (base_digest_now(variant)
                               if variant.platform == platforms.DEFAULT
                               else foreign_base_now(s))
    return s.base_digests[key]


def foreign_base_now(s: Subject) -> str:
    """Off linux/amd64: a bootstrapped base's digest today, read or made without writing to
    the registry; a pulled ref's is BuildKit's (unknown)."""
    suite = registry_served(s.variant)
    if suite is None:
        return "unknown"
    try:
        return bases.foreign_digest_now(s.matrix, suite, platforms.get(s.variant.platform),
                                        s.vouchers, step)
    except BuilderError as exc:
        raise SourceError(f"base {s.variant.base.image} ({s.variant.platform}): {exc}") from None


def ask_base(s: Subject) -> list[Finding]:
    """(c) The base digest moved since the image was built."""
    now, published = base_now(s), s.published_base
    if not published:
        return [Finding(variant_id=s.variant.id, reason="base-moved", status=UNKNOWN,
                        detail=f"{s.image} has no {BASE_DIGEST_LABEL} label")]
    if now == published:
        return []
    return [Finding(variant_id=s.variant.id, reason="base-moved", status=REBUILD,
                    detail=f"{s.variant.base.image}: {published[:19]}→{now[:19]}",
                    data={"old": published, "new": now})]


def ask_drift(s: Subject) -> list[Finding]:
    """(e) Tags moved off the newest signed publication (tag_repair.drift), once per variant;
    first, a newer publication whose `.sig` is lost but has a signed copy (resign.lost)."""
    top = latest_publications(s.matrix, s.vouchers).get(s.variant.id)
    first = top.platforms[0].platform if top and top.platforms else platforms.DEFAULT
    if top is None or s.variant.platform != first:
        return []
    if lost := resign.lost(s.matrix, top.floating_tag, s.variant.id, top, s.vouchers):
        return [Finding(variant_id=s.variant.id, reason="tag-drift", status=REPAIR,
                        detail=resign.lost_line(lost[0]), data=resign.lost_data(lost[0]))]
    moving = [top.floating_tag, *plan.aliases_of(s.matrix, s.variant)]
    moved = tag_repair.drift(oci.Registry(top.registry), top, moving, s.vouchers)
    return [Finding(variant_id=s.variant.id, reason="tag-drift", status=REPAIR,
                    detail=f"`{tag}` points at {was[:19] or 'nothing'}, not {want[:19]} "
                    f"(`{top.dated_tag}`): `builder publish` repairs it",
                    data={"tag": tag, "old": was, "new": want}) for tag, was, want in moved]


def ask_inputs(s: Subject) -> list[Finding]:
    """(d) Inputs changed: the content hash on the published base, so a moved base is not
    counted twice. The detail names the Python packages whose pin moved (the published SBOM
    against the lock now) before the hashes."""
    have = s.image_labels.get(labels.CONTENT_HASH) or s.pub.content_hash
    want = planned_hash(s.matrix, s.variant, s.locks_dir, s.published_base, s.smoke_hash)
    if want == have:
        return []
    moved = pins_moved(s)
    named = ", ".join(f"{n} {o}→{w}" for n, (o, w) in moved.items())
    return [Finding(variant_id=s.variant.id, reason="inputs-changed", status=REBUILD,
                    detail=(f"{named}; " if named else "")
                    + f"content hash {have[:12] or '(none)'}→{want[:12]}",
                    data={"old": have, "new": want,
                     "packages": {n: {"old": o, "new": w} for n, (o, w) in moved.items()}})]


def pins_moved(s: Subject) -> dict[str, tuple[str, str]]:
    """name → (published, locked now) for each Python package whose version moved: the
    published SBOM's PyPI components against the variant's lock ({} when either is missing)."""
    from sbom.diff import iter_components

    try:
        doc = artifact_json_by_digest(s.pub.registry, s.pub.repository, s.pub.sbom.digest)
        lock = lockfile.require_lock(s.locks_dir, s.variant)
    except (BuilderError, ValueError, KeyError, IndexError):
        return {}
    old = {lockfile.normalize(c.get("name", "")): str(c.get("version", ""))
           for c in iter_components(doc) if str(c.get("purl", "")).startswith("pkg:pypi/")}
    now = lockfile.parse_pins(lock.text)
    return {name: (old[name], version) for name, version in sorted(now.items())
            if name in old and old[name] != version}


def artifact_json_by_digest(registry: str, repository: str, digest: str) -> dict[str, Any]:
    """The JSON payload of a one-layer OCI artifact, by its manifest digest."""
    reg = oci.Registry(registry)
    found = reg.manifest(repository, digest)
    if found is None:
        raise ValueError(f"`{repository}@{digest}` is not in the registry")
    return json.loads(reg.blob(repository, json.loads(found[0])["layers"][0]["digest"]))


@dataclass(frozen=True)
class Source:
    ask: Callable[[Subject], list[Finding]]
    needs_image: bool = True  # reads the published image: unknown when it cannot be had
    runs_image: bool = False  # runs it: only once its signature verifies


# In the order they are asked and reported.
SOURCES: dict[str, Source] = {
    "debian-security": Source(ask_debian, runs_image=True),
    "python-vuln": Source(ask_python, needs_image=False),
    "base-moved": Source(ask_base),
    "inputs-changed": Source(ask_inputs),
    "tag-drift": Source(ask_drift, needs_image=False),
}
REASONS = tuple(SOURCES)


def ask(reason: str, s: Subject) -> list[Finding]:
    """The one ladder every source goes through: no image, or an image that must not run, or a
    source that fails is `unknown` (never clean); else the source's own findings."""
    source = SOURCES[reason]
    if source.needs_image and s.image_error is not None:
        return [_unknown(s.variant.id, reason, s.image_error)]
    if source.runs_image and (untrusted := signature_problem(s.pub, s.vouchers)):
        return [Finding(variant_id=s.variant.id, reason=reason, status=UNKNOWN, detail=untrusted)]
    try:
        return source.ask(s)
    except BuilderError as exc:
        return [_unknown(s.variant.id, reason, exc)]


def check_variant(matrix: Matrix, variant: Variant, pub: Publication, locks_dir: Path,
                  smoke_hash: str, base_digests: dict[str, str],
                  skip: frozenset[str] = frozenset(), vouchers: Vouchers = NOBODY
                  ) -> list[Finding]:
    """Ask each source not in `skip` about one published variant (the image is looked up
    once, for the sources that read it)."""
    asked = [reason for reason in REASONS if reason not in skip]
    s = Subject(matrix=matrix, variant=variant, pub=pub, locks_dir=locks_dir,
                smoke_hash=smoke_hash, base_digests=base_digests, vouchers=vouchers)
    if any(SOURCES[reason].needs_image for reason in asked):
        try:
            s.image, info = published_image(pub)
            s.image_labels = (info.get("Config") or {}).get("Labels") or {}
        except BuilderError as exc:
            s.image_error = exc
    return [finding for reason in asked for finding in ask(reason, s)]


def check(matrix: Matrix, variants: list[Variant], *,
          locks_dir: Path = Path("locks"), skip: Collection[str] = (),
          vouchers: Vouchers = NOBODY) -> list[Finding]:
    """Findings for the selected variants the registry records a publication of; the sources
    in `skip` are not asked (see `source_summary`: they are `skipped`, not clean)."""
    if unknown_names := set(skip) - set(REASONS):
        raise ConfigError(f"unknown source {', '.join(sorted(unknown_names))}",
                          hint=f"sources: {', '.join(REASONS)}")
    skipped = frozenset(skip)
    pubs = latest_publications(matrix, vouchers)
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
                                  vouchers)
    return findings


def source_summary(findings: list[Finding], skip: Collection[str] = ()) -> dict[str, str]:
    """source → skipped | unknown | rebuild | matrix-change | clean, over the checked variants
    (the worst status wins; `clean` only for a source that was asked)."""
    order = (UNKNOWN, REBUILD, MATRIX_CHANGE, REPAIR)
    out: dict[str, str] = {}
    for reason in REASONS:
        statuses = {f.status for f in findings if f.reason == reason}
        out[reason] = "skipped" if reason in skip else next(
            (s for s in order if s in statuses), "clean")
    return out


def published_variants(matrix: Matrix, variants: list[Variant],
                       vouchers: Vouchers = NOBODY) -> list[Variant]:
    """The selected variants the registry records a publication of."""
    pubs = latest_publications(matrix, vouchers)
    known = {v.id for v in matrix.variants}
    for vid in sorted(set(pubs) - known):
        step(f"  {vid} is published in {matrix.image_name} but no longer in {matrix.path}: "
             "skipped")
    return [v for v in variants if v.id in pubs]


def exit_code(findings: list[Finding]) -> int:
    """1 whenever a source asks for a rebuild (or a matrix change), even when another could not
    be asked; 2 only when nothing was decided because sources could not be asked."""
    return 1 if any(f.status != UNKNOWN for f in findings) else 2 if findings else 0
