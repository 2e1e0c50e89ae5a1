"""Read an image's filesystem straight from the local engine's overlay2 layer directories.

`docker image inspect` names the image's layer `diff` directories (`GraphDriver.Data`: UpperDir,
then LowerDir, colon-separated, top first). Walking them top to bottom with overlayfs' rules gives
the same union view that `docker export` streams, without the engine copying every byte through
its API: only the few files the SBOM needs are opened, and the bundled native libraries are
hashed by a small thread pool (hashlib and file reads release the GIL).

Overlay rules honoured: the first layer holding a name wins; a whiteout (a 0:0 character device,
or an AUFS-style `.wh.NAME` file) hides the name in lower layers; a directory marked opaque
(xattr `trusted.overlay.opaque=y`, or `user.overlay.opaque` for rootless engines, or an AUFS
`.wh..wh..opq` file) hides everything below it in lower layers; a directory merges with the same
directory in lower layers until a non-directory or a whiteout of that name is met.

The walk visits names in byte order, depth first, like the engine's tar writer, so members come
out in the order `docker export` gives them; a regular file sharing its inode with one seen
earlier is a tar hard link there and is skipped here too.

Anything this cannot vouch for (remote engine, another storage driver, not root, a layer chain
on disk that differs from the engine's, an unreadable directory) raises `Unavailable`, and the
caller falls back to the export stream.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

_CHUNK = 4 << 20  # read size for hashing
_OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")
_WH_PREFIX = b".wh."
_WH_OPAQUE = b".wh..wh..opq"


class Unavailable(Exception):
    """The layers cannot be read here; the message says why."""


@dataclass(frozen=True)
class Member:
    """A regular file or symlink of the union view."""

    name: str  # relative in-image path, as in the export tar
    path: bytes  # where its bytes are on this host
    kind: str  # "0" regular file, "2" symlink (tar type flags)
    ino: int

    def size(self) -> int:
        return os.lstat(self.path).st_size


def layer_dirs(info: dict[str, Any], engine_address: str) -> list[bytes]:
    """The image's layer diff directories, top first; raises Unavailable when not usable."""
    if not engine_address.startswith("unix://"):
        raise Unavailable(f"engine at {engine_address} is not local")
    driver = info.get("GraphDriver") or {}
    if driver.get("Name") != "overlay2":
        raise Unavailable(f"storage driver is {driver.get('Name')!r}, not overlay2")
    if os.geteuid() != 0:
        raise Unavailable("not root: overlay xattrs (opaque directories) are not readable")
    data = driver.get("Data") or {}
    upper = data.get("UpperDir") or ""
    lowers = [d for d in (data.get("LowerDir") or "").split(":") if d]
    if not upper:
        raise Unavailable("no GraphDriver.Data.UpperDir")
    dirs = [upper, *lowers]
    _check_chain(dirs)
    return [os.fsencode(d) for d in dirs]


def _check_chain(dirs: list[str]) -> None:
    """The layers on disk must be the ones the engine named, in its order.

    A socket forwarded from a VM (or a stale /var/lib/docker beside another engine) can name
    directories that do not exist here, or exist with other content: overlay2 records each
    layer's parents in `<layer>/lower` as `l/<short id>` links, which must lead back to `dirs`.
    """
    for d in dirs:
        if os.path.basename(d) != "diff" or not os.path.isdir(d):
            raise Unavailable(f"layer directory {d} is not readable here")
    top = os.path.dirname(dirs[0])
    try:
        with open(os.path.join(top, "lower")) as f:
            chain = [c for c in f.read().strip().split(":") if c]
    except FileNotFoundError:
        chain = []
    except OSError as exc:
        raise Unavailable(f"cannot read {top}/lower: {exc}") from exc
    if len(chain) != len(dirs) - 1:
        raise Unavailable(f"{top}/lower lists {len(chain)} layers, the engine {len(dirs) - 1}")
    root = os.path.dirname(top)
    for link, expected in zip(chain, dirs[1:], strict=True):
        try:
            target = os.path.realpath(os.path.join(root, link))
        except OSError as exc:
            raise Unavailable(f"cannot resolve {root}/{link}: {exc}") from exc
        if target != os.path.realpath(expected):
            raise Unavailable(f"{root}/{link} leads to {target}, the engine says {expected}")


def _is_opaque(path: bytes, names: set[bytes]) -> bool:
    if _WH_OPAQUE in names:
        return True
    for attr in _OPAQUE_XATTRS:
        try:
            if os.getxattr(path, attr, follow_symlinks=False) == b"y":
                return True
        except OSError as exc:
            if exc.errno not in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise Unavailable(f"cannot read xattr {attr} of {path!r}: {exc}") from exc
    return False


