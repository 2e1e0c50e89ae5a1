"""`builder build`: the selected variants planned, then each one through the same steps.

  prepare   runnable here, locks current (--relock), BuildKit, bases (builder.flows.bases:
            a bootstrapped one from the registry, signed, when absent here), the plan
  per variant, one record (`Outcome`: planned → built → staged) through STEPS in order:
    local      up to date here: the local image's id
    context    to build: the build context (sets, uv, facts, smoke suite, Dockerfile)
    build      to build: BuildKit, from the registry's cache only when its signature verified
               (builder.stages.signed_cache) → image id, size
    evidence   which of smoke report and SBOM this image id still lacks in the state folder (a
               reproducible rebuild gives the same id: its evidence is reused, by `rebuild`
               too); --resmoke (and `builder build --force`) make them again
    smoke      the smoke suite (an image whose id has no passing report)
    sbom       the SBOM (likewise)
    same_again --stage --verify-reproducible: a new image built again with no cache must give
               the same id (builder.flows.same_again)
    stage      --stage: image, build cache (signed with --key), base and evidence in the
               staging registry
    summarize  the smoke summary and SBOM size for the table and --json
A failed variant leaves existing images and tags as they were, does not stop the others unless
--fail-fast, and makes the exit code non-zero. A file lock keeps two builds on one machine from
racing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from builder.core import engine, keypair, limits, reproducible, state
from builder.core.errors import BuilderError
from builder.core.output import human_bytes, step
from builder.flows import bases
from builder.flows import same_again as same_again_check
from builder.model import lockfile, platforms, rendered, smokereport
from builder.model.bases import registry_served
from builder.model.matrix import Matrix, Variant
from builder.model.planned import PlannedVariant
from builder.stages import base, build, locks, plan, render, signed_cache, smoketest, staging
from builder.stages.wheelhouse import Wheelhouse

OK = ("built", "up-to-date")


@dataclass(frozen=True, kw_only=True)
class BuildOptions:
    """What a build was asked for: `builder build` makes it from its arguments
    (commands/build.py), `rebuild` passes its own."""

    locks: Path = Path("locks")
    force: bool = False  # build even up-to-date variants (evidence by id still reused)
    relock: bool = False
    fail_fast: bool = False
    smoke: bool = True
    sbom: bool = True
    resmoke: bool = False  # smoke and SBOM again even where this image id has them
    stage: bool = False
    require_gpu: bool = False
    apt_refresh: str = ""
    registry_cache: bool = True  # --cache-from the registry's cache image of the variant
    verify_reproducible: bool = False  # --stage: a cache-free rebuild gives the same id first
    key: keypair.SigningKey | None = None  # signs the evidence attached at staging
    keyless: keypair.KeylessSigner | None = None  # an OIDC token: signs a kept base keylessly
    # who a base or cache taken from the registry must be signed by (no key: `key`'s own)
    trusted: keypair.Vouchers = keypair.NOBODY

    @property
    def cache_vouchers(self) -> keypair.Vouchers:
        """Who a registry base or build cache must be signed by: the trusted keys (else the
        signing key's own) and identities."""
        if self.trusted.keys or self.key is None:
            return self.trusted
        return replace(self.trusted, keys=(self.key.public,))

    def base_options(self) -> bases.BaseOptions:
        """What the bases are lent: who vouches, the key a staged base is signed with."""
        return bases.BaseOptions(self.cache_vouchers, self.key if self.stage else None,
                                 self.registry_cache, self.keyless if self.stage else None)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """One planned variant's record through the steps: built (image id, size, smoke report,
    SBOM), then staged (`message`: the staged reference)."""

    variant_id: str
    state: str  # build (planned) | built | up-to-date | failed | smoke-failed | skipped
    image: str = ""
    image_id: str = ""
    size: int = 0
    seconds: float = 0.0
    message: str = ""
    report: dict | None = field(default=None, repr=False)
    sbom_path: str = ""
    planned: PlannedVariant | None = field(default=None, repr=False, compare=False)
    smoke: str = "-"  # smokereport.summary of its report: `pass (3 CPU stand-ins, …)`, `FAIL: x`
    sbom_components: int | None = None
    missing: tuple[str, ...] = field(default=(), repr=False, compare=False)  # evidence to make
    reused: tuple[str, ...] = ()  # evidence this state folder held for the new image's id
    started: float = field(default=0.0, repr=False, compare=False)
    started_on: str = field(default="", repr=False, compare=False)  # UTC, for the provenance

    def as_json(self) -> dict[str, Any]:
        internal = ("report", "planned", "missing", "started", "started_on")
        return {k: v for k, v in self.__dict__.items() if k not in internal}


@dataclass(frozen=True)
class Run:
    """What every step of one build reads: the matrix, the options, the shared wheelhouse."""

    matrix: Matrix
    options: BuildOptions
    wheelhouse: Wheelhouse
    base_pins: Mapping[str, str] = field(default_factory=dict)  # bases.Bases.pins


Step = Callable[[Run, Outcome], Outcome]


def build_images(matrix: Matrix, variants: list[Variant], options: BuildOptions) -> list[Outcome]:
    """Plan the variants, then take each through STEPS. Variants of a platform this host cannot
    run are skipped, with the command that enables it."""
    variants, skipped = runnable(variants)
    if not variants:
        return skipped
    planned, pins = prepare(matrix, variants, options)
    run = Run(matrix, options, Wheelhouse(), pins)
    todo = [p for p in planned if p.state == "build" or options.force]
    step(f"{len(todo)} of {len(planned)} variants to build"
         + ("" if todo else ": everything is up to date"))
    outcomes: list[Outcome] = []
    for p in planned:
        outcome = Outcome(variant_id=p.variant.key, state="build", image=p.local_image,
                          planned=p) if p in todo else \
            Outcome(variant_id=p.variant.key, state="up-to-date", image=p.local_image,
                    message=p.where, planned=p)
        outcome = through_steps(run, outcome)
        outcomes.append(outcome)
        if outcome.state not in OK and options.fail_fast:
            break
    return outcomes + skipped


def through_steps(run: Run, outcome: Outcome) -> Outcome:
    """One variant's record through every step, in order (each passes over a record it has
    nothing to do for)."""
    for each in STEPS:
        outcome = each(run, outcome)
    return outcome


def prepare(matrix: Matrix, variants: list[Variant],
            options: BuildOptions) -> tuple[list[PlannedVariant], dict[str, str]]:
    """Locks current (re-locked with --relock), BuildKit there, every base made: the plan, and
    the verified references of the bases the registry serves (bases.Bases.pins)."""
    if options.relock:
        stale = [v for v in variants if not lockfile.is_current(options.locks, v)]
        locks.lock_all(matrix, stale, options.locks, progress=step)
    for v in variants:  # a missing or stale lock fails now, not after the bases are made
        lockfile.require_lock(options.locks, v)
    build.ensure_buildkit()
    renders = [render.render_locked(matrix, v, options.locks) for v in variants]
    if built := already_built(matrix, variants, renders):
        return built, {}
    made = bases.ensure_all(matrix, variants, options.base_options())
    return plan.make_plan(matrix, renders, made.digests, check_registry=False), made.pins


def already_built(matrix: Matrix, variants: list[Variant],
                  renders: list[rendered.Rendered]) -> list[PlannedVariant] | None:
    """The plan when every (native) variant is up to date on the bases already here: an image
    is identified by the base digest it was built from, not by the day, so a build after
    midnight UTC does not bootstrap a new day's base (possibly with newer packages) only to
    rebuild what it has (`rebuild --check`'s `base-moved` says when a newer base is out).
    None when something is to be built: then the day's bases are made first."""
    if any(registry_served(v) for v in variants):
        return None
    planned = plan.make_plan(matrix, renders, base.known_digests(variants, matrix),
                             check_registry=False)
    return planned if all(p.state == "up-to-date" for p in planned) else None


# ---- the steps of one variant, in order -------------------------------------------------------


def local_image(run: Run, o: Outcome) -> Outcome:
    """An image up to date here: its id, so that the evidence step makes what this state
    folder lacks for it (built by another checkout, by a test, or with --no-smoke) and up to
    date always means ready to stage and publish."""
    if o.state != "up-to-date" or o.message != "local":
        return o
    info = engine.inspect_image(o.image)
    return o if info is None else replace(o, image_id=info["Id"])


def context(run: Run, o: Outcome) -> Outcome:
    """Disk space, then the shared build context filled for this variant."""
    if o.state != "build":
        return o
    p = planned_of(o)
    o = replace(o, started=time.monotonic(), started_on=build.utc_now())
    try:
        engine.ensure_disk(state.root(), build.NEED_GB[p.variant.accelerator])
        step(f"  [{o.variant_id}] wheels")
        uv = render.uv_requirements()
        sets = [(s.source, s.requirements,
                 tuple(run.wheelhouse.source_wheels(p.variant, s.find_links, s.requirements)))
                for s in p.rendered.steps]
        sets.append((render.uv_source(p.variant.platform), uv,
                     tuple(run.wheelhouse.ensure(p.variant, uv, progress=step))))
        build.prepare_context(build.Context(
            key=p.variant.key, sets=tuple(sets), facts=(p.rendered.facts_source,
                                         rendered.facts_json(p.rendered.facts)),
            smoke_dir=rendered.SMOKE_SOURCE, dockerfile=p.rendered.dockerfile,
            dockerignore=p.rendered.dockerignore),
            run.wheelhouse.link_set)
    except BuilderError as exc:
        return failed(o, exc)
    return o


def spec_of(run: Run, o: Outcome) -> build.Spec:
    """The BuildKit build of the variant, as step `buildkit` runs it (and `same_again` again)."""
    p = planned_of(o)
    return build.Spec(
        key=o.variant_id, image=p.local_image, platform=p.variant.platform,
        labels=build.build_labels(lockfile.lock_paths(run.options.locks, p.variant),
                                  p.base_digest, p.content_hash, p.lock_hash),
        context=state.root() / "context",
        dockerfile=state.root() / "rendered" / p.variant.key / "Dockerfile",
        log=state.path("logs") / f"{o.variant_id}.log", apt_refresh=run.options.apt_refresh,
        base_image=run.base_pins.get(platforms.base_key(p.variant.base.image,
                                                        p.variant.platform), ""))


def same_again(run: Run, o: Outcome) -> Outcome:
    """Step `same_again` (--stage --verify-reproducible): a new image is built again with no
    cache and must give the same id before it is staged (builder.flows.same_again)."""
    if o.state != "built" or not (run.options.stage and run.options.verify_reproducible):
        return o
    try:
        same_again_check.check(spec_of(run, o), o.image_id)
    except BuilderError as exc:
        return failed(o, exc)
    return o


def buildkit(run: Run, o: Outcome) -> Outcome:
    """The BuildKit build (from the registry's cache), its config made reproducible."""
    if o.state != "build":
        return o
    p, spec = planned_of(o), spec_of(run, o)
    if registry_served(p.variant) and not spec.base_image:  # never FROM the movable tag
        return failed(o, BuilderError(f"no verified base reference for {o.variant_id}"))
    step(f"  [{o.variant_id}] building (log: {spec.log})")
    try:
        cache = signed_cache.choose(run.matrix, build.cache_ref(run.matrix, p.local_image),
                                    run.options.cache_vouchers,
                                    wanted=run.options.registry_cache)
        step(f"  [{o.variant_id}] {cache.line}")
        image_id = build.build_from_registry_cache(spec, list(cache.refs))
        image_id = reproducible.normalise_image(image_id, p.local_image,
                                                keep=build.cache_ref(run.matrix, p.local_image))
    except BuilderError as exc:
        return failed(o, exc)
    info = engine.inspect_image(image_id) or {}
    if problem := build.base_layer_problem(p.variant, p.base_digest,
                                           (info.get("RootFS") or {}).get("Layers") or []):
        for ref in (p.local_image, build.cache_ref(run.matrix, p.local_image)):
            engine.remove_image(ref)  # its content hash must not find it up to date
        return failed(o, BuilderError(problem))
    build.record_times(image_id, o.started_on)
    o = replace(o, state="built", image_id=image_id, size=int(info.get("Size", 0)),
                seconds=time.monotonic() - o.started)
    step(f"  [{o.variant_id}] built {o.image} ({human_bytes(o.size)}, {o.seconds:.0f} s)")
    return o


EVIDENCE = {"smoke": "smoke report", "sbom": "SBOM"}


def evidence(run: Run, o: Outcome) -> Outcome:
    """Which evidence to make for the image id: what this state folder holds for it (a smoke
    report that passes under this run's --require-gpu, a readable SBOM) describes these very
    bytes, so a rebuild that gave the same id (builds are reproducible) reuses it instead of
    smoking the image twice (`rebuild`, which forces the build, too); --resmoke makes it all
    again (`builder build --force` asks for it)."""
    if o.state not in OK or not o.image_id:
        return o
    wanted = tuple(k for k in EVIDENCE if getattr(run.options, k))
    again = run.options.resmoke
    missing = wanted if again else tuple(k for k in wanted if not held(run, k, o.image_id))
    reused = tuple(k for k in wanted if k not in missing) if o.state == "built" else ()
    named = " and ".join(EVIDENCE[k] for k in (reused or missing))
    if reused:
        step(f"  [{o.variant_id}] reused the {named} this state folder holds for image id "
             f"{o.image_id[:19]} (again with --resmoke)")
    elif missing and o.state == "up-to-date":
        step(f"  [{o.variant_id}] up to date, but "
             + (f"--resmoke: making its {named} again" if again
                else f"no usable {named} in {state.root()}: making it"))
    return replace(o, missing=missing, reused=reused)


def held(run: Run, kind: str, image_id: str) -> bool:
    """Whether this state folder holds usable `kind` evidence for the image id."""
    doc = _read_json(state.evidence_path(kind, image_id))
    if kind == "sbom" or doc is None:
        return doc is not None
    return smokereport.report_passed(doc, require_gpu=run.options.require_gpu)[0]


def smoke(run: Run, o: Outcome) -> Outcome:
    """The smoke suite in the image; a failed report is the `smoke-failed` state."""
    if "smoke" not in o.missing or not o.image_id:
        return o
    step(f"  [{o.variant_id}] smoke")
    require_gpu = run.options.require_gpu
    report = smoketest.run_smoke(o.image, require_gpu=require_gpu, gpus=None, report_path=None)
    passed, why = smokereport.report_passed(report, require_gpu=require_gpu)
    return replace(o, report=report) if passed else replace(
        o, report=report, state="smoke-failed", message=why)


def sbom(run: Run, o: Outcome) -> Outcome:
    """The image's SBOM, generated, validated and kept by image id."""
    if "sbom" not in o.missing or not o.image_id:
        return o
    step(f"  [{o.variant_id}] sbom")
    return replace(o, sbom_path=str(write_image_sbom(o.image_id, o.image)))


def stage(run: Run, o: Outcome) -> Outcome:
    """--stage: the image by digest in the staging repository with its evidence attached
    there (signed with --key), its build cache and its base, so that any other machine can
    smoke, describe, publish or reproduce it."""
    if not (run.options.stage and o.state in OK and o.image_id):
        return o
    p, matrix = planned_of(o), run.matrix
    step(f"  [{o.variant_id}] staging in {matrix.staging_registry}/{matrix.staging_repository}")
    files = {kind: path.read_bytes() for kind in ("smoke", "sbom")
             if (path := state.evidence_path(kind, o.image_id)).is_file()}
    staged = staging.stage(matrix, o.image_id, p.hash_tag, evidence_files=files,
                           key=run.options.key, cache=build.cache_ref(matrix, p.local_image),
                           base=base.registry_copy(matrix, p.variant, p.base_digest),
                           label=o.variant_id)
    return replace(o, message=staged.reference)


def summarize(run: Run, o: Outcome) -> Outcome:
    return summarized(o)


STEPS: tuple[Step, ...] = (local_image, context, buildkit, evidence, smoke, sbom, same_again,
                          stage, summarize)


# ---- helpers ----------------------------------------------------------------------------------


def planned_of(o: Outcome) -> PlannedVariant:
    assert o.planned is not None
    return o.planned


def failed(o: Outcome, exc: BuilderError) -> Outcome:
    step(f"  [{o.variant_id}] FAILED: {exc}" + (f"\n{exc.hint}" if exc.hint else ""))
    return replace(o, state="failed", seconds=time.monotonic() - o.started, message=str(exc))


def summarized(outcome: Outcome) -> Outcome:
    """The outcome with its smoke summary and SBOM component count for the table and --json,
    from this run's evidence or the stored one."""
    from sbom.diff import component_total

    report, sbom_path = outcome.report, outcome.sbom_path
    if outcome.image_id:
        report = report or _read_json(state.evidence_path("smoke", outcome.image_id))
        sbom_path = sbom_path or str(state.evidence_path("sbom", outcome.image_id))
    sbom_doc = _read_json(Path(sbom_path)) if sbom_path else None
    return replace(outcome, report=report, smoke=smokereport.summary(report),
                   sbom_path=sbom_path if sbom_doc else "",
                   sbom_components=component_total(sbom_doc) if sbom_doc else None)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = limits.parse_json(path.read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def write_image_sbom(image_id: str, image: str) -> Path:
    """Generate (validated) and store the SBOM of a built image, keyed by image id."""
    import sbom as sbom_lib

    doc = sbom_lib.generate(image, reproducible=True)
    target = state.evidence_path("sbom", image_id)
    sbom_lib.write(doc, target)
    return target


def runnable(variants: list[Variant]) -> tuple[list[Variant], list[Outcome]]:
    """The variants this host can bootstrap, build and smoke-test, and a `skipped` outcome for
    each of the others (one line per platform says why and what enables it)."""
    why = {name: platforms.cannot_run(name) for name in {v.platform for v in variants}}
    for name, reason in sorted(why.items()):
        if reason:
            count = sum(v.platform == name for v in variants)
            step(f"{name}: {count} variant{'s' * (count != 1)} skipped: {reason}")
    return ([v for v in variants if not why[v.platform]],
            [Outcome(variant_id=v.key, state="skipped",
                     message=f"no emulation: {platforms.ENABLE_EMULATION}")
             for v in variants if why[v.platform]])


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """One build at a time per state folder; a second run waits and says so."""
    path = state.path() / "build.lock"
    try:
        fh = path.open("a+")
    except OSError as exc:
        raise state.path_error(path, exc, hint="BUILDER_STATE must name a folder this user can "
                               "write (default: .state)") from None
    with fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            step(f"another `builder build` holds {path}; waiting for it to finish…")
            fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
