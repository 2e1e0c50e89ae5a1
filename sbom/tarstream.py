"""Just enough of the tar format to walk a `docker export` stream once, reading only what is asked.

The collector's export path (sbom/collect.py) reads one uncompressed ustar/GNU/PAX stream of a root
filesystem; this keeps the format's details (headers, long names, PAX records, base-256 sizes)
out of what it does with the members.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

_BUFSIZE = 4 << 20  # one reusable read buffer


class Readable(Protocol):
    def readinto(self, b: Any, /) -> int | None: ...



class TarReader:
    """Just enough of ustar/GNU/PAX to walk a `docker export` stream once, skipping fast.

    tarfile's stream mode copies every byte several times (about 40% slower here); this reads
    into one reusable buffer and hands out only the members asked for.
    """

    def __init__(self, stream: Readable) -> None:
        self._stream = stream
        self._scratch = bytearray(_BUFSIZE)
        self._view = memoryview(self._scratch)
        self.total = 0

    def _readinto(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            n = self._stream.readinto(view[got:])
            if not n:
                raise EOFError("truncated tar stream")
            got += n
        self.total += got

    def read(self, size: int) -> bytes:
        buf = bytearray(size)
        self._readinto(memoryview(buf))
        return bytes(buf)

    def chunks(self, size: int) -> Iterator[memoryview]:
        """The next `size` bytes in pieces (valid until the next call), then the padding."""
        left = size
        while left:
            view = self._view[: min(left, _BUFSIZE)]
            self._readinto(view)
            left -= len(view)
            yield view
        if pad := -size % 512:
            self._readinto(self._view[:pad])

    def skip(self, size: int) -> None:
        for _ in self.chunks(size):
            pass

    def data(self, size: int) -> bytes:
        return b"".join(bytes(c) for c in self.chunks(size))

    def members(self) -> Iterator[tuple[str, str, str, int]]:
        """(type flag, name, link name, size); the caller must consume or skip each body."""
        pax: dict[str, str] = {}
        long_name = long_link = ""
        while True:
            try:
                header = self.read(512)
            except EOFError:
                return
            if header == _ZERO_BLOCK:
                return
            kind = chr(header[156]) if header[156] else "0"
            size = int(pax["size"]) if "size" in pax else _number(header[124:136])
            if kind in "xg":
                records = _parse_pax(self.data(size))
                if kind == "x":
                    pax = records
                continue
            if kind in "LK":
                value = self.data(size).rstrip(b"\0").decode("utf-8", "surrogateescape")
                long_name, long_link = (value, long_link) if kind == "L" else (long_name, value)
                continue
            name = pax.get("path") or long_name or _header_name(header)
            link = pax.get("linkpath") or long_link or _cstr(header[157:257])
            pax, long_name, long_link = {}, "", ""
            yield kind, name, link, size


_ZERO_BLOCK = bytes(512)


def _cstr(field: bytes) -> str:
    return field.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _header_name(header: bytes) -> str:
    name = _cstr(header[0:100])
    if header[257:262] == b"ustar" and (prefix := _cstr(header[345:500])):
        name = f"{prefix}/{name}"
    return name


def _number(field: bytes) -> int:
    if field[0] & 0x80:  # GNU base-256 for sizes over 8 GiB
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def _parse_pax(data: bytes) -> dict[str, str]:
    records: dict[str, str] = {}
    while data:
        length, _, rest = data.partition(b" ")
        n = int(length)
        record = rest[: n - len(length) - 2]  # minus "<len> " and the trailing newline
        key, _, value = record.partition(b"=")
        records[key.decode()] = value.decode("utf-8", "surrogateescape")
        data = data[n:]
    return records
