"""`builder verify`'s zstd twin row: each twin layer's uncompressed bytes must hash to the
config's diff id (the twin shares its gzip sibling's config, which says nothing of its layers)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import zstandard

from builder.flows import verify


class Blobs:
    """The two registry reads twin_layer_problem makes, from memory."""

    def __init__(self, config: dict[str, Any], blobs: dict[str, bytes]) -> None:
        self._config, self._blobs = config, blobs

    def config(self, _repository: str, _digest: str) -> dict[str, Any]:
        return self._config

    def stream_blob(self, _repository: str, digest: str, _size: int) -> Iterator[bytes]:
        yield self._blobs[digest]


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def twin(*tars: bytes, diff_ids: list[str]) -> tuple[Blobs, dict[str, Any]]:
    packed = [zstandard.ZstdCompressor().compress(t) for t in tars]
    manifest = {"config": {"digest": "sha256:" + "c" * 64},
                "layers": [{"digest": sha(p), "size": len(p)} for p in packed]}
    return Blobs({"rootfs": {"diff_ids": diff_ids}}, {sha(p): p for p in packed}), manifest


def test_a_twin_whose_layers_match_the_diff_ids_passes() -> None:
    reg, manifest = twin(b"one" * 1000, b"two" * 1000,
                         diff_ids=[sha(b"one" * 1000), sha(b"two" * 1000)])
    assert verify.twin_layer_problem(reg, "r", manifest) == ""


def test_a_twin_layer_other_than_its_diff_id_fails() -> None:
    reg, manifest = twin(b"one" * 1000, b"planted" * 1000,
                         diff_ids=[sha(b"one" * 1000), sha(b"two" * 1000)])
    problem = verify.twin_layer_problem(reg, "r", manifest)
    assert problem.startswith("layer 2 (") and "not the config's diff id" in problem
    reg, manifest = twin(b"one" * 1000, diff_ids=[sha(b"one" * 1000), sha(b"two")])
    assert verify.twin_layer_problem(reg, "r", manifest) == "1 layers, 2 diff ids in the config"
