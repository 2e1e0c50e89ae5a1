"""`builder reproduce REF@sha256:…`: rebuild a published image from its provenance and compare.

The provenance attached to the digest names the commit, the lock (path and sha256) and the base
digest. The commit is checked out into a temporary git worktree (its templates, matrix and
lock), the lock is checked against the recorded hash, the recorded base is made present (the
local bootstrap when it has that digest, else the copy `builder build --stage` kept in
`<repository>-base:layers-<hex>`), and `builder build` of that checkout rebuilds the variant on
this engine. Identical config digest (so identical layers) → exit 0. Otherwise a table of the
layers (diff id, size, same/different, the instruction) with, for each differing layer, the
first paths that differ (read from both layers), and exit 1.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import engine, labels, layerdiff, oci, proc, settings
from builder.core.errors import BuilderError
from builder.core.output import step
from builder.flows.verify import Reference
from builder.model import bases, platforms, provenance_doc
from builder.stages import base


@dataclass(frozen=True, kw_only=True)
class Recorded:
    """What the provenance of a published image says it was built from."""

    variant: str
    revision: str
    lock_path: str
    lock_sha256: str
    base_name: str
    base_digest: str


def recorded(doc: dict[str, Any]) -> Recorded:
    """Read the SLSA provenance statement (builder.stages.provenance) of an image."""
    definition = (doc.get("predicate") or {}).get("buildDefinition") or {}
    params = definition.get("externalParameters") or {}
    roles = provenance_doc.dependencies_by_role(doc)
    lock, base_dep = roles.get("lock") or {}, roles.get("base") or {}
    revision = params.get("revision") or ""
    if not (params.get("variant") and revision and lock):
        raise BuilderError("the provenance names no variant, revision or lock",
                           hint="it was not written by `builder publish`")
    return Recorded(variant=params["variant"], revision=revision, lock_path=lock["name"],
                    lock_sha256=lock["digest"].get("sha256", ""),
                    base_name=base_dep.get("name", ""),
                    base_digest="sha256:" + base_dep["digest"]["sha256"] if base_dep else "")


def ensure_base(ref: Reference, rec: Recorded, local_ref: str, keyed: str) -> str:
    """Make the recorded base the local `local_ref` (and today's `keyed` tag, so the build does
    not bootstrap another); returns where it came from."""
    info = engine.inspect_image(local_ref)
    if info and base.digest_of(info) == rec.base_digest:
        engine.docker("tag", local_ref, keyed)
        return "local"
    repository = platforms.base_repository(ref.repository)
    tag = base.registry_tag(rec.base_digest)
    remote = f"{ref.registry}/{repository}:{tag}"
    if oci.Registry(ref.registry).head(repository, tag) is None:
        return "bootstrap"  # the same day's bootstrap is the same base; later, it may not be
    engine.docker("pull", "-q", remote, timeout=1800)
    for name in (local_ref, keyed):
        engine.docker("tag", remote, name)
    engine.docker("image", "rm", remote, check=False)
    return "registry"


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[Path]:
    """The commit in a temporary git worktree (removed afterwards)."""
    if _git("cat-file", "-e", f"{revision}^{{commit}}").returncode != 0:
        raise BuilderError(f"commit {revision[:12]} is not in this checkout",
                           hint="run `git fetch` (the provenance names the commit it was built "
                           "from)")
    with tempfile.TemporaryDirectory(prefix="builder-reproduce-") as tmp:
        path = Path(tmp) / "src"
        result = _git("worktree", "add", "--detach", str(path), revision)
        if result.returncode != 0:
            raise BuilderError(f"cannot check out {revision[:12]}: {result.stderr.strip()}")
        try:
            yield path
        finally:
            _git("worktree", "remove", "--force", str(path))


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return proc.run(["git", *args], check=False)


def child_env(state: Path, src: Path) -> dict[str, str]:
    """What the nested `builder build` must know of this run's settings, passed in its
    environment (nothing here writes os.environ)."""
    now = settings.current()
    env = {"BUILDER_STATE": str(state), "PYTHONPATH": str(src),
           settings.INSECURE_ENV: ",".join(now.insecure_registries),
           settings.DEADLINE_ENV: str(now.registry_deadline_s)}
    if now.ca_bundle:
        env[settings.CA_BUNDLE_ENV] = now.ca_bundle
    return env


def check_lock(src: Path, rec: Recorded) -> None:
    path = src / rec.lock_path
    if not path.is_file():
        raise BuilderError(f"{rec.lock_path} is not in commit {rec.revision[:12]}")
    have = hashlib.sha256(path.read_bytes()).hexdigest()
    if have != rec.lock_sha256:
        raise BuilderError(f"{rec.lock_path} at {rec.revision[:12]} has sha256 {have[:12]}, "
                           f"not the recorded {rec.lock_sha256[:12]}")


def rebuild(src: Path, rec: Recorded, matrix: Path | None, state: Path) -> str:
    """`builder build` of the variant from the checkout (its own code, templates and lock),
    without the registry's cache (that would hand back the published layers); returns the
    image id."""
    argv = [sys.executable, "-m", "builder", "build", "--select", f"id={rec.variant}",
            "--select", "platform=linux/amd64", "--force", "--no-smoke", "--no-sbom",
            "--no-registry-cache", "--json",
            *(["--matrix", str(matrix.resolve())] if matrix else [])]
    step(f"rebuilding {rec.variant} from {rec.revision[:12]} (log: {state / 'logs'})")
    result = proc.run(argv, cwd=src, env=child_env(state, src), check=False)
    try:
        outcomes = json.loads(result.stdout)
    except ValueError:
        outcomes = None
    if result.returncode != 0 or not isinstance(outcomes, list) or not outcomes:
        raise BuilderError(f"the rebuild of {rec.variant} failed (exit {result.returncode})",
                           hint=(result.stderr or result.stdout)[-1500:])
    return outcomes[0]["image_id"]


def published_manifest(ref: Reference) -> tuple[str, dict[str, Any]]:
    """The image manifest's digest and body (a linux/amd64 one out of an index)."""
    reg = oci.Registry(ref.registry)
    found = reg.manifest(ref.repository, ref.ref)
    if found is None:
        raise BuilderError(f"`{ref.registry}/{ref.repository}` has no image `{ref.ref}`")
    body, desc = found
    doc = json.loads(body)
    if desc.media_type in (oci.OCI_INDEX, oci.DOCKER_LIST):
        entry = next((m for m in doc["manifests"]
                      if (m.get("platform") or {}).get("architecture") == "amd64"), None)
        if entry is None:
            raise BuilderError(f"`{ref.ref}` lists no linux/amd64 image to rebuild here")
        return published_manifest(Reference(ref.registry, ref.repository, entry["digest"]))
    return desc.digest, doc


