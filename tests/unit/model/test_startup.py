""""Bytes needed to start" on the catalog's pages, from the bench's results (builder.model.startup)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.core.errors import BuilderError
from builder.model import catalog_page, startup

GZ, ZS, OTHER = (f"sha256:{c * 64}" for c in "abc")
BENCH = {"pull": {"started": "2026-12-06T04:10:00Z", "results": [
    {"id": "v-cpu", "gzip_digest": GZ, "twin": {"twin": ZS},
     "working_set": {"bytes": 300_000_000, "image_bytes": 1_200_000_000, "share": 0.25,
                     "files": 900, "image_files": 1500, "top": []}},
    {"id": "v-old", "gzip_digest": OTHER, "twin": {"twin": OTHER}}]}}  # before the bench had it


def records(tmp_path: Path) -> list[dict]:
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"mode": "x", **BENCH}))
    return startup.load(path)


def test_only_variants_with_a_working_set_are_read(tmp_path: Path) -> None:
    [found] = records(tmp_path)
    assert found["variant"] == "v-cpu" and found["digests"] == [GZ, ZS]
    assert startup.load(tmp_path / "absent.json") == [] and startup.load(None) == []


def test_an_unreadable_results_file_is_one_error_with_a_hint(tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text("{")
    with pytest.raises(BuilderError, match="bench results") as caught:
        startup.load(tmp_path / "r.json")
    assert caught.value.hint


def test_an_image_matches_by_digest_then_by_variant_else_not_measured(tmp_path: Path) -> None:
    found = records(tmp_path)
    images = {ZS: {"variant": "v-cpu"}, OTHER: {"variant": "v-cpu"}, GZ + "x": {}}
    startup.add(images, found)
    assert images[ZS]["startup"]["same_digest"] is True
    assert images[OTHER]["startup"]["same_digest"] is False
    assert images[OTHER]["startup"]["measured_on"] == GZ
    assert "startup" not in images[GZ + "x"]


def test_the_page_says_bytes_share_and_files_or_not_measured(tmp_path: Path) -> None:
    found = startup.for_image(records(tmp_path), GZ, None)
    assert catalog_page.startup_words(found) == "300.0 MB (25% of 1.2 GB), 900 files"
    near = startup.for_image(records(tmp_path), OTHER, "v-cpu")
    assert catalog_page.startup_words(near).endswith("measured on another build of this variant")
    assert catalog_page.startup_words(None) == "not measured"


def test_the_catalog_reads_the_bench_results_by_default_unless_told_otherwise() -> None:
    """Issue 42: bench/results.json when present; --startup overrides; --no-startup reads
    none (and a missing file is nothing measured: see the test above)."""
    from builder.cli import build_parser

    def chosen(*argv: str) -> Path | None:
        args = build_parser().parse_args(["catalog", "--out", "site", *argv])
        return startup.results_path(args.startup, args.no_startup)

    assert chosen() == Path("bench/results.json") == startup.DEFAULT
    assert chosen("--startup", "other.json") == Path("other.json")
    assert chosen("--no-startup") is None
    with pytest.raises(SystemExit):
        chosen("--startup", "other.json", "--no-startup")
