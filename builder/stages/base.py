"""`builder base`: make each variant's base image available in the engine.

A normal ref is pulled when it is not already there. `mmdebstrap:<suite>` is bootstrapped into a
local image, reused while suite, package list and day are unchanged (so security updates arrive
at least daily). The base's image id goes into each variant's content hash.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import shutil
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from builder.core import clock, engine, oci, proc, reproducible
from builder.core.errors import BuilderError, EngineError
from builder.core.output import step
from builder.model import platforms
from builder.model.bases import (
    DPKG_EXCLUDES,
    SOURCE_DATE_EPOCH,
    bootstrap_ref,
    local_ref,
    registry_served,
)
from builder.model.matrix import Base, Matrix, Variant
from builder.model.platforms import Platform

BOOTSTRAP_PACKAGES = ("ca-certificates",)
KEY_LABEL = "io.torch-images.base-key"
# /etc/hosts and /etc/hostname exist: else every RUN step creates them as mount points and
# removes them again, leaving an /etc entry with the build's time in each layer (no two builds
# of one step would then give the same layer blob).
ETC_STUBS_HOOK = ("--customize-hook=printf '127.0.0.1 localhost\\n' > \"$1/etc/hosts\" "
                  "&& : > \"$1/etc/hostname\"")
# The merged-usr hook installs `usr-is-merged` instead of `usrmerge`, which pulls in perl (47 MB)
# that nothing else needs.
SLIM_OPTIONS = (*(f"--dpkgopt={o}" for o in DPKG_EXCLUDES),
                "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr", ETC_STUBS_HOOK)


def bootstrap_key(suite: str, day: dt.date | None = None, options: tuple[str, ...] = ()) -> str:
    day = day or clock.day()
    payload = f"{suite}|{','.join(BOOTSTRAP_PACKAGES)}|{day.isoformat()}"
    if options:  # plain bases keep their old key, so they are not re-bootstrapped
        payload += "|" + " ".join(options)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def ensure(base: Base, *, progress=step) -> str:
    """Make the base exist locally; returns its digest (see `digest_of`)."""
    engine.ensure_engine()
    suite = base.bootstrap_suite
    if suite:
        return bootstrap(suite, progress=progress)
    info = engine.inspect_image(base.image)
    if info is None:
        progress(f"pulling base {base.image}")
        result = engine.docker("pull", base.image, check=False, timeout=1800)
        if result.returncode != 0:
            raise EngineError(
                f"cannot pull base image `{base.image}`: {result.stderr.strip()[-300:]}",
                hint="on a machine that cannot reach the registry, use `mmdebstrap:<suite>` "
                "in matrix.yaml `bases`",
            )
        info = engine.inspect_image(base.image)
    return digest_of(info)


def ensure_variant(matrix: Matrix, variant: Variant, *, progress=step) -> str | None:
    """`ensure` for the variant's platform. Off linux/amd64 a normal ref is left to BuildKit,
    which pulls that platform's manifest (digest unknown: None); a bootstrapped base is the
    registry's, not this step's (builder.flows.bases.ensure_foreign), and refused here."""
    if registry_served(variant):
        raise EngineError(f"the {variant.platform} base of {variant.id} is served from the "
                          "registry: builder.flows.bases.ensure makes it")
    if platforms.get(variant.platform).suffix:
        return None
    return ensure(variant.base, progress=progress)


def known_digest(matrix: Matrix | None, variant: Variant) -> str | None:
    """The base digest without making the base: None when it is not there yet (or, off
    linux/amd64, when no matrix names the registry that serves it)."""
    platform = platforms.get(variant.platform)
    suite = variant.base.bootstrap_suite
    if not platform.suffix:
        info = engine.inspect_image(local_ref(variant.base))
        return digest_of(info) if info else None
    if suite is None or matrix is None:
        return None
    try:
        return registry_base_digest(
            oci.Registry(matrix.registry), platforms.base_repository(matrix.repository),
            platforms.base_tag(suite, platform.arch))
    except BuilderError:
        return None


def mmdebstrap(suite: str, tar: Path, arch: str | None = None,
               options: tuple[str, ...] = ()) -> None:
    """A minbase rootfs tarball; a foreign `arch` runs under qemu (binfmt, arch-test)."""
    argv = ["mmdebstrap", "--variant=minbase", f"--include={','.join(BOOTSTRAP_PACKAGES)}",
            *options, *([f"--arch={arch}"] if arch else [])]
    proc.run([*argv, suite, str(tar)], timeout=1800, env={"SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH})


def digest_of(info: dict) -> str:
    """The registry digest of a pulled base, else a digest of its filesystem layers.

    Layers, not the image id: a re-bootstrapped base with the same packages has the same layers
    (mmdebstrap is reproducible under SOURCE_DATE_EPOCH) but a new id, and must not rebuild all.
    """
    if info.get("RepoDigests"):
        return info["RepoDigests"][0].split("@", 1)[1]
    layers = "\n".join(info["RootFS"]["Layers"])
    return "sha256:" + hashlib.sha256(layers.encode()).hexdigest()


def bootstrap(suite: str, *, slim: bool = True, progress=step) -> str:
    """Bootstrap `suite` into a local image (the slim one unless told); returns its digest."""
    ref = bootstrap_ref(suite, slim)
    if have_bootstrapped(suite, slim=slim):
        return digest_of(engine.inspect_image(ref) or {})
    progress(f"bootstrapping {ref} with mmdebstrap (about 20 s)")
    with tempfile.TemporaryDirectory() as tmp:
        tar = Path(tmp) / "base.tar"
        mmdebstrap(suite, tar, options=options_of(slim))
        load_bootstrapped(suite, tar, slim=slim)
    return digest_of(engine.inspect_image(ref) or {})


def keyed_ref(suite: str, slim: bool = True) -> str:
    """The second tag of a bootstrapped base, with its bootstrap key. A tag, not a label: the
    image's config (so its id, BuildKit's cache keys and every image's labels) stays a function
    of the rootfs alone, the same on any day."""
    return f"{bootstrap_ref(suite, slim)}-{bootstrap_key(suite, options=options_of(slim))}"


def options_of(slim: bool) -> tuple[str, ...]:
    return SLIM_OPTIONS if slim else ()


def have_bootstrapped(suite: str, *, slim: bool = True) -> bool:
    """Whether today's bootstrap of `suite` is in the engine (both its tags, one image)."""
    info = engine.inspect_image(bootstrap_ref(suite, slim))
    have = engine.inspect_image(keyed_ref(suite, slim))
    return bool(info and have and info["Id"] == have["Id"])


