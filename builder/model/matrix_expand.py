"""The matrix's combinations, by GitHub Actions matrix rules: the product of `axes`, minus
`exclude`, then each `include` entry merged into every combination whose original axis values it
does not overwrite (or a new combination when it fits none); then one combination per platform.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from builder.model.matrix_yaml import Path_, Problem, line_of
from builder.model.platforms import DEFAULT as DEFAULT_PLATFORM

MAX_COMBINATIONS = 10_000  # of the axes, before include and platforms
MAX_MERGES = 1_000_000  # include entries merged into combinations


def expand(axes: Mapping[str, Sequence[Any]], include: Sequence[Mapping[str, Any]],
           exclude: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[int]]:
    """GitHub Actions matrix semantics. Returns the combinations and, for each, the index of
    the include entry that created it (-1 for combinations from the axes).

    An include entry merges into every combination from the axes whose axis values it does not
    contradict. Those are found by lookup in an index per set of axis keys, not by comparing
    every entry with every combination, so a long include list costs linear time."""
    keys = list(axes)
    combos = [dict(zip(keys, values, strict=True)) for values in itertools.product(*axes.values())]
    excluded = exclude_matcher(exclude)
    combos = [c for c in combos if not excluded(c)]
    matching = _axis_index(combos, keys)
    added: list[dict[str, Any]] = []
    origin = [-1] * len(combos)
    merges = 0
    for index, entry in enumerate(include):
        hits = matching(entry)
        merges += len(hits)
        if merges > MAX_MERGES:
            raise ExpansionTooLarge(Problem(0, ("include", index), (
                f"include merges into more than {MAX_MERGES} combinations in all (the limit): "
                "name axis values in each entry")))
        # Only combinations from the axes take merges; those added by include never do.
        for i in hits:
            combos[i].update(entry)
        if not hits:
            added.append(dict(entry))
            origin.append(index)
    return combos + added, origin


class ExpansionTooLarge(Exception):
    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def _axis_index(combos: Sequence[Mapping[str, Any]], keys: Sequence[str]
                ) -> Callable[[Mapping[str, Any]], list[int]]:
    """entry → the positions of the combinations whose original axis values equal the entry's
    (on the axis keys it names), from one dict per distinct set of named axis keys."""
    originals = [tuple(_hashable(c[k]) for k in keys) for c in combos]
    by_keys: dict[tuple[int, ...], dict[tuple[Any, ...], list[int]]] = {}

    def matching(entry: Mapping[str, Any]) -> list[int]:
        named = tuple(i for i, k in enumerate(keys) if k in entry)
        if named not in by_keys:
            table: dict[tuple[Any, ...], list[int]] = {}
            for pos, values in enumerate(originals):
                table.setdefault(tuple(values[i] for i in named), []).append(pos)
            by_keys[named] = table
        return by_keys[named].get(tuple(_hashable(entry[keys[i]]) for i in named), [])

    return matching


def exclude_matcher(exclude: Sequence[Mapping[str, Any]]) -> Callable[[Mapping[str, Any]], bool]:
    """Whether any exclude entry is a subset of a combination, with one set lookup per distinct
    key set instead of comparing every combination with every entry."""
    index: dict[tuple[str, ...], set[tuple[Any, ...]]] = {}
    for entry in exclude:
        keys = tuple(sorted(entry))
        index.setdefault(keys, set()).add(tuple(_hashable(entry[k]) for k in keys))

    def excluded(combo: Mapping[str, Any]) -> bool:
        return any(tuple(_hashable(combo.get(k)) for k in keys) in values
                   for keys, values in index.items())

    return excluded


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return json.dumps(value, sort_keys=True, default=str)
    return value


def combinations_problem(data: Mapping[str, Any], lines: Mapping[Path_, int]) -> Problem | None:
    """The axes' product past its cap, counted before anything is expanded."""
    count = math.prod(len(values) for values in data["axes"].values())
    if count <= MAX_COMBINATIONS:
        return None
    return Problem(line_of(lines, ("axes",)), ("axes",), f"the axes make {count} combinations; "
                   f"the limit is {MAX_COMBINATIONS}: use include for the rare ones")


def expand_platforms(combos: Sequence[dict[str, Any]], origin: Sequence[int],
                     data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[int]]:
    """One combination per target platform. A combination's platforms come from a `platform`
    axis, else its own `platforms` (an include entry), else the top-level `platforms`, else
    linux/amd64. `exclude` entries naming a platform then remove single platforms."""
    default = data.get("platforms") or [DEFAULT_PLATFORM]
    dropped = exclude_matcher([e for e in data.get("exclude", []) if "platform" in e])
    out: list[dict[str, Any]] = []
    out_origin: list[int] = []
    for combo, index in zip(combos, origin, strict=True):
        names = [combo["platform"]] if "platform" in combo else combo.get("platforms", default)
        for name in names:
            single = {k: v for k, v in combo.items() if k != "platforms"} | {"platform": name}
            if not dropped(single):
                out.append(single)
                out_origin.append(index)
    return out, out_origin
