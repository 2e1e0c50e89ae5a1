"""Compare two images layer by layer: which layers differ, and the first paths that differ.

A layer is listed as {path: (type, mode, uid, gid, size, mtime, link, xattrs, content sha256)}
from its uncompressed tar, so two listings differ exactly where the layers' bytes do (apart
from the order of entries, which `docker save` fixes anyway). Layers come from `docker save`
of the engine's images: one archive holds each shared layer once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from builder.core import engine, oci

Entry = tuple[Any, ...]


@dataclass(frozen=True, kw_only=True)
class LayerRow:
    """One layer position of two images: `a` and `b` are diff ids ("" when absent)."""

    index: int
    a: str
    b: str
    size: int  # of b's layer (the rebuilt one), uncompressed
    step: str  # the instruction that made it (b's history)
    paths: tuple[str, ...] = ()  # the first differing paths (different layers only)

    @property
    def same(self) -> bool:
        return self.a == self.b


def entry(member: tarfile.TarInfo, data: IO[bytes] | None) -> Entry:
    digest = ""
    if data is not None:
        h = hashlib.sha256()
        for chunk in iter(lambda: data.read(1 << 20), b""):
            h.update(chunk)
        digest = h.hexdigest()
    xattrs = tuple(sorted((k, v) for k, v in member.pax_headers.items()
                          if k.startswith("SCHILY.xattr.")))
    return (member.type, member.mode, member.uid, member.gid, member.size, int(member.mtime),
            member.linkname, xattrs, digest)


def listing(layer: IO[bytes]) -> dict[str, Entry]:
    """path → entry of every member of an uncompressed layer tar stream."""
    out: dict[str, Entry] = {}
    with tarfile.open(fileobj=layer, mode="r|") as tar:
        for member in tar:
            data = tar.extractfile(member) if member.isfile() else None
            out["/" + member.name.removeprefix("./").rstrip("/")] = entry(member, data)
    return out


def differing_paths(a: dict[str, Entry], b: dict[str, Entry], limit: int = 10) -> list[str]:
    """The first `limit` paths (sorted) that are in one listing only or differ, each with what
    differs, e.g. `/opt/x (mtime)`."""
    fields = ("type", "mode", "uid", "gid", "size", "mtime", "link", "xattrs", "content")
    out = []
    for path in sorted(set(a) | set(b)):
        if path not in a or path not in b:
            out.append(f"{path} (only in {'the rebuild' if path in b else 'the published'})")
        elif a[path] != b[path]:
            what = [f for f, x, y in zip(fields, a[path], b[path], strict=True) if x != y]
            out.append(f"{path} ({', '.join(what)})")
        if len(out) >= limit:
            break
    return out


@dataclass
class Saved:
    """`docker save` of some images (each shared layer once), read in place."""

    tar: tarfile.TarFile

    def _json(self, name: str) -> Any:
        member = self.tar.extractfile(name)
        assert member is not None
        return json.load(member)

    def config(self, image_id: str) -> dict[str, Any]:
        return self._json(f"{image_id.removeprefix('sha256:')}.json")

    def layer_names(self, image_id: str) -> dict[str, str]:
        """diff id → the member holding its layer tar, for one saved image."""
        name = f"{image_id.removeprefix('sha256:')}.json"
        item = next(i for i in self._json("manifest.json") if i["Config"] == name)
        diff_ids = self.config(image_id)["rootfs"]["diff_ids"]
        return dict(zip(diff_ids, item["Layers"], strict=True))

    def layer(self, name: str) -> IO[bytes]:
        data = self.tar.extractfile(name)
        assert data is not None
        return data

    def size(self, name: str) -> int:
        return self.tar.getmember(name).size


@contextlib.contextmanager
def saved(*images: str) -> Iterator[Saved]:
    """`docker save IMAGES` into a temporary file, open for reading."""
    with tempfile.TemporaryDirectory(prefix="builder-layers-") as tmp:
        archive = Path(tmp) / "images.tar"
        engine.docker("save", "-o", str(archive), *images, timeout=3600)
        with tarfile.open(archive) as tar:
            yield Saved(tar)


def history_steps(config: dict[str, Any]) -> list[str]:
    """The instruction of each layer (empty-layer history entries skipped)."""
    return [(h.get("created_by") or h.get("comment") or "").strip()
            for h in config.get("history") or [] if not h.get("empty_layer")]


def compare(saved_images: Saved, a_id: str, b_id: str, limit: int = 10) -> list[LayerRow]:
    """Per layer position: the two diff ids, b's size and step, and for a differing layer the
    first differing paths."""
    a_cfg, b_cfg = saved_images.config(a_id), saved_images.config(b_id)
    a_ids, b_ids = a_cfg["rootfs"]["diff_ids"], b_cfg["rootfs"]["diff_ids"]
    a_files, b_files = saved_images.layer_names(a_id), saved_images.layer_names(b_id)
    steps = history_steps(b_cfg)
    rows = []
    for i in range(max(len(a_ids), len(b_ids))):
        a = a_ids[i] if i < len(a_ids) else ""
        b = b_ids[i] if i < len(b_ids) else ""
        size = saved_images.size(b_files[b]) if b else 0
        paths: tuple[str, ...] = ()
        if a != b:
            lists = [listing(saved_images.layer(files[d])) if d else {}
                     for files, d in ((a_files, a), (b_files, b))]
            paths = tuple(differing_paths(lists[0], lists[1], limit))
        rows.append(LayerRow(index=i, a=a, b=b, size=size,
                             step=steps[i] if i < len(steps) else "", paths=paths))
    return rows


def blobs(reg: oci.Registry, repository: str, digest: str) -> dict[str, int]:
    """digest → size of every blob a node pulls for this image or index (config and layers of
    each platform's manifest)."""
    found = reg.manifest(repository, digest)
    if found is None:
        raise oci.RegistryError(f"`{reg.registry}/{repository}` has no manifest {digest}")
    doc = json.loads(found[0])
    out: dict[str, int] = {}
    for child in doc.get("manifests") or []:  # an index: every platform's image
        out |= blobs(reg, repository, child["digest"])
    for blob in [doc.get("config") or {}, *(doc.get("layers") or [])]:
        if blob.get("digest"):
            out[blob["digest"]] = int(blob.get("size") or 0)
    return out


def delta(reg: oci.Registry, repository: str, old: str, new: str) -> tuple[int, int]:
    """(bytes of the blobs of `new` that a node holding `old` must download, all of `new`'s
    bytes): what a republication costs every node."""
    have, want = blobs(reg, repository, old), blobs(reg, repository, new)
    return sum(size for d, size in want.items() if d not in have), sum(want.values())