def load_bootstrapped(suite: str, tar: Path, *, slim: bool = True) -> str:
    """Load a bootstrapped rootfs tarball as the base of `suite` (both tags); returns its image
    id. The one way a bootstrapped base enters the engine, from mmdebstrap or from the
    registry, so the same tarball always gives the same image id."""
    ref = bootstrap_ref(suite, slim)
    image_id = reproducible.load_rootfs(tar, ref, f"mmdebstrap --variant=minbase {suite}",
                                        ["bash"])
    engine.docker("tag", ref, keyed_ref(suite, slim))
    return image_id


def export_bootstrapped(suite: str, folder: Path) -> tuple[bytes, Path]:
    """The local base of `suite` as its config bytes (they hash to its image id) and its rootfs
    tarball in `folder` (`docker save`: the engine gives back the very bytes it loaded)."""
    ref = bootstrap_ref(suite)
    info = engine.inspect_image(ref)
    if info is None:
        raise EngineError(f"no image `{ref}` in the engine to export")
    saved, tar = folder / "saved.tar", folder / "rootfs.tar"
    engine.docker("save", "-o", str(saved), info["Id"], timeout=600)
    with tarfile.open(saved) as archive:
        [entry] = json.load(_member(archive, "manifest.json"))
        config = _member(archive, entry["Config"]).read()
        [layer] = entry["Layers"]
        with tar.open("wb") as out:
            shutil.copyfileobj(_member(archive, layer), out)
    saved.unlink()
    if (oci.sha256(config), reproducible.file_digest(tar)) != (info["Id"],
                                                               info["RootFS"]["Layers"][0]):
        raise EngineError(f"`docker save {ref}` gave back other bytes than the image's")
    return config, tar


def _member(archive: tarfile.TarFile, name: str) -> IO[bytes]:
    fh = archive.extractfile(name)
    if fh is None:
        raise EngineError(f"`docker save` wrote no file {name}")
    return fh


