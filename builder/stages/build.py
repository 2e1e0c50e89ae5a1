"""`builder build`: turn the plan's `build` variants into images with BuildKit, then smoke + SBOM.

A failed variant leaves existing images and tags as they were (the engine tags only on success),
does not stop the others unless --fail-fast, and makes the exit code non-zero. A file lock keeps
two builds on one machine from racing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import itertools
import os
import re
import shutil
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from builder.core import (
    engine,
    labels,
    limits,
    oci,
    proc,
    registry_auth,
    reproducible,
    sign,
    state,
)
from builder.core.errors import BuilderError, CommandFailed, EngineError
from builder.core.output import human_bytes, step
from builder.model import bases, lockfile, platforms
from builder.model.lockfile import lock_paths
from builder.model.matrix import Matrix, Variant
from builder.model.rendered import SMOKE_SOURCE, facts_json
from builder.stages import base, locks, plan, render
from builder.stages.wheelhouse import Wheelhouse, local_wheels

NEED_GB = {"cpu": 4, "cuda": 12}  # a new CUDA variant: ~7 GB of layers + ~5 GB of wheel cache


@dataclass(frozen=True)
class BuildOptions:
    """What a build was asked for: `builder build` makes it from its arguments
    (commands/build.py), `rebuild` passes its own."""

    locks: Path = Path("locks")
    force: bool = False
    relock: bool = False
    fail_fast: bool = False
    smoke: bool = True
    sbom: bool = True
    stage: bool = False
    require_gpu: bool = False
    apt_refresh: str = ""
    registry_cache: bool = True  # --cache-from the registry's cache image of the variant
    key: sign.SigningKey | None = None  # signs the evidence attached at staging


@dataclass(frozen=True)
class Outcome:
    """The built artifact of one planned variant: its image (by id), smoke report and SBOM."""

    variant_id: str
    state: str  # built | up-to-date | failed | smoke-failed | skipped (platform not runnable)
    image: str = ""
    image_id: str = ""
    size: int = 0
    seconds: float = 0.0
    message: str = ""
    report: dict | None = field(default=None, repr=False)
    sbom_path: str = ""
    planned: plan.PlannedVariant | None = field(default=None, repr=False, compare=False)
    smoke: str = "-"  # smoketest.summary of its report: `pass (3 CPU stand-ins, …)`, `FAIL: x`
    sbom_components: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("report", "planned")}


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


def ensure_buildkit() -> None:
    info = engine.ensure_engine()
    version = str(info.get("ServerVersion", "0"))
    major_minor = tuple(int(x) for x in version.split("+")[0].split(".")[:2] if x.isdigit())
    if major_minor < (18, 9):
        raise EngineError(f"the engine at {engine.engine_address()} is Docker {version}; BuildKit "
                          "needs 18.09 or newer", hint="upgrade the engine")


def git(*args: str) -> str:
    """git's answer, or "" where there is none (no git, not a checkout): labels are optional."""
    try:
        result = proc.run(["git", *args], check=False)
    except BuilderError:  # git is not installed
        return ""
    return result.stdout.strip() if result.returncode == 0 else ""


def source_url() -> str:
    """The repository's public URL for `org.opencontainers.image.source`: CI's, else origin's
    when it is a URL (credentials dropped, scp-style `git@host:org/repo` made https); a local
    path is no source anyone else can open, so it gives no label."""
    server, repo = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    if server and repo:
        return f"{server.rstrip('/')}/{repo}"
    return public_url(git("remote", "get-url", "origin"))


def public_url(remote: str) -> str:
    scp = re.fullmatch(r"[\w.-]+@([\w.-]+):(?!//)(.+)", remote)
    if scp:
        remote = f"https://{scp.group(1)}/{scp.group(2)}"
    parts = urllib.parse.urlsplit(remote)
    if parts.scheme not in ("https", "http", "ssh", "git") or not parts.hostname:
        return ""
    host = parts.hostname + (f":{parts.port}" if parts.port and parts.scheme != "ssh" else "")
    return urllib.parse.urlunsplit(("https", host, parts.path.removesuffix(".git"), "", ""))


