"""zstd twins: a published image again, with the same config, as `tar+zstd` layers.

Why: Kubernetes nodes pull with containerd, which unpacks zstd layers (containerd ≥ 1.5,
Docker Engine ≥ 23, CRI-O, podman) much faster than gzip ones; Docker 20.10 cannot unpack zstd
at all, and old clients have no reliable fallback under one tag, so the gzip image keeps its
tags and the twin gets `<tag>-zstd` beside each of them.

The twin is an OCI manifest with the gzip image's config blob (same digest, same diff ids: the
smoke report, SBOM and provenance describe it unchanged) and each layer recompressed by
builder.core.zstd, streamed from the registry and back in bounded memory; an index twins each
platform manifest and keeps its platform. Each uncompressed layer is checked against its
config's diff id before the twin layer is stored. The twin names its gzip sibling and the
encoder in its annotations, so the same staged image always gives the same twin digest.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from builder.core import oci, oci_blobs, state, twin_cache, zstd
from builder.core.oci import RegistryError
from builder.core.output import human_bytes, step

SUFFIX = "-zstd"
SOURCE_ANNOTATION = "io.torch-images.zstd.source"  # the gzip sibling's digest
ENCODER_ANNOTATION = "io.torch-images.zstd.encoder"
LAYER_ANNOTATION = "io.torch-images.zstd.gzip-layer"  # the gzip layer a zstd layer came from
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
MANIFEST_TYPES = (oci.OCI_MANIFEST, oci.DOCKER_MANIFEST)
MAX_LAYERS = 4  # layers recompressed at once (pool_size)


def tag_of(tag: str) -> str:
    """The twin's tag beside a gzip tag."""
    return tag + SUFFIX


@dataclass(kw_only=True)
class Report:
    """What making a twin did: sizes before and after, the time it took."""

    gzip_bytes: int = 0
    zstd_bytes: int = 0
    tar_bytes: int = 0
    layers: int = 0
    reused: int = 0  # layers whose zstd blob this machine had made before (twin_cache)
    seconds: float = 0.0
    twins: dict[str, oci.Descriptor] = field(default_factory=dict)  # gzip digest → its twin
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, made: Made) -> None:
        """Count one layer's twin (layers finish in several threads)."""
        with self._lock:
            self.layers += 1
            self.reused += made.how != "recompressed"
            self.gzip_bytes += made.gzip_bytes
            self.zstd_bytes += made.descriptor["size"] if made.gzip_bytes else 0
            self.tar_bytes += made.tar_bytes

    def as_json(self) -> dict[str, Any]:
        return {"gzip_bytes": self.gzip_bytes, "zstd_bytes": self.zstd_bytes,
                "tar_bytes": self.tar_bytes, "layers": self.layers, "reused": self.reused,
                "seconds": round(self.seconds, 1)}


def stale(reg: oci.Registry, repository: str, made: oci.Descriptor, source: str,
          tags: list[str]) -> list[tuple[str, str]]:
    """Each of `tags` (twin tags about to be written) that now holds a manifest other than the
    twin just `made` of `source` while claiming to be a twin of it (its annotation), or while its
    gzip sibling tag already names `source`: a twin someone else planted, never taken on trust
    (issue 40.4). Pairs of (tag, the digest it holds)."""
    found = []
    for tag in tags:
        head = reg.head(repository, tag)
        if head is None or head.digest == made.digest:
            continue
        sibling = reg.head(repository, tag.removesuffix(SUFFIX))
        if _claims(reg, repository, head.digest, source) or \
                (sibling is not None and sibling.digest == source):
            found.append((tag, head.digest))
    return found


def _claims(reg: oci.Registry, repository: str, digest: str, source: str) -> bool:
    """Whether the manifest at `digest` says it is the twin of `source`."""
    got = reg.manifest(repository, digest)
    if got is None:
        return False
    try:
        doc = json.loads(got[0])
    except ValueError:
        return False
    return isinstance(doc, dict) and (doc.get("annotations") or {}).get(SOURCE_ANNOTATION) == source


def make(reg: oci.Registry, repository: str, digest: str, *, workers: int | None = None,
         report: Report | None = None) -> oci.Descriptor:
    """The twin of `repository@digest` (an image or an index) in the same repository, stored
    by digest (no tag). Always made afresh (deterministic: the same staged image gives the same
    twin digest), never found by a tag or annotation anyone with push rights could write."""
    report = report if report is not None else Report()
    zstd.fixed_mmap_threshold()
    found = reg.manifest(repository, digest)
    if found is None:
        raise RegistryError(f"`{reg.registry}/{repository}` has no manifest {digest}")
    body, desc = found
    doc = json.loads(body)
    if desc.media_type in oci.INDEX_TYPES:
        twin = _index(reg, repository, digest, doc, workers, report)
    elif desc.media_type in MANIFEST_TYPES:
        twin = _image(reg, repository, digest, doc, workers, report)
    else:
        raise RegistryError(f"`{reg.registry}/{repository}@{digest[:19]}` is a "
                            f"`{desc.media_type}`, not an image or an index: no zstd twin")
    out = json.dumps(twin, sort_keys=True, separators=(",", ":")).encode()
    reg.put_manifest(repository, oci.sha256(out), out, twin["mediaType"])
    report.twins[digest] = oci.Descriptor(oci.sha256(out), twin["mediaType"], len(out))
    return report.twins[digest]


