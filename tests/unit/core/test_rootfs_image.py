"""builder.core.rootfs_image against an in-memory registry: the same tarball pushes to the same
manifest, reads back byte for byte, and a foreign-platform base (stages.base.foreign_config) keeps
its platform and diff id in the config it pushes."""

from __future__ import annotations

import gzip
import json

import pytest
from memregistry import MemoryRegistry

from builder.core import oci, reproducible, rootfs_image
from builder.model import platforms
from builder.stages import base


def test_the_same_tarball_gives_the_same_manifest_and_comes_back(tmp_path) -> None:
    reg, tar = MemoryRegistry(), tmp_path / "rootfs.tar"
    tar.write_bytes(b"rootfs bytes" * 4000)
    config = b'{"rootfs":{"diff_ids":["%s"]}}' % reproducible.file_digest(tar).encode()
    first = rootfs_image.push(reg, "repo", tar, config, ["a", "b"])
    assert rootfs_image.push(reg, "repo", tar, config, ["c"]) == first
    image = rootfs_image.layout(reg, "repo", first)  # type: ignore[arg-type]
    assert (image.config_digest, image.diff_id) == (oci.sha256(config),
                                                    reproducible.file_digest(tar))
    rootfs_image.fetch(reg, "repo", image, tmp_path / "back.tar")  # type: ignore[arg-type]
    assert (tmp_path / "back.tar").read_bytes() == tar.read_bytes()


def test_a_cut_gzip_stream_is_refused(tmp_path) -> None:
    reg, tar = MemoryRegistry(), tmp_path / "rootfs.tar"
    tar.write_bytes(b"rootfs bytes" * 4000)
    config = b'{"rootfs":{"diff_ids":["%s"]}}' % reproducible.file_digest(tar).encode()
    image = rootfs_image.layout(reg, "repo", rootfs_image.push(  # type: ignore[arg-type]
        reg, "repo", tar, config, ["a"]))  # type: ignore[arg-type]
    reg.tamper(image.layer_digest, gzip.compress(tar.read_bytes())[:-20])
    with pytest.raises(oci.RegistryError, match="cut short"):
        rootfs_image.fetch(reg, "repo", image, tmp_path / "back.tar")  # type: ignore[arg-type]
    assert not (tmp_path / "back.tar").exists()


def test_a_foreign_base_is_pushed_with_its_platform_and_diff_id(tmp_path) -> None:
    reg, tar = MemoryRegistry(), tmp_path / "rootfs.tar"
    tar.write_bytes(b"arm64 rootfs" * 4000)
    arm = platforms.get("linux/arm64")
    digest = rootfs_image.push(reg, "repo-base", tar,  # type: ignore[arg-type]
                               base.foreign_config("bookworm", arm, tar, "k"), ["t"])
    image = rootfs_image.layout(reg, "repo-base", digest)  # type: ignore[arg-type]
    config = json.loads(reg.blob("repo-base", image.config_digest))
    assert config["architecture"] == "arm64" and config["config"]["Labels"] == {base.KEY_LABEL: "k"}
    assert image.diff_id == reproducible.file_digest(tar)
    assert base.registry_base_digest(reg, "repo-base", "t") == platforms.layers_digest(  # type: ignore[arg-type]
        [image.diff_id])
