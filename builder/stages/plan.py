"""`builder plan`: per variant its tags, content hash and whether it needs building.

content hash = sha256 over the rendered Dockerfile and ignore file, every file copied in (lock
parts, facts, the smoke package) and the base image digest. A variant is `up-to-date` when the
local image `<registry>/<repository>:<floating tag>` carries that hash label, or the configured
registry/repository has its `build-<hash>` tag: changing `registry:` or `repository:` means
building (and publishing) again, never "up to date" under the old name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from builder.core import labels, oci, vouch
from builder.core.errors import BuilderError, ConfigError
from builder.core.keypair import NOBODY, Vouchers
from builder.core.output import step
from builder.model import lockfile, platforms, tags
from builder.model.matrix import Matrix, Variant
from builder.model.planned import PlannedVariant
from builder.model.rendered import SMOKE_SOURCE, Rendered


def tag_for(variant: Variant, facts: Mapping[str, Any]) -> str:
    """`2.9.1-py3.11-cuda12.8-cudnn9-runtime`, or `2.13.0-py3.11-cpu-runtime`."""
    if facts.get("cuda"):
        accel = f"cuda{facts['cuda']}-cudnn{str(facts['cudnn']).split('.')[0]}"
    else:
        accel = "cpu"
    return f"{variant.torch_public}-py{variant.python}-{accel}-{variant.flavor}"


def tags_for(matrix: Matrix, variant: Variant, facts: Mapping[str, Any]) -> tuple[str, ...]:
    return (tag_for(variant, facts), *aliases_of(matrix, variant))


def aliases_of(matrix: Matrix, variant: Variant) -> list[str]:
    """The matrix's aliases a variant carries (a publication's record does not name them)."""
    return [a.tag for a in matrix.aliases if variant.matches(a.selector)]


def tag_problems(matrix: Matrix, locks_dir: Path) -> list[str]:
    """Tags a publish of the whole matrix would write twice (floating tags and aliases; dated,
    `build-` and artifact tags derive from a floating tag or a digest, and aliases may not take
    their shapes). Variants without a lock have no floating tag yet and are left out."""
    owned: list[tuple[str, str]] = []
    for v in matrix.variants:
        lock = lockfile.read_lock(locks_dir, v)
        if lock is not None:
            owned.append((tag_for(v, lock.facts), f"{v.id} (floating)"))
    owned = list(dict.fromkeys(owned))  # a variant's platforms share its tags (one index)
    owned += [(a.tag, f"alias `{a.tag}`") for a in matrix.aliases]
    problems = tags.collisions(owned)
    problems += [why for a in matrix.aliases if (why := tags.alias_shape_problem(a.tag))]
    return problems


def check_tags(matrix: Matrix, locks_dir: Path) -> None:
    """Refuse to publish anything while two owners would share a tag."""
    problems = tag_problems(matrix, locks_dir)
    if problems:
        raise ConfigError(f"{matrix.path}: tags collide:\n  " + "\n  ".join(problems),
                          hint="rename the alias (or variant) in the matrix; nothing was pushed")


def smoke_files_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(SMOKE_SOURCE.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(SMOKE_SOURCE)).encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def content_hash(rendered: Rendered, base_digest: str | None, smoke_hash: str) -> str:
    digest = hashlib.sha256()
    for name, text in sorted({"Dockerfile": rendered.dockerfile,
                              "Dockerfile.dockerignore": rendered.dockerignore,
                              **rendered.files}.items()):
        digest.update(name.encode() + b"\0" + text.encode() + b"\0")
    digest.update(f"base={base_digest}\0smoke={smoke_hash}".encode())
    return digest.hexdigest()


def plan_variant(matrix: Matrix, rendered: Rendered, base_digest: str | None,
                 smoke_hash: str) -> PlannedVariant:
    """A rendered variant's tags and content hash (its state is `build` until checked)."""
    variant = rendered.variant
    tags = tags_for(matrix, variant, rendered.facts)
    # The floating tag, plus the platform suffix off linux/amd64: one local tag holds one
    # image; the registry joins the platforms into one index.
    local_tag = tags[0] + platforms.get(variant.platform).suffix
    return PlannedVariant(
        variant=variant, rendered=rendered,
        content_hash=content_hash(rendered, base_digest, smoke_hash),
        lock_hash=hashlib.sha256(rendered.lock.text.encode()).hexdigest(),
        base_digest=base_digest, tags=tags, local_image=f"{matrix.image_name}:{local_tag}",
    )


