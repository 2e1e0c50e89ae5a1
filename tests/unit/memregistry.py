"""An in-memory registry for unit tests (imported as `memregistry`): the part of oci.Registry
that signing, one-layer rootfs images and signed bases use, every blob read checked against its
digest as the real client checks it — except `tamper`, which serves other bytes for a digest
the way a hostile registry would (stream_blob then does not catch it: the diff id check must)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from builder.core import oci


class MemoryRegistry:
    def __init__(self, registry: str = "r.example:5000") -> None:
        self.registry = registry
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[tuple[str, str], bytes] = {}
        self.tampered: dict[str, bytes] = {}

    def head(self, repository: str, ref: str) -> oci.Descriptor | None:
        found = self.manifest(repository, ref)
        return found[1] if found else None

    def manifest(self, repository: str, ref: str) -> tuple[bytes, oci.Descriptor] | None:
        body = self.manifests.get((repository, ref))
        if body is None:
            return None
        return body, oci.Descriptor(oci.sha256(body), oci.OCI_MANIFEST, len(body))

    def put_manifest(self, repository: str, ref: str, body: bytes, media_type: str) -> str:
        digest = oci.sha256(body)
        self.manifests[(repository, ref)] = self.manifests[(repository, digest)] = body
        return digest

    def tag(self, repository: str, digest: str, tag: str) -> None:
        self.manifests[(repository, tag)] = self.manifests[(repository, digest)]

    def push_blob(self, repository: str, data: bytes) -> str:
        self.blobs[oci.sha256(data)] = data
        return oci.sha256(data)

    def blob(self, repository: str, digest: str, cap: int = 0) -> bytes:
        if digest not in self.blobs:
            raise oci.RegistryError(f"no blob {digest}")
        return self.blobs[digest]

    def config(self, repository: str, digest: str) -> dict[str, Any]:
        return json.loads(self.blob(repository, digest))

    def stream_blob(self, repository: str, digest: str, size: int) -> Iterator[bytes]:
        data = self.tampered.get(digest) or self.blob(repository, digest)
        for i in range(0, len(data), 1000):
            yield data[i:i + 1000]

    def tamper(self, digest: str, data: bytes) -> None:
        self.tampered[digest] = data
