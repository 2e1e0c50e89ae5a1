"""A gzip layer recompressed to zstd as a stream: the same input always gives the same bytes.

Why: Kubernetes nodes pull with containerd (≥ 1.5), which unpacks `tar+zstd` layers several
times faster than gzip ones (inflate is single-threaded); Docker 20.10 cannot unpack zstd at
all, so zstd layers are published beside the gzip ones (builder.stages.twin), never instead.

Determinism: libzstd's multi-threaded streaming mode (workers ≥ 1) cuts its input into jobs
of JOB_SIZE whatever the number of workers or the size of the pieces it is fed, so the output
depends only on the input, the parameters below and the libzstd version, which
requirements.lock pins and ENCODER names (the twin's manifest records it).

Memory: inflate is asked for at most INFLATE_PIECE bytes at a time (a small gzip chunk cannot
expand into gigabytes in memory); zstd holds its window and a few jobs (tens of MB at LEVEL);
`fixed_mmap_threshold` keeps glibc from keeping the pieces' memory in per-thread heaps;
`background` keeps at most `depth` pieces between the producing and the consuming thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import queue
import tempfile
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zstandard
from isal import isal_zlib  # zlib's API, Intel ISA-L's inflate: about twice zlib's speed

from builder.core.errors import FINDINGS, ConfigError
from builder.core.registry_http import RegistryError

MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar+zstd"
GZIP_TYPES = ("application/vnd.oci.image.layer.v1.tar+gzip",
              "application/vnd.docker.image.rootfs.diff.tar.gzip")
TAR_TYPES = ("application/vnd.oci.image.layer.v1.tar",)
LEVEL = 3  # zstd's default; higher levels shrink NVIDIA binaries ~1.5% more for 3-10 times the CPU
JOB_SIZE = 8 << 20  # libzstd's own choice at LEVEL, fixed here so a new default changes nothing
INFLATE_PIECE = 1 << 20
OUT_PIECE = 1 << 20
# inflate stops past this many times a layer's compressed size (a decompression bomb); real
# layers inflate 2-4 times, a small one's tar padding more, hence the floor. BUILDER_INFLATE_RATIO
# changes the ratio.
INFLATE_RATIO = 20
INFLATE_FLOOR = 16 << 20
MAX_THREADS = 4  # zstd holds ~35 MB per worker at LEVEL; the output is the same
ENCODER = (f"zstandard {zstandard.__version__} (libzstd "
           f"{'.'.join(map(str, zstandard.ZSTD_VERSION))}), level {LEVEL}, "
           f"multi-threaded jobs of {JOB_SIZE >> 20} MiB, content checksum")


class LayerMismatch(RegistryError):
    """A layer that is not what it claims: not a gzip stream, or not the diff id its config
    names. Nothing made from it is stored."""

    exit_code = FINDINGS


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
MMAP_THRESHOLD = 256 << 10


def fixed_mmap_threshold() -> None:
    """Keep glibc from raising its mmap threshold as MB-sized buffers are freed (its default):
    the pieces recompression passes between its threads would then come from per-thread heaps
    that only grow. Measured on the CUDA slim image's twin: peak RSS 282 MB with the default,
    146 MB with this. A no-op where the C library has no mallopt."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)