def make_plan(matrix: Matrix, rendered: Iterable[Rendered],
              base_digests: Mapping[str, str | None], *, check_registry: bool = True,
              unasked: str = "build", vouchers: Vouchers = NOBODY) -> list[PlannedVariant]:
    """Plan the rendered variants; `base_digests` maps base image refs to digests (None:
    unknown). With `check_registry` a registry that cannot be asked stops the plan
    (BuilderError): a plan that silently said `build` for everything would rebuild what is
    published. Without it, a variant not up to date locally gets the state `unasked` (`plan
    --offline`: `unknown`). With `vouchers`, a `build-<hash>` tag counts only when one of them
    signed that tag for its digest (an unsigned one is anyone's)."""
    from builder.core import engine

    smoke_hash = smoke_files_hash()
    if engine_available(engine):
        local = local_content_hashes(engine)
    else:
        local = {}
        step("warning: the Docker engine does not answer: local images were not checked "
             "(states below may say `build` for images that exist)")
    planned = []
    for r in rendered:
        base_key = platforms.base_key(r.variant.base.image, r.variant.platform)
        p = plan_variant(matrix, r, base_digests.get(base_key), smoke_hash)
        if p.local_image in local.get(p.content_hash, ()):
            p = _with_state(p, "up-to-date", "local")
        elif not check_registry:
            p = replace(p, state=unasked)
        elif registry_holds(matrix, p.hash_tag, vouchers):
            p = _with_state(p, "up-to-date", "registry")
        planned.append(p)
    return planned


def _with_state(p: PlannedVariant, state: str, where: str) -> PlannedVariant:
    return replace(p, state=state, where=where)


def engine_available(engine) -> bool:
    try:
        engine.ensure_engine()
        return True
    except Exception:
        return False


def local_content_hashes(engine) -> dict[str, set[str]]:
    """Content-hash label → the names (repo:tag) of the local images carrying it, in one call."""
    result = engine.docker("images", "--filter", f"label={labels.CONTENT_HASH}",
                           "--format", "{{.ID}}", check=False)
    ids = sorted(set(result.stdout.split()))
    if not ids:
        return {}
    fmt = "{{index .Config.Labels \"" + labels.CONTENT_HASH + "\"}} {{join .RepoTags \" \"}}"
    out = engine.docker("image", "inspect", "--format", fmt, *ids, check=False)
    names: dict[str, set[str]] = {}
    for line in out.stdout.splitlines():
        if fields := line.split():
            names.setdefault(fields[0], set()).update(fields[1:])
    return names


def registry_holds(matrix: Matrix, tag: str, vouchers: Vouchers) -> bool:
    """Whether the vetted repository has `tag` (with `vouchers`: signed for its digest by a
    trusted key or identity)."""
    held = ask_registry(matrix.registry, matrix.repository, tag)
    if not held or not vouchers:
        return held
    reg = oci.Registry(matrix.registry)
    desc = reg.head(matrix.repository, tag)
    if desc is not None and vouch.names_tag(reg, matrix.repository, desc.digest, tag, vouchers):
        return True
    step(f"  `{tag}` is not signed by a trusted key or identity: not counted as built")
    return False


def ask_registry(registry: str, repository: str, tag: str, timeout: float = 3.0) -> bool:
    """One manifest HEAD, no retries: whether `repository:tag` exists; BuilderError (one line,
    exit 2) when the registry cannot be asked."""
    try:
        return oci.Registry(registry, timeout=timeout, backoff=(),
                            deadline=4 * timeout).head(repository, tag) is not None
    except (BuilderError, OSError, ValueError, KeyError) as exc:
        why = " ".join(str(exc).split()) or type(exc).__name__
        raise BuilderError(
            f"cannot ask the registry `{registry}` which images it holds: {why[:300]}",
            hint="start it (`builder registry start`), log in, or plan without it: "
            "`builder plan --offline` (states it cannot know are `unknown`)") from None


def registry_has(registry: str, repository: str, tag: str, timeout: float = 3.0) -> bool:
    """ask_registry where an unreachable registry counts as `no`."""
    try:
        return ask_registry(registry, repository, tag, timeout)
    except BuilderError:
        return False