def _is_whiteout(entry: os.DirEntry[bytes]) -> bool:
    st = entry.stat(follow_symlinks=False)
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


_GONE = ("gone",)  # a whiteout met before any other entry of that name


def walk(dirs: list[bytes]) -> Iterator[Member]:
    """Every regular file and symlink of the union of `dirs` (top first), in tar order.

    Depth first, names in byte order at each level, a directory's contents at its place among
    its siblings (Go's filepath.WalkDir, which the engine's tar writer uses). Directories are
    merged, not yielded. A regular file whose inode was already yielded (a hard link) is left
    out: the engine's tar writer makes it a link member, which the collector does not read.
    """
    seen_inodes: set[int] = set()
    stack: list[tuple[str, Iterator[tuple[bytes, Any]]]] = [("", _sorted(_merge(dirs)))]
    while stack:
        prefix, it = stack[-1]
        item = next(it, None)
        if item is None:
            stack.pop()
            continue
        name, hit = item
        rel = prefix + os.fsdecode(name)
        if isinstance(hit, list):
            stack.append((rel + "/", _sorted(_merge(hit))))
            continue
        entry: os.DirEntry[bytes] = hit
        if entry.is_symlink():
            yield Member(rel, entry.path, "2", entry.inode())
        elif entry.is_file(follow_symlinks=False):
            ino = entry.inode()
            if ino not in seen_inodes:
                seen_inodes.add(ino)
                yield Member(rel, entry.path, "0", ino)
        # devices, fifos, sockets: nothing the SBOM reads


def _sorted(entries: dict[bytes, Any]) -> Iterator[tuple[bytes, Any]]:
    for name in sorted(entries):
        hit = entries[name]
        if hit is not _GONE:
            yield name, hit


def _merge(paths: list[bytes]) -> dict[bytes, Any]:
    """name -> DirEntry (top-most non-directory), list of directory paths, or _GONE."""
    entries: dict[bytes, Any] = {}
    closed: set[bytes] = set()  # directories that stop merging with lower layers
    for i, path in enumerate(paths):
        try:
            with os.scandir(path) as it:
                listing = list(it)
        except OSError as exc:
            raise Unavailable(f"cannot list {path!r}: {exc}") from exc
        names = {e.name for e in listing}
        for e in listing:
            name = e.name
            if name.startswith(_WH_PREFIX):
                if name != _WH_OPAQUE:
                    _hide(entries, closed, name[len(_WH_PREFIX):])
                continue
            prev = entries.get(name)
            if prev is None:
                if e.is_dir(follow_symlinks=False):
                    entries[name] = [e.path]
                elif not (e.is_file(follow_symlinks=False) or e.is_symlink()) and _is_whiteout(e):
                    entries[name] = _GONE
                else:
                    entries[name] = e
            elif isinstance(prev, list) and name not in closed:
                if e.is_dir(follow_symlinks=False):
                    prev.append(e.path)
                else:  # a file or whiteout under a directory: lower layers are hidden
                    closed.add(name)
        if i + 1 < len(paths) and _is_opaque(path, names):
            break
    return entries


def _hide(entries: dict[bytes, Any], closed: set[bytes], name: bytes) -> None:
    prev = entries.get(name)
    if prev is None:
        entries[name] = _GONE
    elif isinstance(prev, list):
        closed.add(name)


class Hasher:
    """SHA-256 of files in a small thread pool; results come back in submission order.

    Submit the largest files first: the pool then ends with small ones, all threads busy.
    """

    def __init__(self, workers: int | None = None) -> None:
        # One more thread than cores: one can wait on the disk while the others hash.
        workers = workers or min(8, (os.cpu_count() or 1) + 1)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="sbom-hash")
        self._jobs: list[tuple[Future[tuple[str, int]], Any]] = []

    def submit(self, path: bytes, tag: Any) -> None:
        self._jobs.append((self._pool.submit(_sha256, path), tag))

    def results(self) -> Iterator[tuple[Any, str, int]]:
        """(tag, hex digest, bytes read) for each submitted file; then the pool is shut down."""
        try:
            for future, tag in self._jobs:
                hexdigest, n = future.result()
                yield tag, hexdigest, n
        finally:
            self.close()

    def close(self) -> None:
        for future, _ in self._jobs:
            future.cancel()
        self._pool.shutdown(wait=True)


def _sha256(path: bytes) -> tuple[str, int]:
    digest = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    total = 0
    with open(path, "rb", buffering=0) as f:
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)  # a larger read-ahead
        while n := f.readinto(buf):
            digest.update(view[:n])
            total += n
    return digest.hexdigest(), total
