"""The startup working set: how much of an image's unpacked files a cold start reads.

Measured by page-cache residency, as `fincore` (util-linux, on every Debian machine) reports
it. After the pull, each regular file of the image's snapshots is flushed and evicted with
`posix_fadvise(POSIX_FADV_DONTNEED)`: that drops one file's clean pages for every process,
where `echo 3 > /proc/sys/vm/drop_caches` would empty the whole machine's cache and slow the
other work this shared machine runs. Then the container starts; whatever of those files is
resident afterwards was read by it. overlayfs serves reads from the lower layer's own inode,
so the snapshot files' residency is the container's reads. The kernel reads ahead around
each read, so the figure is what a lazy puller with the same readahead would have to fetch;
what stayed resident right after the eviction (pages another process holds mapped) is
recorded beside it and subtracted.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from builder.core import proc

BATCH = 500  # files per `fincore` call (argv stays far below ARG_MAX)
TOP = 15  # the files with the most bytes touched, named in the results


def image_files(snapshots: Path) -> dict[str, int]:
    """Every regular file of the committed snapshots under `snapshots` (containerd's overlayfs
    snapshotter: `snapshots/<n>/fs/…`), path → size; a hard-linked file counts once."""
    seen: set[tuple[int, int]] = set()
    out: dict[str, int] = {}
    for top, _, names in os.walk(snapshots):
        for name in names:
            path = os.path.join(top, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and (info.st_dev, info.st_ino) not in seen:
                seen.add((info.st_dev, info.st_ino))
                out[path] = info.st_size
    return out


def evict(paths: Iterable[str]) -> None:
    """Flush each file, then drop its pages from the page cache (dirty pages are not dropped:
    the files were just written by the unpack, hence the flush first)."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident(paths: Sequence[str]) -> dict[str, int]:
    """path → bytes of it in the page cache, as `fincore` reads them (mincore(2))."""
    out: dict[str, int] = {}
    for i in range(0, len(paths), BATCH):
        argv = ["fincore", "--json", "--bytes", "--output", "RES,FILE", "--",
                *paths[i:i + BATCH]]
        out |= parse_fincore(proc.run(argv, timeout=600).stdout)
    return out


def parse_fincore(text: str) -> dict[str, int]:
    """`fincore --json --bytes --output RES,FILE`'s answer as path → resident bytes."""
    return {row["file"]: int(row["res"]) for row in json.loads(text or "{}").get("fincore", [])}


def summary(files: dict[str, int], before: dict[str, int], after: dict[str, int],
            root: Path) -> dict[str, Any]:
    """Bytes and files the start touched, against the whole image: what `bench/results.json`
    keeps and the catalog shows as "bytes needed to start". Residency left after the eviction
    (`before`) is not counted as touched."""
    touched = {p: max(0, after.get(p, 0) - before.get(p, 0)) for p in files}
    touched = {p: n for p, n in touched.items() if n}
    total = sum(files.values())
    top = sorted(touched.items(), key=lambda item: (-item[1], item[0]))[:TOP]
    return {"bytes": sum(touched.values()), "files": len(touched),
            "image_bytes": total, "image_files": len(files),
            "share": round(sum(touched.values()) / total, 4) if total else None,
            "files_share": round(len(touched) / len(files), 4) if files else None,
            "left_after_eviction": sum(before.get(p, 0) for p in files),
            "top": [[in_image(p, root), n] for p, n in top]}


def in_image(path: str, root: Path) -> str:
    """A snapshot file's path as the image has it (`<root>/<n>/fs/usr/lib/x` → `/usr/lib/x`)."""
    parts = Path(path).relative_to(root).parts
    return "/" + "/".join(parts[2:]) if len(parts) > 2 and parts[1] == "fs" else path


class Measure:
    """`m = Measure(snapshots)` after the pull (lists and evicts the image's files), run the
    container, then `m.done()`: the working set of that run."""

    def __init__(self, snapshots: Path) -> None:
        self.root = snapshots
        self.files = image_files(snapshots)
        evict(self.files)
        self.before = resident(list(self.files))

    def done(self) -> dict[str, Any]:
        return summary(self.files, self.before, resident(list(self.files)), self.root)