def mmdebstrap_inputs(suite: str, arch: str | None = None,
                      key: str | None = None) -> dict[str, Any]:
    """What a slim bootstrap of `suite` (for the foreign `arch`; with bootstrap key `key`,
    today's when not given) was made from (its signed provenance states it)."""
    version = proc.run(["mmdebstrap", "--version"], timeout=60).stdout.strip()
    return {"suite": suite, "variant": "minbase", "packages": list(BOOTSTRAP_PACKAGES),
            "options": list(SLIM_OPTIONS), "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH,
            "mmdebstrap": version.removeprefix("mmdebstrap ").strip(),
            "day": clock.day().isoformat(),
            "bootstrap_key": key or bootstrap_key(suite, options=SLIM_OPTIONS),
            **({"arch": arch} if arch else {})}


def registry_tag(base_digest: str) -> str:
    """The tag under which `<repository>-base` keeps a base by its (layer) digest."""
    return "layers-" + base_digest.removeprefix("sha256:")[:32]


def registry_copy(matrix: Matrix, variant: Variant,
                  base_digest: str | None) -> tuple[str, str] | None:
    """(local ref, registry ref) of a locally bootstrapped base that the registry keeps
    (`<repository>-base:layers-<hex>`, pushed by the staging path), so `builder reproduce` finds
    the exact base once Debian has moved on; None for a pulled base (it is in its own registry)
    or a foreign one (served from ours already)."""
    suite = variant.base.bootstrap_suite
    if not (suite and base_digest) or platforms.get(variant.platform).suffix:
        return None
    repository = platforms.base_repository(matrix.repository)
    return local_ref(variant.base), f"{matrix.registry}/{repository}:{registry_tag(base_digest)}"


def known_digests(variants: list[Variant], m: Matrix | None = None) -> dict[str, str | None]:
    """Digests of bases already there (the engine; the registry for other platforms' bases,
    given the matrix); a missing base is unknown (→ build). Keys: platforms.base_key."""
    digests: dict[str, str | None] = {}
    try:
        engine.ensure_engine()
    except BuilderError:
        return digests
    for v in variants:
        key = platforms.base_key(v.base.image, v.platform)
        if key not in digests:
            digests[key] = known_digest(m, v)
    return digests


# ---- foreign-platform bases, served from the registry -----------------------------------------


def rootfs_config(platform: Platform, diff_id: str, labels: Mapping[str, str],
                  created_by: str) -> dict[str, Any]:
    """An OCI image config for a one-layer rootfs, with the platform written in (what
    `docker import --platform` on Docker 20.10 fails to do)."""
    return {
        **platform.as_oci(),
        "created": "2024-01-01T00:00:00Z",
        "config": {"Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                   "Cmd": ["bash"], "Labels": dict(labels)},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "2024-01-01T00:00:00Z", "created_by": created_by}],
    }


def foreign_config(suite: str, platform: Platform, tar: Path, key: str) -> bytes:
    """The config bytes a foreign-platform bootstrap of `suite` (bootstrap key `key`) is pushed
    with."""
    config = rootfs_config(platform, reproducible.file_digest(tar), {KEY_LABEL: key},
                           f"mmdebstrap --variant=minbase --arch={platform.arch} {suite}")
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def bootstrap_foreign(suite: str, platform: Platform, key: str, folder: Path,
                      progress: Callable[[str], None] = step) -> tuple[bytes, Path]:
    """The slim bootstrap of `suite` for `platform` (emulated) as its config bytes and its
    rootfs tarball in `folder`; `key` is its bootstrap key, taken once by the caller so that a
    bootstrap across midnight is still named by one day."""
    progress(f"bootstrapping {suite} for {platform.name} (emulated: about 2 min)")
    tar = folder / "base.tar"
    mmdebstrap(suite, tar, platform.arch, SLIM_OPTIONS)
    return foreign_config(suite, platform, tar, key), tar


def registry_base_digest(reg: oci.Registry, repository: str, tag: str) -> str | None:
    """The base digest of the registry's base under `tag`, read without verifying (a plan's
    guess; builds verify, see builder.flows.bases.ensure_foreign)."""
    found = reg.manifest(repository, tag)
    if found is None:
        return None
    config = json.loads(reg.blob(repository, json.loads(found[0])["config"]["digest"]))
    return platforms.layers_digest(config["rootfs"]["diff_ids"])
