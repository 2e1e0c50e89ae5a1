"""Where the pipeline keeps what it makes between stages (never committed).

  wheelhouse/   content-verified wheels shared by all variants
  context/      the one build context: sets/, facts/, smoke/
  rendered/     Dockerfiles of the last build
  reports/      smoke reports by image id       sbom/  SBOMs by image id
  logs/         one build log per variant       registry/  the embedded registry's storage
"""

from __future__ import annotations

import os
from pathlib import Path


def root() -> Path:
    return Path(os.environ.get("BUILDER_STATE", ".state")).resolve()


def path(*parts: str) -> Path:
    p = root().joinpath(*parts)
    p.mkdir(parents=True, exist_ok=True)
    return p


def atomic_write(target: Path, data: str | bytes) -> None:
    """Write via a temporary file and rename, so readers never see half a file."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    if isinstance(data, bytes):
        tmp.write_bytes(data)
    else:
        tmp.write_text(data)
    os.replace(tmp, target)


def _hex(image_id: str) -> str:
    return image_id.split(":", 1)[-1]


def sbom_path(image_id: str) -> Path:
    """Where `builder build` keeps the SBOM of a built image (by image id)."""
    return path("sbom") / f"{_hex(image_id)}.cdx.json"
