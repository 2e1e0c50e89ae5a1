"""Base-128 varints, the one encoding protobuf (bench/cri.py's CRI messages) and Go's build
info (bench/containerds.py: a binary's Go release) both use."""

from __future__ import annotations


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def read_varint(data: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        byte = data[i]
        n |= (byte & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if not byte & 0x80:
            return n, i
