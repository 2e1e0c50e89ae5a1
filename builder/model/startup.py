""""Bytes needed to start": the startup working set `python -m bench pull` measured, on the
catalog's pages beside the pull size.

The figure comes from a bench results file (`bench/results.json` of the folder the catalog runs
in, when present, or the file `builder catalog --startup` names; none with `--no-startup`: the
`pull` entry, per variant the bytes of the unpacked image a cold `import torch` + first matmul
read; bench/workingset.py), never from the registry: it is a
measurement of ours, not a claim anyone with push rights can write. It is matched by digest
(the gzip image or its zstd twin the bench pulled); failing that, by the image's variant, and
then the page says it was measured on another build of the variant.
No figure is "not measured", never a guess.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builder.core.errors import BuilderError

# What `python -m bench pull` writes in a checkout: the catalog reads it when it is there.
DEFAULT = Path("bench") / "results.json"


def results_path(given: Path | None, off: bool = False) -> Path | None:
    """The bench results the pages read: `given` (--startup), else DEFAULT; None with
    --no-startup. A missing file is read as nothing measured (`load`), never an error: a
    catalog run outside a checkout shows "not measured"."""
    if off:
        return None
    return given or DEFAULT


def load(path: Path | None) -> list[dict[str, Any]]:
    """The measured working sets in a bench results file, one record per variant; [] without
    the file or without a `pull` entry that measured one."""
    if path is None or not path.is_file():
        return []
    try:
        pull = json.loads(path.read_text()).get("pull") or {}
    except (OSError, ValueError) as exc:
        raise BuilderError(f"cannot read the bench results `{path}`: {exc}",
                           hint="run `python -m bench pull --quick` again, or pass "
                           "`--startup` another file") from exc
    return [record(v, v.get("started") or pull.get("started"))
            for v in pull.get("results") or []
            if v.get("working_set")]


def record(variant: dict[str, Any], started: str | None) -> dict[str, Any]:
    """What a page shows of one bench variant, and the digests it was measured on."""
    ws = variant["working_set"]
    return {"variant": variant["id"], "measured": started,
            "digests": [d for d in (variant.get("gzip_digest"),
                                    (variant.get("twin") or {}).get("twin")) if d],
            "bytes": ws["bytes"], "image_bytes": ws["image_bytes"], "share": ws["share"],
            "files": ws["files"], "image_files": ws["image_files"]}


def for_image(records: list[dict[str, Any]], digest: str, variant: str | None
              ) -> dict[str, Any] | None:
    """The catalog's `startup` of one image: the record measured on this digest, else on
    another build of its variant (`same_digest: false`); None when neither was measured."""
    exact = [r for r in records if digest in r["digests"]]
    near = [r for r in records if variant and r["variant"] == variant]
    found = (exact or near or [None])[0]
    if found is None:
        return None
    return {"bytes": found["bytes"], "image_bytes": found["image_bytes"],
            "share": found["share"], "files": found["files"],
            "image_files": found["image_files"], "same_digest": bool(exact),
            "measured_on": found["digests"][0] if found["digests"] else None,
            "measured": found["measured"]}


def add(images: dict[str, dict[str, Any]], records: list[dict[str, Any]]) -> None:
    """Each image the bench measured (or measured a build of) gets its `startup`."""
    for digest, image in images.items():
        if found := for_image(records, digest, image.get("variant")):
            image["startup"] = found
