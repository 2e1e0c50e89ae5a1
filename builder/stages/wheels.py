"""Which pythons a torch release has wheels for, read from its index (PEP 691 JSON), cached."""

from __future__ import annotations

import json
import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from builder.core import settings, simple_index, state
from builder.core.errors import BuilderError
from builder.model import platforms
from builder.model.matrix import Variant

PYPI_SIMPLE = "https://pypi.org/simple/torch/"
# Whether torch alone, resolved for a variant's python and platform, brings NVIDIA's CUDA
# libraries (None: cannot tell). builder.stages.locks.torch_pulls_cuda, passed in by the command.
CudaResolver = Callable[[Variant], bool | None]


def _cache_file(url: str) -> Path:
    return state.path("cache") / (re.sub(r"[^A-Za-z0-9]+", "_", url) + ".json")


def _get(url: str, timeout: float, accept: str = "*/*") -> bytes:
    with simple_index.open_url(url, timeout, accept) as response:
        return response.read()


def _index_files(url: str, timeout: float = 10.0) -> list[dict[str, Any]]:
    """The index's files: name, url and whether it serves the METADATA apart (PEP 658)."""
    cache = _cache_file(url + "#files")
    if cache.exists():
        return json.loads(cache.read_text())
    doc = json.loads(_get(url, timeout, "application/vnd.pypi.simple.v1+json"))
    files = [{"filename": f["filename"], "url": urllib.parse.urljoin(url, f["url"]),
              "metadata": bool(f.get("core-metadata") or f.get("data-dist-info-metadata"))}
             for f in doc["files"]]
    state.atomic_write(cache, json.dumps(files))
    return files


def _filenames_from_index(url: str, timeout: float = 10.0) -> list[str]:
    return [f["filename"] for f in _index_files(url, timeout)]


def wheel_metadata(variant: Variant, filename: str, timeout: float = 20.0) -> str | None:
    """A wheel's METADATA from its index (PEP 658), cached; None when not served that way."""
    try:
        found = [f for f in _index_files(index_for(variant)) if f["filename"] == filename]
        if not found or not found[0]["metadata"]:
            return None
        cache = _cache_file(found[0]["url"].split("#")[0] + ".metadata")
        if not cache.exists():
            text = _get(found[0]["url"].split("#")[0] + ".metadata", timeout).decode()
            state.atomic_write(cache, json.dumps(text))
        return json.loads(cache.read_text())
    except (OSError, ValueError, KeyError):
        return None


def is_cuda_build(variant: Variant, filename: str, resolve_cuda: CudaResolver) -> bool | None:
    """Whether the variant's torch wheel for its platform pulls NVIDIA's CUDA libraries: from
    its METADATA (PEP 658) when the index serves it, else from resolving `torch` alone for
    that python and platform (`resolve_cuda`: uv, about a second; cached). None when neither
    answers."""
    metadata = wheel_metadata(variant, filename)
    if metadata is not None:
        return platforms.requires_cuda(metadata, platforms.get(variant.platform), variant.python)
    cache = _cache_file(f"cuda-build-{filename}-{variant.platform}-{index_for(variant)}")
    if not cache.exists():
        cuda = resolve_cuda(variant)
        if cuda is None:
            return None
        state.atomic_write(cache, json.dumps(cuda))
    return json.loads(cache.read_text())


def index_for(variant: Variant) -> str:
    return variant.index_url.rstrip("/") + "/torch/" if variant.index_url else PYPI_SIMPLE


def filenames(variant: Variant) -> list[str] | None:
    """Candidate torch file names for the variant's sources; None when none could be read."""
    names: list[str] = []
    for link in settings.current().wheel_sources(variant.find_links):
        if not settings.is_url(link) and Path(link).is_dir():
            names += [p.name for p in Path(link).iterdir()]
        elif settings.is_url(link):
            try:
                names += [f.filename for f in simple_index.project_files(link)]
            except BuilderError:
                return None  # the page that serves the wheel is not readable from here
    try:
        names += _filenames_from_index(index_for(variant))
    except (OSError, ValueError, KeyError):
        if not names:
            return None
    return names


def candidates(variant: Variant, names: list[str]) -> list[str]:
    """The torch wheels of the variant's version and python, any platform."""
    tag = "cp" + variant.python.replace(".", "")
    version = re.escape(variant.torch)
    return [n for n in names if re.match(rf"torch-{version}-{tag}-", n.replace("%2B", "+"))]


def missing_wheel_problems(variants: list[Variant], resolve_cuda: CudaResolver
                           ) -> tuple[list[str], list[str]]:
    """(problems, notes): a python with no torch wheel is a problem; an unreadable index a note."""
    problems, notes = [], []
    for v in variants:
        names = filenames(v)
        if names is None:
            notes.append(f"{v.id}: could not read the package index; wheel check skipped")
        elif (why := platforms.wheel_problem(
                v.torch, v.python, v.accelerator, platforms.get(v.platform), candidates(v, names),
                lambda name, v=v: is_cuda_build(v, name, resolve_cuda))):
            problems.append(f"{v.key}: {why}")
    return problems, notes
