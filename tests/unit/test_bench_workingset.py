"""bench/workingset.py's pure parts: the image's files, fincore's answer, the summary."""

from __future__ import annotations

import os
from pathlib import Path

from bench import workingset


def snapshot_tree(root: Path) -> Path:
    """Two committed snapshots as containerd's overlayfs snapshotter lays them out."""
    (root / "1" / "fs" / "usr" / "lib").mkdir(parents=True)
    (root / "2" / "fs" / "app").mkdir(parents=True)
    (root / "1" / "fs" / "usr" / "lib" / "libtorch.so").write_bytes(b"x" * 8192)
    (root / "2" / "fs" / "app" / "train.py").write_bytes(b"y" * 100)
    os.link(root / "2" / "fs" / "app" / "train.py", root / "2" / "fs" / "app" / "again.py")
    (root / "2" / "fs" / "app" / "link").symlink_to("train.py")
    return root


def test_the_image_files_are_regular_files_once_each(tmp_path: Path) -> None:
    files = workingset.image_files(snapshot_tree(tmp_path))
    assert sorted(files.values()) == [100, 8192]  # the hard link and the symlink: not again


def test_fincores_json_is_read_as_resident_bytes_by_path() -> None:
    text = ('{"fincore": [{"res": 4096, "file": "/a b"}, {"res": 0, "file": "/c"}]}')
    assert workingset.parse_fincore(text) == {"/a b": 4096, "/c": 0}
    assert workingset.parse_fincore("") == {}


def test_the_summary_counts_what_the_start_made_resident(tmp_path: Path) -> None:
    lib, app = (str(tmp_path / "1" / "fs" / "usr" / "lib" / "libtorch.so"),
                str(tmp_path / "2" / "fs" / "app" / "train.py"))
    out = workingset.summary({lib: 8192, app: 100}, before={app: 4096},
                             after={lib: 4096, app: 4096}, root=tmp_path)
    assert (out["bytes"], out["files"], out["image_files"]) == (4096, 1, 2)
    assert out["share"] == round(4096 / 8292, 4) and out["files_share"] == 0.5
    assert out["left_after_eviction"] == 4096
    assert out["top"] == [["/usr/lib/libtorch.so", 4096]]


def test_eviction_flushes_and_drops_a_files_pages(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"z" * 65536)
    workingset.evict([str(path)])  # no error on a just-written (dirty) file
    assert path.read_bytes() == b"z" * 65536