@dataclass(kw_only=True)
class Result:
    reference: str
    identical: bool
    published_id: str
    rebuilt_id: str
    base: str
    layers: list[layerdiff.LayerRow]

    def as_json(self) -> dict[str, Any]:
        return {"reference": self.reference, "identical": self.identical,
                "published_id": self.published_id, "rebuilt_id": self.rebuilt_id,
                "base": self.base,
                "layers": [{"index": r.index, "published": r.a, "rebuilt": r.b, "size": r.size,
                            "same": r.same, "step": r.step, "paths": list(r.paths)}
                           for r in self.layers]}


def reproduce(text: str, matrix: Path | None = None) -> Result:
    ref = Reference.parse(text)
    if not ref.ref.startswith("sha256:"):
        raise BuilderError(f"`{text}` names a tag: reproduce takes a digest (REF@sha256:…)")
    digest, manifest = published_manifest(ref)
    reg = oci.Registry(ref.registry)
    prov = reg.fetch_artifact(ref.repository, digest, "provenance")
    if prov is None:
        raise BuilderError(f"no provenance is attached to {digest}",
                           hint="only images published by `builder publish` can be reproduced")
    rec = recorded(json.loads(prov))
    published_id = manifest["config"]["digest"]
    step(f"{rec.variant}: commit {rec.revision[:12]}, {rec.lock_path}, base "
         f"{rec.base_digest[:19] or '-'}")
    config = reg.config(ref.repository, published_id)
    base_name = (config.get("config") or {}).get("Labels", {}).get(labels.OCI + "base.name", "")
    suite = base_name.removeprefix("mmdebstrap:") if base_name.startswith("mmdebstrap:") else ""
    with checkout(rec.revision) as src, tempfile.TemporaryDirectory() as state:
        check_lock(src, rec)
        origin = "pulled by the build"
        if suite and rec.base_digest:
            local = bases.bootstrap_ref(suite)
            keyed = f"{local}-{base.bootstrap_key(suite, options=base.SLIM_OPTIONS)}"
            origin = ensure_base(ref, rec, local, keyed)
        rebuilt_id = rebuild(src, rec, matrix, Path(state))
    identical = rebuilt_id == published_id
    rows = [] if identical else compare(ref, digest, published_id, rebuilt_id)
    return Result(reference=f"{ref.registry}/{ref.repository}@{digest}", identical=identical,
                  published_id=published_id,
                  rebuilt_id=rebuilt_id, base=origin, layers=rows)


def compare(ref: Reference, digest: str, published_id: str, rebuilt_id: str
            ) -> list[layerdiff.LayerRow]:
    """Pull the published image (only the layers this engine lacks come) and compare."""
    published = f"{ref.registry}/{ref.repository}@{digest}"
    step(f"pulling {published} to compare its layers")
    engine.docker("pull", "-q", published, timeout=3600)
    try:
        with layerdiff.saved(published_id, rebuilt_id) as images:
            return layerdiff.compare(images, published_id, rebuilt_id)
    finally:
        engine.docker("image", "rm", published, check=False)
