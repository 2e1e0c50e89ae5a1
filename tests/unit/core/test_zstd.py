"""builder.core.zstd: the same layer always gives the same zstd bytes (whatever the workers or
the pieces it is fed), gzip streams are read whole or refused, a wrong diff id is refused."""

from __future__ import annotations

import gzip
import hashlib
import random
import zlib

import pytest
import zstandard

from builder.core import zstd


def tar_like(size: int = 3_000_000, seed: int = 1) -> bytes:
    """Compressible bytes with some randomness: long enough for several zstd jobs at 1 MiB."""
    rng = random.Random(seed)
    words = [rng.randbytes(rng.randint(3, 40)) for _ in range(500)]
    out = bytearray()
    while len(out) < size:
        out += rng.choice(words) + bytes(rng.randint(0, 30))
    return bytes(out[:size])


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


def compressed(data: bytes, piece: int, workers: int) -> bytes:
    counted = zstd.Counted()
    return b"".join(zstd.recompress(pieces(data, piece), counted, workers=workers))


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_the_same_bytes_whatever_the_workers_and_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zstd, "JOB_SIZE", 1 << 20)  # several jobs from a small input
    data = tar_like()
    first = compressed(data, 1 << 16, 1)
    assert compressed(data, 1 << 20, 2) == first
    assert compressed(data, 123_457, 4) == first
    assert zstandard.ZstdDecompressor().decompressobj().decompress(first) == data
    frame = zstandard.get_frame_parameters(first)
    assert frame.has_checksum and frame.content_size == zstandard.CONTENTSIZE_UNKNOWN


def test_counted_has_the_diff_id_and_sizes() -> None:
    data = tar_like(500_000)
    counted = zstd.Counted()
    out = b"".join(zstd.recompress([data], counted, expect_diff_id=digest(data), workers=2))
    assert counted.diff_id == digest(data)
    assert (counted.tar_bytes, counted.zstd_bytes) == (len(data), len(out))


def test_a_wrong_diff_id_is_refused_before_the_last_piece() -> None:
    data = tar_like(200_000)
    whole = b"".join(zstd.recompress([data], zstd.Counted()))
    got: list[bytes] = []
    with pytest.raises(zstd.LayerMismatch, match=r"not to the config's diff id"):
        for piece in zstd.recompress([data], zstd.Counted(), expect_diff_id=digest(b"other")):
            got.append(piece)
    assert len(b"".join(got)) < len(whole)  # the frame was never finished


@pytest.mark.parametrize("piece", [1, 1000, 1 << 20])
def test_inflate_reads_every_member_in_any_pieces(piece: int) -> None:
    data = tar_like(400_000)
    stream = gzip.compress(data[:150_000]) + gzip.compress(data[150_000:])
    assert b"".join(zstd.inflate(pieces(stream, piece))) == data


