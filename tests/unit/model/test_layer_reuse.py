"""The layers a node keeps (builder.model.layer_reuse), with made-up descriptors."""

from __future__ import annotations

from typing import Any

from builder.model import catalog_page, layer_reuse

BASE, PY311, PY312, TORCH29, TORCH215, PKG1, PKG2, TOOLS = (
    {"digest": f"sha256:{c * 64}", "size": size}
    for c, size in zip("12345678", (30, 10, 11, 500, 700, 4, 5, 90), strict=True))
ZBASE, ZPY311, ZTORCH29, ZPKG1, ZPKG2, ZTOOLS = (
    {"digest": f"sha256:{c * 64}", "size": size}
    for c, size in zip("abcdef", (20, 8, 300, 3, 4, 60), strict=True))


def image(digest: str, layers: list[dict[str, Any]], *, flavor: str = "runtime",
          python: str = "3.11", torch: str = "2.9.1", cuda: str | None = "12.8",
          accelerator: str = "cuda", platforms: tuple[str, ...] = ("linux/amd64",)
          ) -> dict[str, Any]:
    return {"digest": digest, "flavor": flavor, "python": python, "torch": torch, "cuda": cuda,
            "accelerator": accelerator,
            "platforms": [{"platform": p, "layers": layers} for p in platforms]}


def test_a_pull_is_the_layers_the_node_lacks_each_digest_once() -> None:
    runtime = [BASE, PY311, TORCH29, PKG1, TOOLS]
    slim = [BASE, PY311, TORCH29, PKG1]
    assert layer_reuse.pull_bytes(runtime, slim) == 90  # the toolchain layer
    assert layer_reuse.pull_bytes(slim, runtime) == 0
    assert layer_reuse.pull_bytes(runtime, []) == 30 + 10 + 500 + 4 + 90
    assert layer_reuse.pull_bytes([BASE, BASE, TOOLS], []) == 120  # a digest is pulled once
    assert layer_reuse.shared_bytes(runtime, slim) == 30 + 10 + 500 + 4


def test_siblings_differ_in_one_axis_and_only_the_nearest_torch_counts() -> None:
    images = {
        "me": image("me", []),
        "slim": image("slim", [], flavor="slim"),
        "py312": image("py312", [], python="3.12"),
        "both": image("both", [], python="3.12", flavor="slim"),  # two axes: not a sibling
        "t27": image("t27", [], torch="2.7.1", cuda="12.6"),  # a torch step may change CUDA
        "t25": image("t25", [], torch="2.5.1", cuda="12.4"),  # not the nearest below
        "t215": image("t215", [], torch="2.15.0", cuda="13.2"),  # 2.15 > 2.9, not as text
        "cpu": image("cpu", [], accelerator="cpu", cuda=None, torch="2.9.1+cpu"),
        "cu126": image("cu126", [], cuda="12.6"),  # the same torch on another CUDA
    }
    tags = [(name, name) for name in images] + [("latest", "slim")]  # an alias, given last
    found = layer_reuse.siblings("me", images, tags)
    assert found == [("flavor", "slim", "slim"), ("python", "py312", "py312"),
                     ("torch", "t27", "t27"), ("torch", "t215", "t215")]


def test_each_pull_row_has_gzip_and_zstd_per_platform_both_images_have() -> None:
    arm = ("linux/amd64", "linux/arm64")
    images = {"rt": image("rt", [BASE, PY311, TORCH29, PKG1, TOOLS], platforms=arm),
              "slim": image("slim", [BASE, PY311, TORCH29, PKG1], flavor="slim"),
              "old": image("old", [BASE, PY311, TORCH29, PKG2, TOOLS], platforms=arm)}
    twins = {"rt": {"linux/amd64": [ZBASE, ZPY311, ZTORCH29, ZPKG1, ZTOOLS]},
             "old": {"linux/amd64": [ZBASE, ZPY311, ZTORCH29, ZPKG2, ZTOOLS]}}
    row = layer_reuse.pull_row("flavor", "slim-tag", "slim", images["rt"], images, twins)
    assert row == {"relation": "flavor", "tag": "slim-tag", "digest": "slim", "platforms": [
        {"platform": "linux/amd64", "gzip": 90, "gzip_full": 634, "zstd": None,
         "zstd_full": 391}]}  # slim has no twin; it has no linux/arm64 either
    rebuild = layer_reuse.platform_pulls(images["rt"], images["old"], twins)
    assert [(p["platform"], p["gzip"], p["zstd"]) for p in rebuild] == [
        ("linux/amd64", 4, 3), ("linux/arm64", 4, None)]  # only PKG1 is new


def variant(tag: str, digest: str, history: list[tuple[str, str]]) -> dict[str, Any]:
    return {"tag": tag, "digest": digest, "floating": True, "aliases": [],
            "history": [{"tag": t, "digest": d} for t, d in history]}


def test_add_pulls_writes_siblings_and_each_rebuild_and_a_page_picks_its_rows() -> None:
    images = {"rt2": image("rt2", [BASE, PY311, TORCH29, PKG2, TOOLS]),
              "rt1": image("rt1", [BASE, PY311, TORCH29, PKG1, TOOLS]),
              "slim": image("slim", [BASE, PY311, TORCH29, PKG1], flavor="slim")}
    variants = [variant("rt", "rt2", [("rt-1201", "rt1"), ("rt-1204", "rt2")]),
                variant("slim", "slim", [("slim-1204", "slim")]),
                variant("latest-slim", "slim", [])]  # an alias: the variant's tag is listed
    layer_reuse.add_pulls(variants, images, {})
    runtime = variants[0]
    assert [(r["relation"], r["tag"], r["platforms"][0]["gzip"])
            for r in runtime["siblings"]] == [("flavor", "slim", 5 + 90)]
    previous = runtime["history"][1]["previous"]
    assert (previous["tag"], previous["platforms"][0]["gzip"]) == ("rt-1201", 5)
    assert "previous" not in runtime["history"][0]
    floating = layer_reuse.rows_for(runtime, "rt2", None)
    assert [r["relation"] for r in floating] == ["flavor", layer_reuse.REBUILD]
    assert layer_reuse.rows_for(runtime, "rt1", runtime["history"][0]) == []  # the first build
    dated = layer_reuse.rows_for(runtime, "rt2", runtime["history"][1])
    assert [r["relation"] for r in dated] == ["flavor", layer_reuse.REBUILD]


def test_the_page_says_what_the_held_image_is() -> None:
    me = image("me", [])
    words = catalog_page.relation_words
    assert words("torch", me, image("x", [], torch="2.15.0")) == "the torch after: 2.15.0"
    assert words("torch", me, image("x", [], torch="2.7.1")) == "the torch before: 2.7.1"
    assert words("flavor", me, image("x", [], flavor="slim")) == "another flavor: slim"
    assert words(layer_reuse.REBUILD, me, me) == "the build before (the weekly rebuild)"
