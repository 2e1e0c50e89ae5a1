"""`python -m bench siblings`: its rows, summary and files, from a made-up catalog document
(the registry side is the catalog's: tests/e2e/test_catalog_e2e.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import siblings
from builder.model import layer_reuse

BASE, TORCH, PKG1, PKG2, TOOLS = ({"digest": f"sha256:{c * 64}", "size": n}
                                  for c, n in zip("12345", (3_000_000, 50_000_000, 1_000_000, 2_000_000, 9_000_000),
                                                  strict=True))


def image(digest: str, flavor: str, layers: list[dict[str, Any]]) -> dict[str, Any]:
    return {"digest": digest, "flavor": flavor, "python": "3.11", "torch": "2.9.1",
            "cuda": "12.8", "accelerator": "cuda",
            "platforms": [{"platform": "linux/amd64", "layers": layers}]}


def document() -> dict[str, Any]:
    images = {"new": image("new", "runtime", [BASE, TORCH, PKG2, TOOLS]),
              "old": image("old", "runtime", [BASE, TORCH, PKG1, TOOLS]),
              "slim": image("slim", "slim", [BASE, TORCH, PKG1])}
    variants = [{"tag": "rt", "digest": "new", "floating": True, "aliases": [],
                 "history": [{"tag": "rt-1", "digest": "old"}, {"tag": "rt-2", "digest": "new"}]},
                {"tag": "sl", "digest": "slim", "floating": True, "aliases": [],
                 "history": [{"tag": "sl-1", "digest": "slim"}]}]
    twins = {d: {"linux/amd64": [{**la, "size": la["size"] // 2} for la in i["platforms"][0][
        "layers"]]} for d, i in images.items() if d != "old"}
    layer_reuse.add_pulls(variants, images, twins)
    return {"variants": variants, "images": images}


def test_rows_cover_siblings_and_rebuilds_and_the_summary_adds_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rows = siblings.pull_rows(document())
    assert [(r["image"], r["held"], r["relation"], r["gzip"], r["zstd"]) for r in rows] == [
        ("rt", "sl", "flavor", 11_000_000, 5_500_000),  # PKG2 and the toolchain
        ("rt-2", "rt-1", "previous build", 2_000_000, None),  # the old build has no twin
        ("sl", "rt", "flavor", 1_000_000, 500_000)]
    sums = siblings.summary(rows)
    assert sums["flavor"] == {"pulls": 2, "gzip": 12_000_000, "gzip_full": 118_000_000,
                              "zstd_pulls": 2, "zstd": 6_000_000, "zstd_full": 59_000_000}
    monkeypatch.setattr(siblings, "HERE", tmp_path)
    (tmp_path / "results.json").write_text('{"pull": {"kept": true}}')
    siblings.write("r:5000/torch", "2026-12-05T00:00:00Z", rows)
    data = json.loads((tmp_path / "results.json").read_text())
    assert data["pull"] == {"kept": True} and len(data["siblings"]["rows"]) == 3
    text = (tmp_path / "SIBLINGS.md").read_text()
    assert "| flavor | 2 | 12.0 / 118.0 MB | 10 % | 6.0 / 59.0 MB (2 with twins) | 10 % |" in text
    assert "| rt-2 | linux/amd64 | rt-1 | previous build | 64.0 | 2.0 | 32.0 | - |" in text
