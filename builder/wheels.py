"""Which pythons a torch release has wheels for, read from its index (PEP 691 JSON), cached."""

from __future__ import annotations

import json
import re
import ssl
import urllib.request
from pathlib import Path

from builder import proc, state
from builder.matrix import Variant

PYPI_SIMPLE = "https://pypi.org/simple/torch/"


def _filenames_from_index(url: str, timeout: float = 10.0) -> list[str]:
    cache = state.path("cache") / (re.sub(r"[^A-Za-z0-9]+", "_", url) + ".json")
    if cache.exists():
        return json.loads(cache.read_text())
    request = urllib.request.Request(url, headers={
        "Accept": "application/vnd.pypi.simple.v1+json"})
    context = ssl.create_default_context(cafile=proc.host_ca_bundle())
    with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
        names = [f["filename"] for f in json.load(response)["files"]]
    state.atomic_write(cache, json.dumps(names))
    return names


def filenames(variant: Variant) -> list[str] | None:
    """Candidate torch file names for the variant's sources; None when none could be read."""
    names: list[str] = []
    for link in variant.find_links:
        if link.startswith("/") and Path(link).is_dir():
            names += [p.name for p in Path(link).iterdir()]
    index = variant.index_url.rstrip("/") + "/torch/" if variant.index_url else PYPI_SIMPLE
    try:
        names += _filenames_from_index(index)
    except (OSError, ValueError, KeyError):
        if not names:
            return None
    return names


def has_wheel(variant: Variant, names: list[str]) -> bool:
    tag = "cp" + variant.python.replace(".", "")
    version = re.escape(variant.torch)
    return any(re.match(rf"torch-{version}-{tag}-", n.replace("%2B", "+")) for n in names)


def missing_wheel_problems(variants: list[Variant]) -> tuple[list[str], list[str]]:
    """(problems, notes): a python with no torch wheel is a problem; an unreadable index a note."""
    problems, notes = [], []
    for v in variants:
        names = filenames(v)
        if names is None:
            notes.append(f"{v.id}: could not read the package index; wheel check skipped")
        elif not has_wheel(v, names):
            problems.append(f"{v.id}: torch {v.torch} has no wheel for python {v.python} "
                            f"(cp{v.python.replace('.', '')})")
    return problems, notes
