"""The BuildKit step of `builder build`: one variant's context, labels and build → an image id.

The engine tags only on success, so a failed build leaves existing images and tags as they
were. The registry's cache image of the variant, when its signature verified
(builder.stages.signed_cache), is offered to BuildKit (`--cache-from`, by digest), and an
export that Docker 20.10 fails on lazily pulled layers is retried. The pipeline around it (plan,
smoke, SBOM, staging) is builder.flows.build.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import itertools
import json
import os
import re
import shutil
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder.core import engine, labels, proc, reproducible, state
from builder.core.errors import BuilderError, CommandFailed, EngineError
from builder.core.output import step
from builder.model import platforms
from builder.model.bases import registry_served
from builder.model.matrix import Matrix, Variant

NEED_GB = {"cpu": 4, "cuda": 12}  # a new CUDA variant: ~7 GB of layers + ~5 GB of wheel cache


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


@dataclass(frozen=True, kw_only=True)
class Context:
    """What one variant's build reads from the shared context folder: each set folder's
    requirements and the wheels beside them, its facts file, the smoke suite, its Dockerfile."""

    key: str  # the variant's key: its folder under .state/rendered/
    sets: tuple[tuple[str, str, tuple[Path, ...]], ...]  # (folder, requirements, wheels)
    facts: tuple[str, str]  # (path in the context, the facts JSON)
    smoke_dir: Path
    dockerfile: str
    dockerignore: str


@dataclass(frozen=True, kw_only=True)
class Spec:
    """One BuildKit build: the image to tag, for which platform, with which labels, from
    which context and Dockerfile, logged where."""

    key: str
    image: str
    platform: str
    labels: Mapping[str, str]
    context: Path
    dockerfile: Path
    log: Path
    apt_refresh: str = ""
    base_image: str = ""  # the verified `<ref>@<digest>` of a registry-served base (BASE_IMAGE)
    no_cache: bool = False  # no cache at all, BuildKit's own included (flows/same_again.py)


def created_time(lock_files: tuple[Path, Path]) -> str:
    """When the inputs were fixed (the lock's commit), not wall-clock: same inputs, same config."""
    txt, js = lock_files
    committed = git("log", "-1", "--format=%cI", "--", str(txt))
    if committed:
        return dt.datetime.fromisoformat(committed).astimezone(dt.UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ")
    mtime = js.stat().st_mtime
    return dt.datetime.fromtimestamp(mtime, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def record_times(image_id: str, started_on: str) -> None:
    """Keep when this build really ran, for its provenance (never in the image: its config
    keeps the reproducible time)."""
    state.atomic_write(state.build_times_path(image_id), json.dumps(
        {"startedOn": started_on, "finishedOn": utc_now()}) + "\n")


def build_times(image_id: str) -> dict[str, str]:
    """`startedOn`/`finishedOn` of this machine's build of `image_id`; {} when another machine
    (or an older builder) built it."""
    try:
        found = json.loads(state.build_times_path(image_id).read_text())
    except (OSError, ValueError):
        return {}
    return {k: str(found[k]) for k in ("startedOn", "finishedOn")
            if isinstance(found, dict) and k in found}


def tree_labels() -> dict[str, str]:
    """Whether the checkout differs from its commit (tracked changes or untracked files that
    are not ignored), and a hash of that difference: a build from a dirty tree says so instead
    of naming a commit that did not hold its inputs."""
    if not git("status", "--porcelain"):
        return {labels.SOURCE_DIRTY: "false"}
    digest = hashlib.sha256(git("diff", "HEAD", "--binary").encode())
    for name in sorted(git("ls-files", "--others", "--exclude-standard").splitlines()):
        digest.update(b"\0" + name.encode() + b"\0")
        with contextlib.suppress(OSError):
            digest.update(hashlib.sha256(Path(name).read_bytes()).digest())
    return {labels.SOURCE_DIRTY: "true", labels.SOURCE_DIFF: f"sha256:{digest.hexdigest()}"}


def build_labels(lock_files: tuple[Path, Path], base_digest: str | None, content_hash: str,
                 lock_hash: str) -> dict[str, str]:
    """The image's labels: when and from which commit (and whether the tree was dirty), source,
    base, content and lock hash."""
    return {
        labels.OCI + "created": created_time(lock_files),
        labels.OCI + "revision": git("rev-parse", "HEAD") or "unknown",
        **tree_labels(),
        **({labels.OCI + "source": url} if (url := source_url()) else {}),
        labels.OCI + "base.digest": base_digest or "",
        labels.CONTENT_HASH: content_hash,
        labels.LOCK_HASH: lock_hash,
    }


def prepare_context(ctx: Context,
                    link_set: Callable[[Path, str, list[Path]], None]) -> tuple[Path, Path]:
    """Fill the shared context with this variant's sets, facts and smoke suite; write its
    Dockerfile. Only requirements and wheels of local folders (and uv) go in the sets: the rest
    of the wheels reach the build through its cache mount, never through the context."""
    context = state.path("context")
    for folder, requirements, wheels in ctx.sets:
        link_set(context / folder, requirements, list(wheels))
    state.atomic_write(context / ctx.facts[0], ctx.facts[1])
    smoke = context / "smoke"
    if smoke.exists():
        shutil.rmtree(smoke)
    shutil.copytree(ctx.smoke_dir, smoke, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    dockerfile_dir = state.path("rendered", ctx.key)
    state.atomic_write(dockerfile_dir / "Dockerfile", ctx.dockerfile)
    state.atomic_write(dockerfile_dir / "Dockerfile.dockerignore", ctx.dockerignore)
    return context, dockerfile_dir / "Dockerfile"


def cache_ref(matrix: Matrix, local_image: str) -> str:
    """Where the staging repository keeps the variant's last build as BuildKit wrote it (its
    config carries the inline cache; its layers are the staged image's)."""
    tag = local_image.rsplit(":", 1)[1]
    return f"{matrix.staging_registry}/{matrix.staging_repository}:cache-{tag}"


def docker_build(spec: Spec, cache_from: list[str] | None = None) -> str:
    """Run the BuildKit build; returns the image id. Tags only on success."""
    iidfile = spec.log.with_suffix(".iid")
    iidfile.unlink(missing_ok=True)
    argv = ["build", "--progress=plain", "-f", str(spec.dockerfile), "--iidfile", str(iidfile),
            "-t", spec.image]
    for key, value in spec.labels.items():
        argv += ["--label", f"{key}={value}"]
    if ca := proc.host_ca_bundle():  # the install steps download: a secret, never a layer
        argv += ["--secret", f"id=ca,src={ca}"]
    if spec.apt_refresh:
        argv += ["--build-arg", f"APT_REFRESH={spec.apt_refresh}"]
    if spec.base_image:
        argv += ["--build-arg", f"BASE_IMAGE={spec.base_image}"]
    # A BuildKit that honours it (0.11+) fixes the config's times itself; 20.10's does not
    # (reproducible.normalise_image does it afterwards either way).
    argv += ["--build-arg", f"SOURCE_DATE_EPOCH={reproducible.SOURCE_DATE_EPOCH}"]
    # BuildKit's inline cache: a fresh runner pulls the unchanged layers the registry holds
    # (the cache image the staging path pushed) instead of installing them again.
    argv += ["--build-arg", "BUILDKIT_INLINE_CACHE=1"]
    argv += [a for ref in cache_from or [] for a in ("--cache-from", ref)]
    argv += ["--no-cache"] if spec.no_cache else []
    if spec.platform != platforms.DEFAULT:  # emulated unless the host is that platform
        argv += ["--platform", spec.platform]
    spec.log.unlink(missing_ok=True)
    engine.docker(*argv, str(spec.context), log=spec.log, timeout=4 * 3600)
    return iidfile.read_text().strip()


# Docker 20.10's BuildKit may fail to export an image whose layers came lazily from an inline
# cache (moby/moby#41595): "failed to get layer sha256:…: layer does not exist".
LAZY_LAYER_FAILURE = "layer does not exist"


def build_from_registry_cache(spec: Spec, cache_from: list[str]) -> str:
    """`docker_build` with the registry's cache. When the engine cannot export what it took
    from that cache: once more with it (the layers are local by then), then without it
    (slower, never wrong)."""
    attempts = [cache_from, cache_from, []] if cache_from else [[]]
    for cache, then in itertools.pairwise(attempts):
        try:
            return docker_build(spec, cache_from=cache)
        except CommandFailed:
            log = spec.log
            failure = log.read_text(errors="replace")[-4000:] if log.is_file() else ""
            if LAZY_LAYER_FAILURE not in failure:
                raise
        step(f"  [{spec.key}] this engine could not export the layers it took from the "
             "registry's cache (a Docker 20.10 BuildKit bug): building again "
             + ("with it" if then else "without it"))
    return docker_build(spec, cache_from=attempts[-1])


def base_layer_problem(variant: Variant, base_digest: str | None, layers: Sequence[str]) -> str:
    """Why the built image does not start with the base its content hash names ("" when it
    does, or when the base is not served by the registry). The build takes such a base by the
    digest it verified (BASE_IMAGE); this re-reads what BuildKit actually built on, so that
    an image on any other base is never staged or signed. (A native base is this engine's.)"""
    if not (registry_served(variant) and base_digest):
        return ""
    if platforms.layers_digest(layers[:1]) == base_digest:
        return ""
    first = layers[0][:19] if layers else "none"
    return (f"the image was built on another base than the verified one: its first layer "
            f"{first} is not that of base digest {base_digest[:19]}; the image was removed")
