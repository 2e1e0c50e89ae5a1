"""The CRI messages bench/cri.py encodes by hand, and the report's CRI figures."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench import cri, pullreport
from builder.core.errors import BuilderError


def test_a_pull_request_is_imagespec_image_in_field_one() -> None:
    ref = "127.0.0.1:5000/torch:" + "t" * 200  # a length over 127 takes a two-byte varint
    body = cri.pull_request(ref)
    inner = cri.field(1, ref.encode())
    assert body == b"\x0a" + cri.varint(len(inner)) + inner
    assert cri.strings(inner) == {1: ref} and len(cri.varint(len(inner))) == 2


def test_a_response_is_read_by_field_number_skipping_others() -> None:
    body = cri.varint(2 << 3 | 0) + cri.varint(300) + cri.field(1, b"sha256:abc")
    assert cri.strings(body) == {1: "sha256:abc"}


def test_the_config_keeps_containerd_to_its_own_folders(tmp_path: Path) -> None:
    text = cri.config_text(tmp_path / "root", tmp_path / "state", tmp_path / "s.sock",
                           tmp_path / "certs.d")
    assert f'root = "{tmp_path}/root"' in text and f'address = "{tmp_path}/s.sock"' in text
    assert f'config_path = "{tmp_path}/certs.d"' in text and "disable_tcp_service = true" in text
    assert "mirrors" not in text  # containerd 2.x would fall back from its transfer service


def test_a_loopback_registry_is_reached_over_plain_http() -> None:
    assert cri.hosts_toml("127.0.0.1:5035") == 'server = "http://127.0.0.1:5035"\n'


def test_a_page_cache_the_bench_may_not_empty_is_one_line_naming_the_file(
        monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(cri, "DROP_CACHES", tmp_path / "absent" / "drop_caches")
    for call in (cri.can_empty_page_cache, cri.fresh_page_cache):
        with pytest.raises(BuilderError, match=re.escape(f"`{tmp_path}/absent/drop_caches`")) \
                as caught:
            call()
        assert "\n" not in str(caught.value) and "root" in caught.value.hint


def test_the_cri_figures_are_zstd_over_gzip_with_the_goals_on_the_cuda_slim() -> None:
    run = {"s": 10.0, "start_s": 4.0, "to_matmul_s": 14.0, "cpu_s": 20.0, "cpu_own_s": 12.0,
           "cpu_children_s": 8.0, "bytes": 2e9, "load": 1.0}
    v = {"id": pullreport.CUDA_SLIM, "cri": {"system": {
        "containerd": {"unpigz": "/usr/bin/unpigz"}, "gzip": run,
        "zstd": {**run, "to_matmul_s": 7.0, "cpu_s": 10.0, "cpu_own_s": 10.0,
                 "cpu_children_s": 0.0}}}}
    wall, cpu = pullreport.cri_figures(v, "system")
    assert (wall.ratio, cpu.ratio) == (0.5, 0.5)
    assert "goal ≤ 0.7" in wall.note and "goal ≤ 0.55" in cpu.note
    assert "page cache before the pull: kept" in wall.note  # runs from before it was emptied
    v["cri"]["system"]["zstd"]["page_cache"] = "emptied"
    assert "page cache before the pull: emptied" in pullreport.cri_figures(v, "system")[0].note
    assert "own (utime+stime) 10.0 / 12.0 s (0.83)" in cpu.note
    assert "children (cutime+cstime) 0.0 / 8.0 s; unpigz on its PATH" in cpu.note
    assert pullreport.cri_figures(v, "debian-13") == pullreport.cri_figures({"id": "x"}, "s")
    assert pullreport.cri_figures({"id": "x"}, "s") == []


WS = {"bytes": 1_180_000_000, "files": 3400, "image_bytes": 4_540_000_000, "image_files": 5000,
      "share": 0.2599, "files_share": 0.68, "left_after_eviction": 0,
      "top": [["/usr/lib/libtorch_cpu.so", 900_000_000], ["/usr/bin/python3.11", 6_000_000]]}


def test_the_working_set_figure_is_bytes_read_against_the_unpacked_image() -> None:
    (fig,) = pullreport.working_set_figures("cpu", WS)
    assert (fig.value, fig.baseline, fig.ratio) == (1180.0, 4540.0, 0.2599)
    assert "files 3400 of 5000 (68%)" in fig.note and "libtorch_cpu.so 900 MB" in fig.note
    assert pullreport.working_set_figures("cpu", None) == []
