"""A one-layer rootfs image in a registry, moved by our registry client (never `docker pull`):
pushed from a rootfs tarball and a config, and read back into a tarball with every byte
checked (the manifest by its digest, the config by its digest, the gzip layer by its digest and
the tarball by the diff id the config names). A bootstrapped base travels this way so that it
loads through the same `reproducible.load_rootfs` path as a local bootstrap and gets the same
image id; a pulled image would carry a RepoDigest and a registry-made config instead.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import oci
from builder.core.registry_http import RegistryError


@dataclass(frozen=True, kw_only=True)
class Layout:
    """What a one-layer image's manifest and config say: the config digest (the image id when
    the config bytes are the engine's), the gzip layer's digest and size, the tarball's diff id."""

    digest: str
    config_digest: str
    layer_digest: str
    layer_size: int
    diff_id: str


def push(reg: oci.Registry, repository: str, tar: Path, config: bytes,
         tags: Iterable[str]) -> str:
    """Push `tar` (gzip, fixed mtime: same tar, same blob) with `config` as a one-layer OCI
    image under each of `tags`; returns the manifest digest."""
    layer = gzip.compress(tar.read_bytes(), compresslevel=1, mtime=0)
    manifest = {
        "schemaVersion": 2, "mediaType": oci.OCI_MANIFEST,
        "config": {"mediaType": oci.OCI_CONFIG, "digest": reg.push_blob(repository, config),
                   "size": len(config)},
        "layers": [{"mediaType": oci.OCI_LAYER_GZIP, "digest": reg.push_blob(repository, layer),
                    "size": len(layer)}],
    }
    body = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    digest = ""
    for tag in tags:
        digest = reg.put_manifest(repository, tag, body, oci.OCI_MANIFEST)
    return digest


def layout(reg: oci.Registry, repository: str, digest: str) -> Layout:
    """The layout of the one-layer image `digest` (read by digest: its bytes are checked);
    RegistryError when it is not one."""
    found = reg.manifest(repository, digest)
    where = f"`{reg.registry}/{repository}@{digest[:19]}`"
    if found is None:
        raise RegistryError(f"{where}: no such manifest")
    doc = json.loads(found[0])
    layers = doc.get("layers") or []
    config = (doc.get("config") or {}).get("digest", "")
    if len(layers) != 1 or layers[0].get("mediaType") != oci.OCI_LAYER_GZIP:
        raise RegistryError(f"{where}: not a one-layer gzip image")
    diff_ids = reg.config(repository, config).get("rootfs", {}).get("diff_ids") or []
    if len(diff_ids) != 1:
        raise RegistryError(f"{where}: its config names {len(diff_ids)} layers, not one")
    return Layout(digest=digest, config_digest=config, layer_digest=layers[0]["digest"],
                  layer_size=int(layers[0]["size"]), diff_id=diff_ids[0])


def fetch(reg: oci.Registry, repository: str, image: Layout, dest: Path) -> None:
    """The image's layer, gunzipped into `dest` as it arrives; RegistryError (and no `dest`)
    unless the blob hashes to its digest and the tarball to the config's diff id."""
    unzip, tarsum = zlib.decompressobj(wbits=31), hashlib.sha256()
    try:
        with dest.open("wb") as out:
            for chunk in reg.stream_blob(repository, image.layer_digest, image.layer_size):
                _write(out, tarsum, unzip.decompress(chunk))
            _write(out, tarsum, unzip.flush())
        if not unzip.eof:
            raise RegistryError(f"layer {image.layer_digest[:19]}: the gzip stream is cut short")
    except (RegistryError, zlib.error) as exc:
        dest.unlink(missing_ok=True)
        raise RegistryError(f"`{reg.registry}/{repository}`: layer {image.layer_digest[:19]}: "
                            f"{exc}") from None
    if (got := "sha256:" + tarsum.hexdigest()) != image.diff_id:
        dest.unlink(missing_ok=True)
        raise RegistryError(f"`{reg.registry}/{repository}`: layer {image.layer_digest[:19]} "
                            f"unpacks to {got[:19]}, not the diff id {image.diff_id[:19]} its "
                            "config names: refused")


def _write(out: Any, tarsum: Any, data: bytes) -> None:
    out.write(data)
    tarsum.update(data)
