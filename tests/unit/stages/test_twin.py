"""builder.stages.twin: the zstd twin of an image or index has only tar+zstd layers, the same
config blob, the same digest in two empty registries, and refuses a layer that is not its diff id."""

from __future__ import annotations

import gzip
import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
import zstandard

from builder.core import oci, twin_cache, zstd
from builder.flows import verify
from builder.model import matrix
from builder.stages import twin

ROOT = Path(__file__).resolve().parents[3]
GZIP_DOCKER = "application/vnd.docker.image.rootfs.diff.tar.gzip"


class MemoryRegistry:
    """The part of oci.Registry that twin.py uses, in memory (one repository)."""

    def __init__(self, registry: str = "mem.example:5000") -> None:
        self.registry = registry
        self.blobs: dict[str, bytes] = {}
        self.manifests: dict[str, tuple[bytes, str]] = {}
        self.streamed: list[str] = []  # the blobs read, in order

    def manifest(self, repository: str, ref: str) -> tuple[bytes, oci.Descriptor] | None:
        if ref not in self.manifests:
            return None
        body, media_type = self.manifests[ref]
        return body, oci.Descriptor(oci.sha256(body), media_type, len(body))

    def head(self, repository: str, ref: str) -> oci.Descriptor | None:
        found = self.manifest(repository, ref)
        return found[1] if found else None

    def put_manifest(self, repository: str, ref: str, body: bytes, media_type: str) -> str:
        for name in {ref, oci.sha256(body)}:
            self.manifests[name] = (body, media_type)
        return oci.sha256(body)

    def config(self, repository: str, digest: str) -> dict[str, Any]:
        return json.loads(self.blobs[digest])

    def has_blob(self, repository: str, digest: str) -> bool:
        return digest in self.blobs

    def mount_blob(self, repository: str, digest: str, source: str, size: int = 0) -> None:
        if digest not in self.blobs:  # one repository: a mount finds what is there or nothing
            raise oci.RegistryError(f"no blob {digest} to mount")

    def upload_again(self, repository: str, digest: str, size: int,
                     source: Callable[[], Iterator[bytes]]) -> None:
        assert self.upload(repository, None, size, source()) == digest

    def stream_blob(self, repository: str, digest: str, size: int) -> Iterator[bytes]:
        self.streamed.append(digest)
        data = self.blobs[digest]
        assert len(data) == size
        yield from (data[i:i + 1000] for i in range(0, len(data), 1000))

    def upload(self, repository: str, digest: str | None, size: int,
               chunks: Iterator[bytes], location: str | None = None) -> str:
        data = b"".join(chunks)
        self.blobs[oci.sha256(data)] = data
        return oci.sha256(data)

    def add(self, data: bytes) -> dict[str, Any]:
        self.blobs[oci.sha256(data)] = data
        return {"digest": oci.sha256(data), "size": len(data)}


def diff_id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


TARS = [b"base layer " * 5000, b"torch layer " * 20000, b"tiny"]


