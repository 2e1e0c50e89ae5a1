"""The tags a publish writes, and the rules that keep them from colliding.

Per variant: the floating tag (`2.9.1-py3.11-cuda12.8-cudnn9-runtime`), the immutable dated tag
(`<floating>-YYYYMMDD[.n]`), the content tag (`build-<hash20>`), the artifact tags
(`sha256-<hex>.sbom|.smoke`) and the matrix's aliases. An alias may only take a name none of the
generated shapes can produce, and no two owners may share a tag.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

HASH_TAG_PREFIX = "build-"
ARTIFACT_TAG_PREFIX = "sha256-"
DATED = re.compile(r"-[0-9]{8}(\.[0-9]+)?$")
FLOATING = re.compile(
    r"^[0-9]+\.[0-9]+\.[0-9]+-py[0-9]+\.[0-9]+-(cpu|cuda[0-9]+\.[0-9]+-cudnn[0-9]+)"
    r"-(devel|runtime|slim)$")


def alias_shape_problem(tag: str) -> str | None:
    """Why `tag` cannot be an alias (it has a generated tag's shape), or None."""
    if DATED.search(tag):
        return (f"alias `{tag}` has the shape of a dated tag (…-YYYYMMDD[.n]); dated tags never "
                "move, so an alias may not look like one")
    if tag.startswith(HASH_TAG_PREFIX):
        return f"alias `{tag}` starts with `{HASH_TAG_PREFIX}`, which content tags use"
    if tag.startswith(ARTIFACT_TAG_PREFIX):
        return f"alias `{tag}` starts with `{ARTIFACT_TAG_PREFIX}`, which SBOM/smoke tags use"
    if FLOATING.match(tag):
        return f"alias `{tag}` has the shape of a variant's floating tag"
    return None


def collisions(owned: Iterable[tuple[str, str]]) -> list[str]:
    """(tag, owner) pairs → one message per tag that more than one owner would write."""
    owners: dict[str, list[str]] = {}
    for tag, owner in owned:
        owners.setdefault(tag, []).append(owner)
    return [f"tag `{tag}` would be written by {' and '.join(who)}"
            for tag, who in owners.items() if len(who) > 1]