def threads() -> int:
    """zstd workers: the cores this process may use (the output does not depend on it)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, MAX_THREADS))


def compressor(workers: int | None = None) -> Any:
    """A fresh streaming compressor with the fixed parameters (workers ≥ 1: the job-cut mode)
    whose output comes in pieces of OUT_PIECE (zstd flushes several jobs at once otherwise)."""
    params = zstandard.ZstdCompressionParameters.from_level(
        LEVEL, threads=max(1, workers or threads()), job_size=JOB_SIZE,
        write_checksum=True, write_content_size=False, write_dict_id=False)
    return zstandard.ZstdCompressor(compression_params=params).chunker(chunk_size=OUT_PIECE)


def inflate_ratio() -> int:
    """The decompression ratio cap: INFLATE_RATIO, or BUILDER_INFLATE_RATIO when set."""
    text = os.environ.get("BUILDER_INFLATE_RATIO", str(INFLATE_RATIO))
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"BUILDER_INFLATE_RATIO `{text[:20]}` is not a whole number ≥ 1")
    return int(text)


def inflate_limit(compressed: int) -> int:
    """The most bytes a layer of `compressed` bytes may inflate to."""
    return max(INFLATE_FLOOR, inflate_ratio() * compressed)


def spooled(chunks: Iterable[bytes], folder: Path) -> Iterator[bytes]:
    """`chunks` written whole to a file under `folder`, then read back in pieces: a download
    that raises at its end when its bytes do not hash to their digest (oci_blobs.stream_blob)
    does so before anything reads them, so nothing unverified is ever inflated. The file is
    unnamed and goes when the generator ends."""
    with tempfile.TemporaryFile(dir=folder) as spool:
        for chunk in chunks:
            spool.write(chunk)
        spool.seek(0)
        while piece := spool.read(INFLATE_PIECE):
            yield piece


def _capped(out: bytes, total: int, limit: int | None, where: str) -> int:
    total += len(out)
    if limit is not None and total > limit:
        raise LayerMismatch(f"{where}: inflates past {limit} bytes ({inflate_ratio()}× its "
                            "compressed size; BUILDER_INFLATE_RATIO raises it): refused")
    return total


def inflate(chunks: Iterable[bytes], where: str = "layer", *,
            limit: int | None = None) -> Iterator[bytes]:
    """The uncompressed bytes of a gzip stream (several members in a row allowed), in pieces
    of at most INFLATE_PIECE; LayerMismatch when the stream is corrupt or cut short, or when
    it inflates past `limit` bytes."""
    member, fed, total = isal_zlib.decompressobj(wbits=31), False, 0
    try:
        for chunk in chunks:
            data = chunk
            while data:
                fed = True
                if out := member.decompress(data, INFLATE_PIECE):
                    total = _capped(out, total, limit, where)
                    yield out
                data = member.unconsumed_tail
                if member.eof:  # the next member, if any, starts in what is left
                    data = member.unused_data + data
                    member, fed = isal_zlib.decompressobj(wbits=31), False
        while out := member.decompress(b"", INFLATE_PIECE):  # output still held back
            total = _capped(out, total, limit, where)
            yield out
    except (isal_zlib.error, zlib.error) as exc:
        raise LayerMismatch(f"{where}: not a valid gzip stream ({exc}): refused") from None
    if fed and not member.eof:
        raise LayerMismatch(f"{where}: the gzip stream ends in the middle of a member: refused")


class _Reader:
    """A file-like `read` over an iterable of byte chunks (what zstandard's stream reader asks)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks, self._held = iter(chunks), b""

    def read(self, size: int = -1) -> bytes:
        while not self._held:
            chunk = next(self._chunks, None)
            if chunk is None:
                return b""
            self._held = chunk
        n = len(self._held) if size < 0 else size
        out, self._held = self._held[:n], self._held[n:]
        return out


def zstd_diff_id(chunks: Iterable[bytes], limit: int, where: str = "layer") -> str:
    """The sha256 of a zstd layer's uncompressed bytes, decompressed in pieces of OUT_PIECE
    (bounded memory whatever the ratio); LayerMismatch past `limit` bytes or when the stream
    is not zstd."""
    hasher, total = hashlib.sha256(), 0
    reader = zstandard.ZstdDecompressor().stream_reader(_Reader(chunks), read_across_frames=True)
    try:
        while piece := reader.read(OUT_PIECE):
            total = _capped(piece, total, limit, where)
            hasher.update(piece)
    except zstandard.ZstdError as exc:
        raise LayerMismatch(f"{where}: not a valid zstd stream ({exc}): refused") from None
    return "sha256:" + hasher.hexdigest()


@dataclass
class Counted:
    """What a recompression saw: the uncompressed bytes' digest and size, the output size."""

    diff_id: str = ""
    tar_bytes: int = 0
    zstd_bytes: int = 0

    def reset(self) -> None:
        """Counting again from zero (an upload tried again from the start)."""
        self.diff_id, self.tar_bytes, self.zstd_bytes = "", 0, 0


def recompress(tar_pieces: Iterable[bytes], counted: Counted, *, expect_diff_id: str = "",
               workers: int | None = None, where: str = "layer") -> Iterator[bytes]:
    """zstd of `tar_pieces` (uncompressed layer bytes); `counted` is filled as it goes. With
    `expect_diff_id`, raises LayerMismatch at the end (before the last piece) unless the
    uncompressed bytes hash to it: nothing different from the image config is ever stored."""
    hasher, zc = hashlib.sha256(), compressor(workers)
    for piece in tar_pieces:
        hasher.update(piece)
        counted.tar_bytes += len(piece)
        for out in zc.compress(piece):
            counted.zstd_bytes += len(out)
            yield out
    counted.diff_id = "sha256:" + hasher.hexdigest()
    if expect_diff_id and counted.diff_id != expect_diff_id:
        raise LayerMismatch(f"{where}: its uncompressed bytes hash to {counted.diff_id}, not "
                            f"to the config's diff id {expect_diff_id}: refused")
    for out in zc.finish():
        counted.zstd_bytes += len(out)
        yield out


_DONE = object()


def background(make: Callable[[], Iterable[bytes]], depth: int = 4) -> Iterator[bytes]:
    """The pieces of `make()`, produced in another thread so that producing (download,
    inflate, compress) and consuming (upload) overlap; at most `depth` pieces wait between
    them. An exception on either side stops both and is raised here."""
    q: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for piece in make():
                if not put(piece):
                    return
            put(_DONE)
        except BaseException as exc:  # handed to the consumer, raised there
            put(exc)

    worker = threading.Thread(target=produce, name="zstd-recompress", daemon=True)
    worker.start()
    try:
        while (item := q.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        worker.join()