def _annotations(source: str) -> dict[str, str]:
    return {SOURCE_ANNOTATION: source, ENCODER_ANNOTATION: zstd.ENCODER}


def _index(reg: oci.Registry, repository: str, digest: str, doc: dict[str, Any],
           workers: int | None, report: Report) -> dict[str, Any]:
    """An index of the twins of each platform manifest, platforms kept, order kept."""
    entries = []
    for entry in doc.get("manifests") or []:
        if entry.get("mediaType") not in MANIFEST_TYPES:
            raise RegistryError(f"`{reg.registry}/{repository}@{digest[:19]}` lists a "
                                f"`{entry.get('mediaType')}`: only image manifests get twins")
        child = make(reg, repository, entry["digest"], workers=workers, report=report)
        entries.append({**{k: v for k, v in entry.items() if k != "annotations"},
                        **child.as_json()})
    return {"schemaVersion": 2, "mediaType": oci.OCI_INDEX, "manifests": entries,
            "annotations": {**(doc.get("annotations") or {}), **_annotations(digest)}}


def _image(reg: oci.Registry, repository: str, digest: str, doc: dict[str, Any],
           workers: int | None, report: Report) -> dict[str, Any]:
    """The OCI manifest of the same config with every layer as tar+zstd."""
    config = doc["config"]
    diff_ids = reg.config(repository, config["digest"]).get("rootfs", {}).get("diff_ids") or []
    layers = doc.get("layers") or []
    if len(diff_ids) != len(layers):
        raise RegistryError(f"`{reg.registry}/{repository}@{digest[:19]}`: {len(layers)} "
                            f"layers but {len(diff_ids)} diff ids in its config")
    twins = layer_twins(reg, repository, list(zip(layers, diff_ids, strict=True)), workers,
                        report)
    media_type = oci.OCI_CONFIG if config.get("mediaType") == DOCKER_CONFIG \
        else config["mediaType"]
    return {"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST,
            "config": {"mediaType": media_type, "digest": config["digest"],
                       "size": config["size"]},
            "layers": twins, "annotations": _annotations(digest)}


def pool_size() -> int:
    """Layers recompressed at once: the cores this process may use, at most MAX_LAYERS (each
    holds its spooled download on disk and zstd's workers in memory; the bytes do not change)."""
    return max(1, min(zstd.threads(), MAX_LAYERS))