def push_image(reg: MemoryRegistry, arch: str = "amd64", wrong: int | None = None) -> str:
    """A docker-pushed image: Docker media types, gzip layers (mtime 0, as Docker writes)."""
    layers = [{"mediaType": GZIP_DOCKER, **reg.add(gzip.compress(t, mtime=0))} for t in TARS]
    diff_ids = [diff_id(t + (b"!" if n == wrong else b"")) for n, t in enumerate(TARS)]
    config = reg.add(json.dumps({"architecture": arch, "os": "linux", "config": {"Labels": {}},
                                 "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode())
    doc = {"schemaVersion": 2, "mediaType": oci.DOCKER_MANIFEST, "layers": layers,
           "config": {"mediaType": twin.DOCKER_CONFIG, **config}}
    return reg.put_manifest("torch", "gz", json.dumps(doc).encode(), oci.DOCKER_MANIFEST)


def doc_of(reg: MemoryRegistry, ref: str) -> dict[str, Any]:
    return json.loads(reg.manifests[ref][0])


def test_the_twin_has_zstd_layers_and_the_same_config() -> None:
    reg = MemoryRegistry()
    source = push_image(reg)
    report = twin.Report()
    desc = twin.make(reg, "torch", source, report=report)  # type: ignore[arg-type]
    doc, gz = doc_of(reg, desc.digest), doc_of(reg, source)
    assert desc.media_type == doc["mediaType"] == oci.OCI_MANIFEST
    assert {layer["mediaType"] for layer in doc["layers"]} == {zstd.MEDIA_TYPE}
    assert doc["config"]["digest"] == gz["config"]["digest"]
    assert doc["config"]["mediaType"] == oci.OCI_CONFIG
    assert doc["annotations"] == {twin.SOURCE_ANNOTATION: source,
                                  twin.ENCODER_ANNOTATION: zstd.ENCODER}
    for layer, gz_layer, tar in zip(doc["layers"], gz["layers"], TARS, strict=True):
        data = reg.blobs[layer["digest"]]
        assert len(data) == layer["size"]
        assert zstandard.ZstdDecompressor().decompressobj().decompress(data) == tar
        assert layer["annotations"] == {twin.LAYER_ANNOTATION: gz_layer["digest"]}
    assert (report.layers, report.tar_bytes) == (3, sum(map(len, TARS)))
    assert report.zstd_bytes == sum(layer["size"] for layer in doc["layers"])


def test_the_same_image_gives_the_same_twin_in_two_registries(tmp_path, monkeypatch) -> None:
    """Whatever the zstd workers and the layers made at once (each registry with a cache of
    its own, so both recompress)."""
    made = []
    for n, (workers, layers) in enumerate(((1, 1), (2, 4), (4, 2))):
        monkeypatch.setenv("BUILDER_TWIN_CACHE", str(tmp_path / str(n)))
        monkeypatch.setattr(twin, "MAX_LAYERS", layers)
        reg, report = MemoryRegistry(), twin.Report()
        made.append(twin.make(reg, "torch", push_image(reg), workers=workers,  # type: ignore[arg-type]
                              report=report))
        assert (report.layers, report.reused) == (3, 0)
    assert made[0] == made[1] == made[2]


def test_an_index_twins_each_platform() -> None:
    reg = MemoryRegistry()
    amd, arm = push_image(reg, "amd64"), push_image(reg, "arm64")
    index = push_index(reg, (amd, "amd64"), (arm, "arm64"))
    desc = twin.make(reg, "torch", index)  # type: ignore[arg-type]
    doc = doc_of(reg, desc.digest)
    assert desc.media_type == oci.OCI_INDEX
    assert [e["platform"]["architecture"] for e in doc["manifests"]] == ["amd64", "arm64"]
    for entry, source in zip(doc["manifests"], (amd, arm), strict=True):
        child = doc_of(reg, entry["digest"])
        assert entry["mediaType"] == oci.OCI_MANIFEST
        assert child["annotations"][twin.SOURCE_ANNOTATION] == source
    assert doc["annotations"][twin.SOURCE_ANNOTATION] == index


def test_a_layer_that_is_not_its_diff_id_is_refused() -> None:
    reg = MemoryRegistry()
    source = push_image(reg, wrong=1)
    before = set(reg.blobs)
    with pytest.raises(zstd.LayerMismatch, match=r"not to the config's diff id"):
        twin.make(reg, "torch", source)  # type: ignore[arg-type]
    made = [zstandard.ZstdDecompressor().decompressobj().decompress(reg.blobs[d])
            for d in set(reg.blobs) - before]
    assert TARS[1] not in made and len(made) <= 2  # only layers that match; no manifest
    wrong = doc_of(reg, "gz")["layers"][1]["digest"]
    assert not (twin_cache.folder() / f"{wrong.removeprefix('sha256:')}.json").exists()
    assert all(json.loads(body).get("annotations") is None
               for body, _ in reg.manifests.values())


def test_a_twin_under_its_tag_is_never_reused_and_a_planted_one_is_stale() -> None:
    reg = MemoryRegistry()
    source = push_image(reg)
    first = twin.make(reg, "torch", source)  # type: ignore[arg-type]
    planted = {**doc_of(reg, first.digest), "layers": doc_of(reg, first.digest)["layers"][:2]}
    body = json.dumps(planted).encode()
    reg.put_manifest("torch", "t-zstd", body, oci.OCI_MANIFEST)  # claims `source`, other layers
    reg.put_manifest("torch", "same-zstd", reg.manifests[first.digest][0], first.media_type)
    reg.put_manifest("torch", "old-zstd", json.dumps({"annotations": {}}).encode(),
                     oci.OCI_MANIFEST)  # an older publication's twin: not this source's
    report = twin.Report()
    assert twin.make(reg, "torch", source, report=report) == first  # type: ignore[arg-type]
    assert report.layers == 3  # recompressed, the same digest
    tags = ["t-zstd", "same-zstd", "old-zstd", "missing-zstd"]
    assert twin.stale(reg, "torch", first, source, tags) == [  # type: ignore[arg-type]
        ("t-zstd", oci.sha256(body))]
    reg.manifests["old"] = reg.manifests[source]  # its gzip sibling names the source now
    assert [t for t, _ in twin.stale(reg, "torch", first, source, tags)] == [  # type: ignore[arg-type]
        "t-zstd", "old-zstd"]
    assert twin.tag_of("2.15.0-py3.11-cuda13.2-cudnn9-slim") == \
        "2.15.0-py3.11-cuda13.2-cudnn9-slim-zstd"


def push_index(reg: MemoryRegistry, *sources: tuple[str, str]) -> str:
    """An image index of (digest, architecture) platform manifests."""
    entries = [{"mediaType": oci.DOCKER_MANIFEST, "digest": d, "size": len(reg.manifests[d][0]),
                "platform": {"os": "linux", "architecture": a}} for d, a in sources]
    return reg.put_manifest("torch", "multi", json.dumps(
        {"schemaVersion": 2, "mediaType": oci.OCI_INDEX, "manifests": entries}).encode(),
        oci.OCI_INDEX)


def test_index_twins_get_their_audit_and_a_planted_platform_twin_is_reported(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 40: the per-platform content-tag twins of a multi-platform publication are
    overwritten by the tags step; each one held by a planted twin gets its own line (like the
    top one's)."""
    from types import SimpleNamespace

    from builder.flows import publish_twin
    from builder.model.staged import Staged

    reg = MemoryRegistry()
    amd, arm = push_image(reg, "amd64"), push_image(reg, "arm64")
    index = push_index(reg, (amd, "amd64"), (arm, "arm64"))
    planted = json.dumps({"annotations": {twin.SOURCE_ANNOTATION: amd}}).encode()
    reg.put_manifest("torch", "hash-amd-zstd", planted, oci.OCI_MANIFEST)
    monkeypatch.setattr(publish_twin.oci, "Registry", lambda _addr: reg)
    attached: list[tuple[str, str]] = []
    monkeypatch.setattr(publish_twin, "attach",
                        lambda staged, kind, *_a: attached.append((staged.digest, kind)))
    monkeypatch.setattr(publish_twin.vuln_audit, "attach",
                        lambda staged, found, key: attached.append((staged.digest, found["id"])))
    monkeypatch.setattr(publish_twin, "provenance_of", lambda *_a: json.dumps(
        {"predicate": {"buildDefinition": {"internalParameters": {}}}}).encode())

    def staged(digest: str) -> Staged:
        return Staged(reg.registry, "torch", reg.head("torch", digest), "")  # type: ignore[arg-type]

    cand = SimpleNamespace(evidence={"sbom": b"{}", "smoke": b"{}"},
                           trust=SimpleNamespace(key=None))
    made = publish_twin.promote_twins(
        SimpleNamespace(zstd_twins=True), staged(index),  # type: ignore[arg-type]
        [(staged(amd), cand), (staged(arm), cand)], ["dated", "floating"],  # type: ignore[list-item]
        {amd: "hash-amd", arm: "hash-arm"}, audits={amd: {"id": "audit of amd"}})
    assert made is not None and set(made.platforms) == {amd, arm}
    # Issue 41.7: the twin carries its gzip sibling's audit (only where one was made).
    twin_amd, twin_arm = made.platforms[amd].digest, made.platforms[arm].digest
    assert [kind for d, kind in attached if d == twin_amd] == [
        "sbom", "smoke", "provenance", "audit of amd"]
    assert [kind for d, kind in attached if d == twin_arm] == ["sbom", "smoke", "provenance"]
    replaced = [line.strip() for line in capsys.readouterr().err.splitlines() if "replacing" in line]
    assert replaced == [f"zstd twin `hash-amd-zstd` held {oci.sha256(planted)[:19]}, not the "
                        f"twin made of {amd[:19]}: replacing it"]


def test_the_catalog_sets_twin_tags_apart_and_offers_both() -> None:
    from builder.model import catalog_doc, catalog_page

    tags = catalog_doc.classify(["t", "t-zstd", "t-20260102", "t-20260102-zstd", "build-ab12"])
    assert tags.images == ["t", "t-20260102"] and tags.twins == ["t-20260102-zstd", "t-zstd"]
    assert catalog_doc.TWIN_SUFFIX == twin.SUFFIX
    doc = {"registry": "r:5000", "repository": "torch"}
    variant = {"tag": "t", "zstd": {"tag": "t-zstd", "digest": "sha256:" + "a" * 64,
                                    "size": 1_900_000_000, "gzip_size": 2_000_000_000}}
    (gz_who, gz_cmd), (zs_who, zs_cmd) = catalog_page.pull_choices(doc, variant, "t")
    assert gz_cmd == "docker pull r:5000/torch:t" and "2.0 GB" in gz_who
    assert zs_cmd == "image: r:5000/torch:t-zstd" and "1.9 GB" in zs_who
    assert "containerd" in zs_who and "Docker 20.10" in gz_who
    assert catalog_page.pull_choices(doc, {"tag": "t"}, "t") == []


@pytest.mark.parametrize(("compression", "twins"), [(None, True), (["gzip"], False),
                                                     (["gzip", "zstd"], True)])
def test_the_matrix_turns_twins_on_and_off(tmp_path, compression, twins) -> None:
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    if compression is not None:
        data["compression"] = compression
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(data))
    assert matrix.load(tmp_path / "matrix.yaml").zstd_twins is twins


@pytest.mark.parametrize("compression", [["zstd"], ["gzip", "xz"], []])
def test_gzip_cannot_be_left_out(tmp_path, compression) -> None:
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["compression"] = compression
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(matrix.MatrixError, match="compression"):
        matrix.load(tmp_path / "matrix.yaml")


# ---- the local cache of twin layers (builder.core.twin_cache) --------------------------------

def test_a_layer_made_before_is_referenced_not_recompressed() -> None:
    reg = MemoryRegistry()
    source = push_image(reg)
    first = twin.make(reg, "torch", source)  # type: ignore[arg-type]
    reg.streamed.clear()
    report = twin.Report()
    assert twin.make(reg, "torch", source, report=report) == first  # type: ignore[arg-type]
    assert (report.layers, report.reused, reg.streamed) == (3, 3, [])  # no layer read
    assert report.tar_bytes == sum(map(len, TARS))


def test_a_layer_made_before_is_copied_from_where_it_was_pushed(monkeypatch) -> None:
    """Another registry: the bytes are read from the one the cache names, by their digest."""
    one, two = MemoryRegistry("one.example"), MemoryRegistry("two.example")
    first = twin.make(one, "torch", push_image(one))  # type: ignore[arg-type]
    monkeypatch.setattr(oci, "Registry", {"one.example": one}.__getitem__)
    one.streamed.clear()
    report = twin.Report()
    assert twin.make(two, "torch", push_image(two), report=report) == first  # type: ignore[arg-type]
    assert report.reused == 3 and two.streamed == []  # its gzip layers are never read
    copied = {layer["digest"] for layer in doc_of(two, first.digest)["layers"]}
    assert set(one.streamed) == copied


def test_a_cache_entry_counts_only_for_its_layer_diff_id_and_encoder(monkeypatch) -> None:
    reg = MemoryRegistry()
    twin.make(reg, "torch", push_image(reg))  # type: ignore[arg-type]
    gz = doc_of(reg, "gz")["layers"][0]["digest"]
    assert twin_cache.lookup(gz, diff_id(TARS[0])) is not None
    assert twin_cache.lookup(gz, diff_id(TARS[1])) is None  # another config's diff id
    with monkeypatch.context() as changed:
        changed.setattr(zstd, "ENCODER", zstd.ENCODER + " (another libzstd)")
        assert twin_cache.lookup(gz, diff_id(TARS[0])) is None
    path = twin_cache.folder() / f"{gz.removeprefix('sha256:')}.json"
    path.write_text("{not json")
    assert twin_cache.lookup(gz, diff_id(TARS[0])) is None


def test_a_lying_cache_entry_is_caught_by_verify() -> None:
    """A hand-edited entry (layer 1 → layer 2's zstd blob): publish references what it names,
    and `verify`'s twin row decompresses that layer and finds it is not the config's diff id."""
    reg = MemoryRegistry()
    source = push_image(reg)
    made = doc_of(reg, twin.make(reg, "torch", source).digest)  # type: ignore[arg-type]
    gz = doc_of(reg, "gz")["layers"][0]["digest"]
    entry = twin_cache.lookup(gz, diff_id(TARS[0]))
    other = made["layers"][1]
    assert entry is not None
    twin_cache.remember(replace(entry, digest=other["digest"], size=other["size"]))
    lied = doc_of(reg, twin.make(reg, "torch", source).digest)  # type: ignore[arg-type]
    assert lied["layers"][0]["digest"] == other["digest"]
    problem = verify.twin_layer_problem(reg, "torch", lied)  # type: ignore[arg-type]
    assert problem.startswith("layer 1 (") and "not the config's diff id" in problem
    assert verify.twin_layer_problem(reg, "torch", made) == ""  # type: ignore[arg-type]


def test_the_cache_folder_is_the_users_unless_named(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("BUILDER_TWIN_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert twin_cache.folder() == tmp_path / "xdg" / "torch-images" / "twins"
    monkeypatch.setenv("BUILDER_TWIN_CACHE", str(tmp_path / "session"))
    assert twin_cache.folder() == tmp_path / "session"
