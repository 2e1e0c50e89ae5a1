"""Where the pipeline keeps what it makes between stages (never committed).

  wheelhouse/   content-verified wheels shared by all variants
  context/      the one build context: sets/, facts/, smoke/
  rendered/     Dockerfiles of the last build
  reports/      smoke reports by image id       sbom/  SBOMs by image id
  logs/         one build log per variant       registry/  the embedded registry's storage
  builds/       when each build really ran (startedOn/finishedOn of its provenance), by image id
"""

from __future__ import annotations

import os
from pathlib import Path

from builder.core.errors import BuilderError


def root() -> Path:
    return Path(os.environ.get("BUILDER_STATE", ".state")).resolve()


def path(*parts: str) -> Path:
    p = root().joinpath(*parts)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise path_error(p, exc, folder=True, hint="BUILDER_STATE must name a folder this "
                         "user can write (default: .state)") from None
    return p


def path_error(target: Path, exc: OSError, *, folder: bool = False,
               hint: str | None = None) -> BuilderError:
    """An OSError about `target` (a file, or a folder when `folder`) as a message (exit 2)."""
    why = exc.strerror or str(exc)
    blocker = next((p for p in (target, *target.parents) if p.exists() and not p.is_dir()), None)
    if blocker is not None and (blocker != target or folder):
        why = f"{blocker} is a file, not a folder"
    return BuilderError(f"cannot write {target}: {why}", hint=hint)


def atomic_write(target: Path, data: str | bytes) -> None:
    """Write via a temporary file and rename, so readers never see half a file."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
        os.replace(tmp, target)
    except OSError as exc:
        raise path_error(target, exc) from None
    finally:
        tmp.unlink(missing_ok=True)  # only still there when the write or rename failed


def _hex(image_id: str) -> str:
    return image_id.split(":", 1)[-1]


def evidence_path(kind: str, image_id: str) -> Path:
    """This machine's copy of an image's `smoke` report or `sbom`, by image id: what `builder
    build` and `builder smoke` write and publish reads when the registry has none."""
    if kind == "smoke":
        return root() / "reports" / f"{_hex(image_id)}.json"
    return path("sbom") / f"{_hex(image_id)}.cdx.json"


def build_times_path(image_id: str) -> Path:
    """When this machine's build of `image_id` really ran (`startedOn`/`finishedOn` of its
    provenance; the image config keeps its reproducible time)."""
    return root() / "builds" / f"{_hex(image_id)}.json"