def layer_twins(reg: oci.Registry, repository: str, pairs: list[tuple[dict[str, Any], str]],
                workers: int | None, report: Report) -> list[dict[str, Any]]:
    """The twin descriptor of each (layer, diff id), in order: up to pool_size() layers at
    once (download, inflate and upload of one overlap another's compression, and a machine's
    second core is used), the cores' zstd workers shared among them (memory stays that of one
    layer at a time), each distinct layer once, the largest first (it sets the wall time).
    One progress line per layer."""
    by_key = {(layer["digest"], diff_id): layer for layer, diff_id in pairs}
    distinct = sorted(by_key, key=lambda key: -int(by_key[key]["size"]))
    workers = workers or max(1, zstd.threads() // pool_size())  # zstd's threads: the cores
    made: dict[tuple[str, str], Made] = {}
    stop = threading.Event()  # set when one layer fails: the others stop within a piece
    with concurrent.futures.ThreadPoolExecutor(pool_size(), "zstd-layer") as pool:
        futures = {pool.submit(layer_twin, reg, repository, by_key[key], key[1], workers,
                               stop=stop): key for key in distinct}
        try:
            for future in concurrent.futures.as_completed(futures):
                made[futures[future]] = one = future.result()
                report.add(one)
                step(f"  zstd layer {one.gzip_digest[:19]}: {human_bytes(one.gzip_bytes)} "
                     f"gzip → {human_bytes(one.descriptor['size'])} zstd, {one.how} in "
                     f"{one.seconds:.1f} s ({len(made)} of {len(distinct)} layers)")
        except BaseException:
            stop.set()
            pool.shutdown(cancel_futures=True)
            raise
    return [made[(layer["digest"], diff_id)].descriptor for layer, diff_id in pairs]


@dataclass(frozen=True, kw_only=True)
class Made:
    """One layer's twin: its descriptor, the sizes, how it was had and how long it took."""

    gzip_digest: str
    descriptor: dict[str, Any]
    gzip_bytes: int
    tar_bytes: int
    how: str  # "recompressed", or how a remembered blob was had (twin_cache)
    seconds: float


def layer_twin(reg: oci.Registry, repository: str, layer: dict[str, Any], diff_id: str,
               workers: int | None, *, stop: threading.Event | None = None) -> Made:
    """One layer's twin in the repository: a zstd blob this machine made of the same layer
    before (builder.core.twin_cache) where the repository has it or can get it by mount or
    copy, else recompressed. Three threads overlap in a recompression: download, inflate +
    hash + compress (zstd adds its own workers), upload."""
    start, gz_digest = time.monotonic(), layer["digest"]
    media_type = layer.get("mediaType")
    if media_type == zstd.MEDIA_TYPE:
        return Made(gzip_digest=gz_digest, gzip_bytes=0, tar_bytes=0, how="already zstd",
                    descriptor={k: layer[k] for k in ("mediaType", "digest", "size")},
                    seconds=0.0)
    where = f"`{reg.registry}/{repository}` layer {gz_digest[:19]}"
    if media_type not in (*zstd.GZIP_TYPES, *zstd.TAR_TYPES):
        raise RegistryError(f"{where} is a `{media_type}`: only gzip or plain tar layers can "
                            "be recompressed to zstd")
    place = f"{reg.registry}/{repository}"
    entry = twin_cache.lookup(gz_digest, diff_id)
    how = reused(reg, repository, entry) if entry is not None else ""
    if entry is None or not how:
        entry = recompressed(reg, repository, layer, diff_id, workers, where,
                             stop or threading.Event())
        how = "recompressed"
    twin_cache.remember(entry.at(place))
    return Made(gzip_digest=gz_digest, gzip_bytes=layer["size"], tar_bytes=entry.tar_size,
                how=how, seconds=time.monotonic() - start,
                descriptor={"mediaType": zstd.MEDIA_TYPE, "digest": entry.digest,
                            "size": entry.size, "annotations": {LAYER_ANNOTATION: gz_digest}})


def reused(reg: oci.Registry, repository: str, entry: twin_cache.Entry) -> str:
    """How the blob a cache entry names came to be in `repository` ("" when it could not):
    already there (a registry serves a blob by its digest only), mounted from a repository of
    the same registry it was pushed to, or copied from one of another registry, the bytes
    checked against the entry's digest as they stream."""
    if reg.has_blob(repository, entry.digest):
        return "already there"
    for place in entry.places:
        registry, _, source = place.partition("/")
        try:
            if registry == reg.registry:
                reg.mount_blob(repository, entry.digest, source, entry.size)
                return f"mounted from `{source}`"
            other = oci.Registry(registry)
            reg.upload_again(repository, entry.digest, entry.size,
                             lambda o=other, s=source: o.stream_blob(s, entry.digest, entry.size))
            return f"copied from `{place}`"
        except RegistryError:
            continue
    return ""


def recompressed(reg: oci.Registry, repository: str, layer: dict[str, Any], diff_id: str,
                 workers: int | None, where: str, stop: threading.Event) -> twin_cache.Entry:
    """The layer recompressed into the repository, its uncompressed bytes checked against
    `diff_id` before the blob is stored (the upload given up once `stop` is set): the cache
    entry to remember."""
    gz_digest, size = layer["digest"], layer["size"]
    plain = layer.get("mediaType") in zstd.TAR_TYPES
    counted = zstd.Counted()

    def made() -> Iterator[bytes]:
        fetched = zstd.background(lambda: reg.stream_blob(repository, gz_digest, size))
        tar = fetched if plain else zstd.inflate(zstd.spooled(fetched, state.path("spool")),
                                                 where, limit=zstd.inflate_limit(size))
        return zstd.recompress(tar, counted, expect_diff_id=diff_id, workers=workers,
                               where=where)

    def source() -> Iterator[bytes]:
        counted.reset()
        for piece in zstd.background(made):
            if stop.is_set():
                raise RegistryError(f"{where}: given up (another layer failed)")
            yield piece

    digest = _upload(reg, repository, size, source)
    return twin_cache.Entry(gzip_digest=gz_digest, diff_id=diff_id, digest=digest,
                            size=counted.zstd_bytes, tar_size=counted.tar_bytes,
                            encoder=zstd.ENCODER)


def _upload(reg: oci.Registry, repository: str, size_hint: int,
            source: Callable[[], Iterator[bytes]]) -> str:
    """Stream `source()` into a new blob (once more from the start when the registry cannot
    resume a broken upload); its digest."""
    try:
        return reg.upload(repository, None, size_hint, source())
    except oci_blobs.UploadBroken:
        return reg.upload(repository, None, size_hint, source())
