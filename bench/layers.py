"""Bytes shared between images: layer diff ids (`docker image inspect`), sizes (`docker history`).

`docker history` lists one row per history entry, newest first, with the uncompressed size of the
layer it made (0 for metadata-only entries). The non-empty rows, oldest first, line up with the
image's RootFS diff ids minus the empty layer; when the counts differ the pairing is marked
approximate (sizes are paired from the top, which keeps the shared base layers' sizes right).
"""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path
from typing import Any

from builder.core import engine

EMPTY_LAYER = "sha256:5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"


def layer_sizes(ref: str) -> tuple[list[tuple[str, int]], bool]:
    """(diff id, bytes) of each layer of `ref`, oldest first; and whether the pairing is exact."""
    info = engine.inspect_image(ref)
    if info is None:
        raise ValueError(f"no image {ref}")
    layers = [d for d in info["RootFS"]["Layers"] if d != EMPTY_LAYER]
    out = engine.docker("history", "--no-trunc", "--human=false", "--format", "{{.Size}}", ref)
    sizes = [int(s) for s in reversed(out.stdout.split()) if s.isdigit() and int(s) > 0]
    exact = len(sizes) == len(layers)
    if not exact:
        sizes = (sizes + [0] * len(layers))[: len(layers)]
    return list(zip(layers, sizes, strict=True)), exact


def sharing(refs: list[str]) -> dict[str, Any]:
    """Sum of image sizes against the bytes of their unique layers."""
    total = 0
    unique: dict[str, int] = {}
    exact = True
    per_image = {}
    for ref in refs:
        info = engine.inspect_image(ref) or {}
        size = int(info.get("Size", 0))
        total += size
        pairs, ok = layer_sizes(ref)
        exact &= ok
        per_image[ref] = {"size": size, "layers": len(pairs)}
        for diff_id, n in pairs:
            unique[diff_id] = max(unique.get(diff_id, 0), n)
    return {"images": per_image, "sum_of_sizes": total, "unique_bytes": sum(unique.values()),
            "unique_layers": len(unique), "exact": exact}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def registry_bytes(refs: list[str]) -> dict[str, Any]:
    """Push `refs` to a scratch registry; the bytes of the blobs it then stores (compressed
    layers, configs, manifests), against the sum of the images' (uncompressed) sizes."""
    from builder.core import registry

    total = sum(int((engine.inspect_image(r) or {}).get("Size", 0)) for r in refs)
    with tempfile.TemporaryDirectory(prefix="bench-registry-", dir=Path.cwd() / ".state") as tmp:
        folder = Path(tmp)
        addr = f"127.0.0.1:{free_port()}"
        registry.start(addr, folder)
        pushed = []
        try:
            for i, ref in enumerate(refs):
                target = f"{addr}/bench-sharing:{i}"
                engine.docker("tag", ref, target)
                pushed.append(target)
                engine.docker("push", target, timeout=3600)
            blobs = [p for p in (folder / "storage").rglob("data")
                     if "/blobs/" in str(p) and p.is_file()]
            stored = sum(p.stat().st_size for p in blobs)
        finally:
            for target in pushed:
                engine.docker("image", "rm", target, check=False)
            registry.stop(folder)
    return {"sum_of_sizes": total, "registry_bytes": stored, "blobs": len(blobs), "refs": refs}