def created_time(variant: Variant, locks_dir: Path) -> str:
    """When the inputs were fixed (the lock's commit), not wall-clock: same inputs, same config."""
    txt, js = lock_paths(locks_dir, variant)
    committed = git("log", "-1", "--format=%cI", "--", str(txt))
    if committed:
        return dt.datetime.fromisoformat(committed).astimezone(dt.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
    mtime = js.stat().st_mtime
    return dt.datetime.fromtimestamp(mtime, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def build_labels(p: plan.PlannedVariant, locks_dir: Path) -> dict[str, str]:
    return {
        labels.OCI + "created": created_time(p.variant, locks_dir),
        labels.OCI + "revision": git("rev-parse", "HEAD") or "unknown",
        **({labels.OCI + "source": url} if (url := source_url()) else {}),
        labels.OCI + "base.digest": p.base_digest or "",
        labels.CONTENT_HASH: p.content_hash,
        labels.LOCK_HASH: p.lock_hash,
    }


def prepare_context(p: plan.PlannedVariant, wheelhouse: Wheelhouse) -> tuple[Path, Path]:
    """Fill the shared context with this variant's sets, uv, facts and smoke; write its
    Dockerfile. Only requirements and wheels of local folders go in the sets: the rest of the
    wheels reach the build through its cache mount, never through the context."""
    context = state.path("context")
    for s in p.rendered.steps:
        wheels = local_wheels(s.find_links, s.requirements)
        wheelhouse.link_set(context / s.source, s.requirements, wheels)
    uv = render.uv_requirements()
    wheelhouse.link_set(context / render.uv_source(p.variant.platform), uv,
                        wheelhouse.ensure(p.variant, uv, progress=step))
    state.atomic_write(context / p.rendered.facts_source, facts_json(p.rendered.facts))
    smoke = context / "smoke"
    if smoke.exists():
        shutil.rmtree(smoke)
    shutil.copytree(SMOKE_SOURCE, smoke, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dockerfile_dir = state.path("rendered", p.variant.key)
    state.atomic_write(dockerfile_dir / "Dockerfile", p.rendered.dockerfile)
    state.atomic_write(dockerfile_dir / "Dockerfile.dockerignore", p.rendered.dockerignore)
    return context, dockerfile_dir / "Dockerfile"


def cache_ref(matrix: Matrix, p: plan.PlannedVariant) -> str:
    """Where the staging repository keeps the variant's last build as BuildKit wrote it (its
    config carries the inline cache; its layers are the staged image's)."""
    tag = p.local_image.rsplit(":", 1)[1]
    return f"{matrix.staging_registry}/{matrix.staging_repository}:cache-{tag}"


def registry_cache(matrix: Matrix, p: plan.PlannedVariant) -> list[str]:
    """The cache image to build from, when the registry answers and holds one."""
    ref = cache_ref(matrix, p)
    try:
        found = oci.Registry(matrix.staging_registry, backoff=()).head(
            matrix.staging_repository, ref.rsplit(":", 1)[1])
    except BuilderError:
        return []
    return [ref] if found else []


def push_cache(matrix: Matrix, p: plan.PlannedVariant) -> None:
    """Push the cache image (config only, mostly: its layers are the staged image's)."""
    ref = cache_ref(matrix, p)
    if engine.inspect_image(ref) is None:
        return
    try:
        with registry_auth.docker_env(matrix.staging_registry) as env:
            engine.docker("push", ref, timeout=3600, env=env)
    except BuilderError as exc:
        step(f"  [{p.variant.key}] the cache image was not pushed ({exc}); the next cold "
             "build installs every layer again")


def docker_build(p: plan.PlannedVariant, image: str, context: Path, dockerfile: Path,
                 locks_dir: Path, log: Path, *, apt_refresh: str = "",
                 cache_from: list[str] | None = None) -> str:
    """Run the BuildKit build; returns the image id. Tags only on success."""
    iidfile = log.with_suffix(".iid")
    iidfile.unlink(missing_ok=True)
    argv = ["build", "--progress=plain", "-f", str(dockerfile), "--iidfile", str(iidfile),
            "-t", image]
    for key, value in build_labels(p, locks_dir).items():
        argv += ["--label", f"{key}={value}"]
    if ca := proc.host_ca_bundle():  # the install steps download: a secret, never a layer
        argv += ["--secret", f"id=ca,src={ca}"]
    if apt_refresh:
        argv += ["--build-arg", f"APT_REFRESH={apt_refresh}"]
    # A BuildKit that honours it (0.11+) fixes the config's times itself; 20.10's does not
    # (reproducible.normalise_image does it afterwards either way).
    argv += ["--build-arg", f"SOURCE_DATE_EPOCH={bases.SOURCE_DATE_EPOCH}"]
    # BuildKit's inline cache: a fresh runner pulls the unchanged layers the registry holds
    # (the cache image `stage_outcome` pushed) instead of installing them again.
    argv += ["--build-arg", "BUILDKIT_INLINE_CACHE=1"]
    argv += [a for ref in cache_from or [] for a in ("--cache-from", ref)]
    if p.variant.platform != platforms.DEFAULT:  # emulated unless the host is that platform
        argv += ["--platform", p.variant.platform]
    log.unlink(missing_ok=True)
    engine.docker(*argv, str(context), log=log, timeout=4 * 3600)
    return iidfile.read_text().strip()


# Docker 20.10's BuildKit may fail to export an image whose layers came lazily from an inline
# cache (moby/moby#41595): "failed to get layer sha256:…: layer does not exist".
LAZY_LAYER_FAILURE = "layer does not exist"


def build_from_registry_cache(p: plan.PlannedVariant, image: str, context: Path,
                              dockerfile: Path, locks_dir: Path, log: Path, *,
                              apt_refresh: str, cache_from: list[str]) -> str:
    """`docker_build` with the registry's cache. When the engine cannot export what it took
    from that cache: once more with it (the layers are local by then), then without it
    (slower, never wrong)."""
    attempts = [cache_from, cache_from, []] if cache_from else [[]]
    for cache, then in itertools.pairwise(attempts):
        try:
            return docker_build(p, image, context, dockerfile, locks_dir, log,
                                apt_refresh=apt_refresh, cache_from=cache)
        except CommandFailed:
            failure = log.read_text(errors="replace")[-4000:] if log.is_file() else ""
            if LAZY_LAYER_FAILURE not in failure:
                raise
        step(f"  [{p.variant.key}] this engine could not export the layers it took from the "
             "registry's cache (a Docker 20.10 BuildKit bug): building again "
             + ("with it" if then else "without it"))
    return docker_build(p, image, context, dockerfile, locks_dir, log, apt_refresh=apt_refresh,
                        cache_from=attempts[-1])


def build_variant(matrix: Matrix, p: plan.PlannedVariant, wheelhouse: Wheelhouse,
                  options: BuildOptions, after: Callable[[Outcome], Outcome]) -> Outcome:
    vid = p.variant.key
    image = p.local_image
    log = state.path("logs") / f"{p.variant.key}.log"
    start = time.monotonic()
    try:
        engine.ensure_disk(state.root(), NEED_GB[p.variant.accelerator])
        step(f"  [{vid}] wheels")
        context, dockerfile = prepare_context(p, wheelhouse)
        step(f"  [{vid}] building (log: {log})")
        image_id = build_from_registry_cache(
            p, image, context, dockerfile, options.locks, log, apt_refresh=options.apt_refresh,
            cache_from=registry_cache(matrix, p) if options.registry_cache else [])
        image_id = reproducible.normalise_image(image_id, image, keep=cache_ref(matrix, p))
    except BuilderError as exc:
        step(f"  [{vid}] FAILED: {exc}" + (f"\n{exc.hint}" if exc.hint else ""))
        return Outcome(vid, "failed", image, seconds=time.monotonic() - start, message=str(exc),
                       planned=p)
    info = engine.inspect_image(image_id) or {}
    outcome = Outcome(vid, "built", image, image_id, int(info.get("Size", 0)),
                      time.monotonic() - start, planned=p)
    step(f"  [{vid}] built {image} ({human_bytes(outcome.size)}, {outcome.seconds:.0f} s)")
    return after(outcome)


def post_build(options: BuildOptions) -> Callable[[Outcome], Outcome]:
    """Smoke and SBOM each new image (unless switched off); both are gates for publishing."""

    def run(outcome: Outcome) -> Outcome:
        return add_evidence(outcome, options, smoke=options.smoke, sbom=options.sbom)

    return run


def add_evidence(outcome: Outcome, options: BuildOptions, *, smoke: bool, sbom: bool) -> Outcome:
    """Smoke-test and describe the outcome's image (each when asked)."""
    if smoke:
        from builder.stages import smoketest

        step(f"  [{outcome.variant_id}] smoke")
        report = smoketest.run_smoke(outcome.image, require_gpu=options.require_gpu,
                                     gpus=None, report_path=None)
        passed, why = smoketest.report_passed(report, require_gpu=options.require_gpu)
        outcome = replace(outcome, report=report) if passed else replace(
            outcome, report=report, state="smoke-failed", message=why)
    if sbom:
        step(f"  [{outcome.variant_id}] sbom")
        sbom_path = write_image_sbom(outcome.image_id, outcome.image)
        outcome = replace(outcome, sbom_path=str(sbom_path))
    return outcome


def complete_evidence(outcome: Outcome, options: BuildOptions) -> Outcome:
    """An up-to-date local image that lacks its smoke report or SBOM in this state folder (built
    by another checkout, by a test, or with --no-smoke) gets them now, so that up to date
    always means ready to stage and publish."""
    info = engine.inspect_image(outcome.image)
    if info is None:
        return outcome
    outcome = replace(outcome, image_id=info["Id"])
    smoke = options.smoke and not state.evidence_path("smoke", outcome.image_id).is_file()
    sbom = options.sbom and not state.evidence_path("sbom", outcome.image_id).is_file()
    if smoke or sbom:
        missing = " and ".join(k for k, m in (("smoke report", smoke), ("SBOM", sbom)) if m)
        step(f"  [{outcome.variant_id}] up to date, but no {missing} in {state.root()}: "
             "making it")
    return add_evidence(outcome, options, smoke=smoke, sbom=sbom)


def summarized(outcome: Outcome) -> Outcome:
    """The outcome with its smoke summary and SBOM component count for the table and --json,
    from this run's evidence or the stored one."""
    from builder.stages import smoketest
    from sbom.diff import component_counts  # the count verify and the catalog give

    report, sbom_path = outcome.report, outcome.sbom_path
    if outcome.image_id:
        report = report or _read_json(state.evidence_path("smoke", outcome.image_id))
        sbom_path = sbom_path or str(state.evidence_path("sbom", outcome.image_id))
    sbom_doc = _read_json(Path(sbom_path)) if sbom_path else None
    return replace(outcome, report=report, smoke=smoketest.summary(report),
                   sbom_path=sbom_path if sbom_doc else "",
                   sbom_components=sum(component_counts(sbom_doc)[0].values()) if sbom_doc
                   else None)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        doc = limits.parse_json(path.read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def stage_outcome(matrix: Matrix, p: plan.PlannedVariant, outcome: Outcome,
                  key: sign.SigningKey | None = None) -> Outcome:
    """Push the image to the staging repository by digest and attach its smoke report and
    SBOM there (with their attestations signed by `key`), so that any other machine can smoke,
    describe or publish it."""
    from builder.stages import evidence

    step(f"  [{p.variant.key}] staging in {evidence.staging_registry(matrix)}/"
         f"{evidence.staging_repository(matrix)}")
    staged = evidence.stage(matrix, outcome.image_id, p.hash_tag)
    push_cache(matrix, p)
    base.push_to_registry(matrix, p.variant, p.base_digest)
    for kind in ("smoke", "sbom"):
        path = state.evidence_path(kind, outcome.image_id)
        if path.is_file():
            evidence.attach(staged, kind, path.read_bytes(), key=key)
    return replace(outcome, message=staged.reference)


def write_image_sbom(image_id: str, image: str) -> Path:
    """Generate (validated) and store the SBOM of a built image, keyed by image id."""
    import sbom

    doc = sbom.generate(image, reproducible=True)
    target = state.evidence_path("sbom", image_id)
    sbom.write(doc, target)
    return target


def build_images(matrix: Matrix, variants: list[Variant], options: BuildOptions) -> list[Outcome]:
    """Plan the variants, then build (and smoke, describe, stage) those not up to date. Variants
    of a platform this host cannot run are skipped, with the command that enables it."""
    variants, skipped = runnable(variants)
    if not variants:
        return skipped
    if options.relock:
        stale = [v for v in variants if not lockfile.is_current(options.locks, v)]
        locks.lock_all(matrix, stale, options.locks, progress=step)
    for v in variants:  # a missing or stale lock fails now, not after the bases are made
        lockfile.require_lock(options.locks, v)
    ensure_buildkit()
    digests: dict[str, str | None] = {}
    for v in variants:
        key = platforms.base_key(v.base.image, v.platform)
        if key not in digests:
            digests[key] = base.ensure_variant(matrix, v, progress=step)
    rendered = [render.render_locked(matrix, v, options.locks) for v in variants]
    planned = plan.make_plan(matrix, rendered, digests, check_registry=False)
    wheelhouse = Wheelhouse()
    outcomes: list[Outcome] = []
    todo = [p for p in planned if p.state == "build" or options.force]
    step(f"{len(todo)} of {len(planned)} variants to build"
         + ("" if todo else ": everything is up to date"))
    after = post_build(options)
    for p in planned:
        if p not in todo:
            outcome = Outcome(p.variant.key, "up-to-date", p.local_image, message=p.where,
                              planned=p)
            if p.where == "local":
                outcome = complete_evidence(outcome, options)
        else:
            outcome = build_variant(matrix, p, wheelhouse, options, after)
        if options.stage and outcome.state in ("built", "up-to-date") and outcome.image_id:
            outcome = stage_outcome(matrix, p, outcome, options.key)
        outcomes.append(summarized(outcome))
        if outcome.state not in ("built", "up-to-date") and options.fail_fast:
            break
    return outcomes + skipped


def runnable(variants: list[Variant]) -> tuple[list[Variant], list[Outcome]]:
    """The variants this host can bootstrap, build and smoke-test, and a `skipped` outcome for
    each of the others (one line per platform says why and what enables it)."""
    why = {name: platforms.cannot_run(name) for name in {v.platform for v in variants}}
    for name, reason in sorted(why.items()):
        if reason:
            count = sum(v.platform == name for v in variants)
            step(f"{name}: {count} variant{'s' * (count != 1)} skipped: {reason}")
    return ([v for v in variants if not why[v.platform]],
            [Outcome(v.key, "skipped", message=f"no emulation: {platforms.ENABLE_EMULATION}")
             for v in variants if why[v.platform]])