def test_inflate_bounds_each_piece(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(zstd, "INFLATE_PIECE", 1 << 16)
    out = list(zstd.inflate([gzip.compress(bytes(5_000_000))]))  # 5 MB of zeros from ~5 kB
    assert max(map(len, out)) <= 1 << 16 and sum(map(len, out)) == 5_000_000


def test_inflate_refuses_a_cut_or_broken_stream() -> None:
    stream = gzip.compress(tar_like(100_000))
    with pytest.raises(zstd.LayerMismatch, match="middle of a member"):
        list(zstd.inflate([stream[:-20]]))
    with pytest.raises(zstd.LayerMismatch, match="not a valid gzip stream"):
        list(zstd.inflate([stream[:10] + bytes(50) + stream[60:]]))


def test_background_keeps_order_and_raises_the_producers_error() -> None:
    assert list(zstd.background(lambda: iter([b"a", b"b", b"c"]), depth=1)) == [b"a", b"b", b"c"]

    def broken() -> object:
        yield b"a"
        raise zlib.error("bad")

    with pytest.raises(zlib.error, match="bad"):
        list(zstd.background(broken))  # type: ignore[arg-type]


def test_background_stops_its_producer_when_the_consumer_stops() -> None:
    produced: list[int] = []

    def endless() -> object:
        n = 0
        while True:
            produced.append(n)
            n += 1
            yield b"x"

    stream = zstd.background(endless, depth=2)  # type: ignore[arg-type]
    assert next(stream) == b"x"
    stream.close()  # joins the producer thread
    assert len(produced) < 10


def test_the_mmap_threshold_is_set_without_error() -> None:
    zstd.fixed_mmap_threshold()  # glibc here; elsewhere a no-op


def test_the_encoder_is_named_with_its_library_version() -> None:
    assert zstandard.__version__ in zstd.ENCODER and f"level {zstd.LEVEL}" in zstd.ENCODER
    assert zstd.threads() >= 1


# ---- a gzip bomb: checked before inflating, and capped ----------------------------------------


BOMB = gzip.compress(bytes(256 << 20), mtime=0)  # 256 MiB of zeros in ~250 KB


def served(data: bytes, *, digest_ok: bool) -> object:
    """What oci_blobs.stream_blob yields: the bytes as they arrive, then (when they do not hash
    to the digest asked for) a RegistryError at the end."""
    yield from pieces(data, 64 << 10)
    if not digest_ok:
        raise zstd.RegistryError("the bytes hash to sha256:…: refused")


def test_a_bomb_with_a_wrong_digest_is_refused_before_anything_is_inflated(tmp_path) -> None:
    inflated = 0
    with pytest.raises(zstd.RegistryError, match="refused"):
        for out in zstd.inflate(zstd.spooled(served(BOMB, digest_ok=False), tmp_path),
                                limit=zstd.inflate_limit(len(BOMB))):
            inflated += len(out)
    assert inflated == 0 < len(BOMB)
    assert list(tmp_path.iterdir()) == []  # the spool went with it


def test_a_bomb_with_the_right_digest_stops_at_the_ratio_cap(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(zstd, "INFLATE_FLOOR", 1 << 20)  # the ratio decides, not the floor
    inflated, limit = 0, zstd.inflate_limit(len(BOMB))
    assert limit == zstd.INFLATE_RATIO * len(BOMB)
    with pytest.raises(zstd.LayerMismatch, match=f"inflates past {limit} bytes"):
        for out in zstd.inflate(zstd.spooled(served(BOMB, digest_ok=True), tmp_path),
                                limit=limit):
            inflated += len(out)
    assert limit - zstd.INFLATE_PIECE <= inflated <= limit
    monkeypatch.setenv("BUILDER_INFLATE_RATIO", "2000")
    assert zstd.inflate_limit(len(BOMB)) == 2000 * len(BOMB)
    assert sum(map(len, zstd.inflate(served(BOMB, digest_ok=True),
                                     limit=zstd.inflate_limit(len(BOMB))))) == 256 << 20
    monkeypatch.setenv("BUILDER_INFLATE_RATIO", "0")
    with pytest.raises(zstd.ConfigError, match="BUILDER_INFLATE_RATIO `0`"):
        zstd.inflate_limit(1)


def test_a_zstd_layers_diff_id_is_read_in_bounded_pieces_and_capped() -> None:
    data = tar_like()
    packed = zstandard.ZstdCompressor().compress(data)
    assert zstd.zstd_diff_id(pieces(packed, 4096), limit=len(data)) == \
        "sha256:" + hashlib.sha256(data).hexdigest()
    with pytest.raises(zstd.LayerMismatch, match=f"inflates past {len(data) - 1} bytes"):
        zstd.zstd_diff_id(pieces(packed, 4096), limit=len(data) - 1)
    with pytest.raises(zstd.LayerMismatch, match="not a valid zstd stream"):
        zstd.zstd_diff_id([b"not zstd at all"], limit=1 << 20)
