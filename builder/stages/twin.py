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

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from builder.core import oci, oci_blobs, state, zstd
from builder.core.oci import RegistryError

SUFFIX = "-zstd"
SOURCE_ANNOTATION = "io.torch-images.zstd.source"  # the gzip sibling's digest
ENCODER_ANNOTATION = "io.torch-images.zstd.encoder"
LAYER_ANNOTATION = "io.torch-images.zstd.gzip-layer"  # the gzip layer a zstd layer came from
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
MANIFEST_TYPES = (oci.OCI_MANIFEST, oci.DOCKER_MANIFEST)


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
    seconds: float = 0.0
    twins: dict[str, oci.Descriptor] = field(default_factory=dict)  # gzip digest → its twin

    def as_json(self) -> dict[str, Any]:
        return {"gzip_bytes": self.gzip_bytes, "zstd_bytes": self.zstd_bytes,
                "tar_bytes": self.tar_bytes, "layers": self.layers,
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
    twins = [layer_twin(reg, repository, layer, diff_id, workers, report)
             for layer, diff_id in zip(layers, diff_ids, strict=True)]
    media_type = oci.OCI_CONFIG if config.get("mediaType") == DOCKER_CONFIG \
        else config["mediaType"]
    return {"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST,
            "config": {"mediaType": media_type, "digest": config["digest"],
                       "size": config["size"]},
            "layers": twins, "annotations": _annotations(digest)}


def layer_twin(reg: oci.Registry, repository: str, layer: dict[str, Any], diff_id: str,
               workers: int | None, report: Report) -> dict[str, Any]:
    """Recompress one layer into the repository; its descriptor. Three threads overlap:
    download, inflate + hash + compress (zstd adds its own workers), upload."""
    media_type, gz_digest, size = layer.get("mediaType"), layer["digest"], layer["size"]
    where = f"`{reg.registry}/{repository}` layer {gz_digest[:19]}"
    if media_type == zstd.MEDIA_TYPE:
        return {k: layer[k] for k in ("mediaType", "digest", "size")}
    if media_type not in (*zstd.GZIP_TYPES, *zstd.TAR_TYPES):
        raise RegistryError(f"{where} is a `{media_type}`: only gzip or plain tar layers can "
                            "be recompressed to zstd")
    plain = media_type in zstd.TAR_TYPES
    counted = zstd.Counted()

    def recompressed() -> Iterator[bytes]:
        fetched = zstd.background(lambda: reg.stream_blob(repository, gz_digest, size))
        tar = fetched if plain else zstd.inflate(zstd.spooled(fetched, state.path("spool")),
                                                 where, limit=zstd.inflate_limit(size))
        return zstd.recompress(tar, counted, expect_diff_id=diff_id, workers=workers,
                               where=where)

    def source() -> Iterator[bytes]:
        counted.reset()
        return zstd.background(recompressed)

    digest = _upload(reg, repository, size, source)
    report.layers += 1
    report.gzip_bytes += size
    report.zstd_bytes += counted.zstd_bytes
    report.tar_bytes += counted.tar_bytes
    return {"mediaType": zstd.MEDIA_TYPE, "digest": digest, "size": counted.zstd_bytes,
            "annotations": {LAYER_ANNOTATION: gz_digest}}


def _upload(reg: oci.Registry, repository: str, size_hint: int,
            source: Callable[[], Iterator[bytes]]) -> str:
    """Stream `source()` into a new blob (once more from the start when the registry cannot
    resume a broken upload); its digest."""
    try:
        return reg.upload(repository, None, size_hint, source())
    except oci_blobs.UploadBroken:
        return reg.upload(repository, None, size_hint, source())
