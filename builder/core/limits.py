"""Bounds on what the tool reads and echoes: a hostile or broken input costs a message, never
memory, minutes or a traceback."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from builder.core.errors import BuilderError

SHOWN_CHARS = 60  # of a value echoed in a message
SHOWN_PROBLEMS = 50  # problems listed in one error; the rest are counted


def json_depth_limit() -> int:
    """Python's JSON decoder recurses once per nesting level; past the interpreter's recursion
    limit (about 1000) it raises RecursionError."""
    return sys.getrecursionlimit()


def parse_json(data: str | bytes) -> Any:
    """json.loads; a document nested too deep is a ValueError (as invalid JSON is) saying so."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError(f"nested deeper than {json_depth_limit()} levels") from None


def json_object(data: str | bytes, what: str,
                error: Callable[[str], Exception] = BuilderError) -> dict[str, Any]:
    """`data` as a JSON object, else one error naming `what`: "`what` is not JSON" or "`what`
    is not a JSON object" (a registry's answer, a manifest, an attached SBOM)."""
    try:
        doc = json.loads(data)
    except ValueError:
        raise error(f"{what} is not JSON") from None
    if not isinstance(doc, dict):
        raise error(f"{what} is not a JSON object")
    return doc


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    """The bytes of `path`, refusing (one line) anything larger than `limit` without reading
    past it: `/dev/zero` or a runaway file cost `limit` bytes, not all memory."""
    try:
        with path.open("rb") as fh:
            data = fh.read(limit + 1)
    except OSError as exc:
        raise BuilderError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > limit:
        raise BuilderError(f"{path} is larger than the {limit // 1024 ** 2} MiB limit for {what}",
                           hint="is this the right file?")
    return data


def shorten(text: str, keep: int = SHOWN_CHARS) -> str:
    """`text`, or its start and its length when longer than `keep` characters."""
    return text if len(text) <= keep else f"{text[:keep]}… ({len(text)} characters)"
