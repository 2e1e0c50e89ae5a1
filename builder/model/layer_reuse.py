"""The layers a node keeps: what a node already holding one image must still pull for another.

A runtime pulls a layer only when its digest is not in the node's content store, so the bytes
of image B for a node holding image A are the sizes of B's layers whose digests A lacks (a
digest listed twice is pulled once). Only layers count: the config blob adds a few kB.

The catalog tells it for each image's siblings (same repository, platform and accelerator; the
image another flavor, another python or the torch before or after it) and for the weekly
rebuild (the dated build before it), gzip and zstd twin alike: twins of shared gzip layers are
the same zstd layers (builder.core.zstd is deterministic), so they stay shared.

Pure functions of what the registry returned (the catalog's image facts and the twins' layer
lists); builder.stages.catalog reads them, the site and `python -m bench siblings` print them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from smoke.versions import numeric

Layers = Sequence[Mapping[str, Any]]  # descriptors: {"digest": …, "size": …}
# platform → that platform's twin layers, per gzip image digest
TwinLayers = Mapping[str, Mapping[str, Layers]]
AXES = ("flavor", "python", "torch")
REBUILD = "previous build"


def unique(layers: Layers) -> dict[str, int]:
    """digest → size, each digest once."""
    return {str(layer["digest"]): int(layer["size"]) for layer in layers}


def pull_bytes(wanted: Layers, held: Layers) -> int:
    """Bytes of `wanted`'s layers whose digests are not in `held`."""
    have = {layer["digest"] for layer in held}
    return sum(size for digest, size in unique(wanted).items() if digest not in have)


def shared_bytes(wanted: Layers, held: Layers) -> int:
    """Bytes of `wanted`'s layers that `held` has too (a registry and a node store them once)."""
    return sum(unique(wanted).values()) - pull_bytes(wanted, held)


# ---- which images are siblings ----------------------------------------------------------------


def relation(image: Mapping[str, Any], other: Mapping[str, Any]) -> str | None:
    """The axis `other` differs on (flavor, python or torch), when it is the only one; None for
    another accelerator, two axes, or the same variant. A torch step may change CUDA with it
    (each torch ships for its own CUDA); a flavor or python step may not."""
    if image.get("accelerator") != other.get("accelerator"):
        return None
    differ = [axis for axis in AXES if image.get(axis) != other.get(axis)]
    if len(differ) != 1 or (differ != ["torch"] and image.get("cuda") != other.get("cuda")):
        return None
    return differ[0]


def siblings(digest: str, images: Mapping[str, Mapping[str, Any]],
             tags: Iterable[tuple[str, str]]) -> list[tuple[str, str, str]]:
    """(relation, tag, digest) of the siblings of image `digest` among (tag, digest) pairs: each
    image once (under the first of its tags given), and of the other torch versions only the
    nearest below and above."""
    image = images[digest]
    found: dict[str, tuple[str, str]] = {}
    for tag, other_digest in tags:
        why = relation(image, images[other_digest]) if other_digest != digest else None
        if why and other_digest not in found:
            found[other_digest] = (why, tag)
    return [(why, tag, d) for d, (why, tag) in found.items()
            if why != "torch" or d in nearest_torch(image, images, found)]


def nearest_torch(image: Mapping[str, Any], images: Mapping[str, Mapping[str, Any]],
                  found: Mapping[str, tuple[str, str]]) -> set[str]:
    """The digests of the torch step below and the one above `image`'s torch."""
    mine = numeric(image.get("torch"))
    steps = sorted((numeric(images[d].get("torch")), d) for d, (why, _) in found.items()
                   if why == "torch")
    below = [d for version, d in steps if version < mine]
    above = [d for version, d in steps if version > mine]
    return set(below[-1:] + above[:1])


# ---- the bytes of each pull -------------------------------------------------------------------


def platform_pulls(wanted: Mapping[str, Any], held: Mapping[str, Any],
                   twins: TwinLayers) -> list[dict[str, Any]]:
    """Per platform both images have: the full pull of `wanted` and its pull on a node holding
    `held`, gzip and zstd (None without a twin of both)."""
    have = {p["platform"]: p["layers"] for p in held.get("platforms") or []}
    mine_z = twins.get(wanted.get("digest") or "") or {}
    have_z = twins.get(held.get("digest") or "") or {}
    out = []
    for platform in wanted.get("platforms") or []:
        name = platform["platform"]
        if name not in have:
            continue
        both = name in mine_z and name in have_z
        out.append({"platform": name,
                    "gzip": pull_bytes(platform["layers"], have[name]),
                    "gzip_full": sum(unique(platform["layers"]).values()),
                    "zstd": pull_bytes(mine_z[name], have_z[name]) if both else None,
                    "zstd_full": sum(unique(mine_z[name]).values()) if name in mine_z
                    else None})
    return out


def pull_row(why: str, tag: str, digest: str, wanted: Mapping[str, Any],
             images: Mapping[str, Mapping[str, Any]], twins: TwinLayers) -> dict[str, Any]:
    """One line of a page's table: a node holding `tag` (`digest`) pulls `wanted`."""
    return {"relation": why, "tag": tag, "digest": digest,
            "platforms": platform_pulls(wanted, images[digest], twins)}


def add_pulls(variants: list[dict[str, Any]], images: Mapping[str, Mapping[str, Any]],
              twins: TwinLayers) -> None:
    """Each floating variant's `siblings` (one pull row each) and each dated build's
    `previous` (its pull on a node holding the dated build before it: the weekly rebuild)."""
    floating = [(v["tag"], v["digest"]) for v in sorted(  # a variant's own tag before an alias
        variants, key=lambda v: (not v["history"], v["tag"]))
        if v["floating"] and v["digest"] in images]
    for variant in variants:
        for before, after in itertools.pairwise(variant["history"]):
            after["previous"] = pull_row(REBUILD, before["tag"], before["digest"],
                                         images[after["digest"]], images, twins)
        if variant["floating"] and variant["digest"] in images:
            image = images[variant["digest"]]
            variant["siblings"] = [pull_row(why, tag, digest, image, images, twins)
                                   for why, tag, digest in siblings(variant["digest"], images,
                                                                    floating)]


def rows_for(variant: Mapping[str, Any], digest: str,
             entry: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The pull rows a page shows: a floating tag's (or its current dated tag's) siblings, then
    its weekly rebuild; an older dated tag's rebuild only."""
    history = [h for h in variant.get("history") or [] if h["digest"] == digest]
    current = entry if entry is not None else (history[-1] if history else None)
    rows = list(variant.get("siblings") or []) if digest == variant.get("digest") else []
    previous = (current or {}).get("previous")
    return [row for row in [*rows, previous] if row and row["platforms"]]
