"""This machine's memory of the zstd twin layers it made: gzip layer → zstd blob.

Why: a publish recompresses every layer of the image (the CPU runtime's ~1.2 GB of tar, a CUDA
image's 5-8 GB), although a security rebuild changes a layer or two and the e2e suite publishes
the same staged image over and over. A layer recompressed once is the same bytes every time
(builder.core.zstd), so its twin's digest, size and diff id can be remembered and the blob
referenced again where a registry already holds it, or mounted or copied from a repository it
was pushed to, instead of being made afresh.

Trust: an entry is written only after this process made the zstd blob itself and checked its
uncompressed bytes against the config's diff id (builder.stages.twin), and it is read only from
this user's own cache folder, never from anything a registry says. An entry counts only for
the same gzip digest, diff id and encoder (a new libzstd makes other bytes). Copied bytes are
checked against the remembered digest as they stream; `verify` still decompresses each twin
layer against the config's diff ids, so a wrong entry (a file edited by hand) fails there.
A runner without the folder recompresses, as before.

`BUILDER_TWIN_CACHE` names the folder (tests point a session at one); the default is
`$XDG_CACHE_HOME/torch-images/twins` (`~/.cache/...`). One small JSON file per gzip layer,
written atomically; a file that does not parse, or names another layer, is ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from builder.core import state, zstd
from builder.core.errors import BuilderError
from builder.core.oci_blobs import DIGEST

ENV = "BUILDER_TWIN_CACHE"
MAX_PLACES = 8  # the repositories remembered per blob, newest first


@dataclass(frozen=True, kw_only=True)
class Entry:
    """A zstd layer this machine made of a gzip one, and where it pushed it."""

    gzip_digest: str
    diff_id: str  # the uncompressed digest both compress
    digest: str  # the zstd blob
    size: int  # its bytes
    tar_size: int  # the uncompressed bytes (for the report)
    encoder: str  # zstd.ENCODER when it was made
    places: tuple[str, ...] = ()  # `registry/repository`s it was pushed to, newest first

    def at(self, place: str) -> Entry:
        """The entry with `place` as the newest place it is known to be."""
        places = (place, *(p for p in self.places if p != place))[:MAX_PLACES]
        return replace(self, places=places)


def folder() -> Path:
    """Where the entries live: BUILDER_TWIN_CACHE, else the user's cache folder."""
    if chosen := os.environ.get(ENV):
        return Path(chosen)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torch-images" / "twins"


def _file(gzip_digest: str) -> Path:
    return folder() / f"{gzip_digest.removeprefix('sha256:')}.json"


def lookup(gzip_digest: str, diff_id: str) -> Entry | None:
    """The entry made of `gzip_digest` whose uncompressed bytes are `diff_id`, by this
    encoder; None when there is none (or it is unreadable, or made of something else)."""
    try:
        doc = json.loads(_file(gzip_digest).read_text())
        entry = Entry(gzip_digest=doc["gzip_digest"], diff_id=doc["diff_id"],
                      digest=doc["digest"], size=int(doc["size"]),
                      tar_size=int(doc["tar_size"]), encoder=doc["encoder"],
                      places=tuple(str(p) for p in doc.get("places") or ()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if (entry.gzip_digest, entry.diff_id, entry.encoder) != (gzip_digest, diff_id,
                                                              zstd.ENCODER):
        return None
    return entry if DIGEST.fullmatch(entry.digest) and entry.size >= 0 else None


def remember(entry: Entry) -> None:
    """Write `entry` (a blob this process made and checked, or found where an entry said);
    a cache folder that cannot be written costs only the next publish's time."""
    doc = {**asdict(entry), "places": list(entry.places)}
    with contextlib.suppress(BuilderError):
        state.atomic_write(_file(entry.gzip_digest), json.dumps(doc, indent=1) + "\n")
