"""Collect an image's contents from its filesystem, without running it.

One pass over `docker export` of a created (never started) container, read as a tar stream: only
the few members the SBOM needs are read (dpkg status, copyright files, os-release, dist-info
metadata); native libraries bundled in wheels are hashed while they stream past. Nothing is
written to disk, and only in-image paths are recorded.
"""

from __future__ import annotations

import hashlib
import io
import posixpath
import re
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from builder import engine
from builder.errors import EngineError

# Large reads: tarfile's stream mode skips unwanted members by reading `bufsize` at a time.
_BUFSIZE = 4 << 20
_SITE_RE = re.compile(r"^(?P<site>(?:.*/)?lib/python(?P<py>\d+\.\d+)/(?:site|dist)-packages)/(?P<rel>.+)$")
_DIST_INFO_RE = re.compile(r"^(?P<dir>[^/]+\.dist-info)/(?P<file>METADATA|RECORD)$")
_COPYRIGHT_RE = re.compile(r"^usr/share/doc/(?P<pkg>[^/]+)/copyright$")
_SO_RE = re.compile(r"\.so(\.\d+)*$")
_OS_RELEASE = ("etc/os-release", "usr/lib/os-release")
_DPKG_STATUS = "var/lib/dpkg/status"
_DPKG_STATUS_D = re.compile(r"^var/lib/dpkg/status\.d/[^/]+$")
_MAX_TEXT = 4 << 20  # a METADATA or copyright file larger than this is not text we want


@dataclass
class NativeLib:
    """A shared library bundled inside a wheel (site-packages/nvidia/**, torch/lib)."""

    path: str  # absolute in-image path
    site: str  # absolute site-packages directory holding it
    rel: str  # path relative to `site`, as RECORD names it
    sha256: str
    size: int


@dataclass
class PythonDist:
    """One installed distribution: its dist-info directory and the files we read from it."""

    site: str
    dist_info: str
    python: str  # "3.11", from the site-packages path
    metadata: str = ""
    record: str = ""


@dataclass
class ImageContents:
    """What the filesystem says; `ImageFacts` adds what the engine says."""

    os_release: dict[str, str] = field(default_factory=dict)
    dpkg_status: list[str] = field(default_factory=list)
    copyrights: dict[str, str] = field(default_factory=dict)
    dists: list[PythonDist] = field(default_factory=list)
    native_libs: list[NativeLib] = field(default_factory=list)
    bytes_read: int = 0


@dataclass
class ImageFacts:
    ref: str
    image_id: str
    repo_tags: list[str]
    repo_digests: list[str]
    labels: dict[str, str]
    created: str
    os: str
    architecture: str
    contents: ImageContents


def collect(image_ref: str) -> ImageFacts:
    """Inspect `image_ref` and read its filesystem in one streamed export."""
    engine.ensure_engine()
    info = engine.inspect_image(image_ref)
    if info is None:
        raise EngineError(f"no image `{image_ref}` in the engine", hint="build or pull it first")
    # An imported image may have no CMD; `create` needs one but never runs it.
    with engine.container(info["Id"], ["/sbom-collect-never-runs"]) as name:
        contents = read_tar_stream(_export_stream(name))
    return ImageFacts(
        ref=image_ref,
        image_id=info["Id"],
        repo_tags=list(info.get("RepoTags") or []),
        repo_digests=list(info.get("RepoDigests") or []),
        labels=dict((info.get("Config") or {}).get("Labels") or {}),
        created=info.get("Created", ""),
        os=info.get("Os", "linux"),
        architecture=info.get("Architecture", "amd64"),
        contents=contents,
    )


def _export_stream(container: str) -> io.RawIOBase:
    """The container's filesystem as a tar byte stream, straight from the engine API."""
    import docker  # the SDK streams the export over the socket; the CLI would need a pipe

    try:
        api = docker.APIClient(base_url=engine.engine_address(), version="auto", timeout=600)
        return _ChunkReader(api.export(container, chunk_size=_BUFSIZE))
    except docker.errors.DockerException as exc:
        raise EngineError(f"cannot export container `{container}`: {exc}") from exc


class _ChunkReader(io.RawIOBase):
    """A read-only file object over an iterator of byte chunks (what tarfile's `r|` mode needs)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._buf = memoryview(b"")
        self.total = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buf:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._buf = memoryview(chunk)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        self.total += n
        return n


def read_tar_stream(stream: io.RawIOBase | io.BufferedIOBase) -> ImageContents:
    """Read the needed members from an uncompressed tar stream of a root filesystem."""
    out = ImageContents()
    links: dict[str, str] = {}  # os-release is usually a symlink
    texts: dict[str, str] = {}
    dists: dict[str, PythonDist] = {}
    with tarfile.open(fileobj=stream, mode="r|", bufsize=_BUFSIZE) as tar:
        for member in tar:
            name = member.name.removeprefix("./").lstrip("/")
            if member.issym() and name in _OS_RELEASE:
                links[name] = posixpath.normpath(posixpath.join(posixpath.dirname(name),
                                                                member.linkname)).lstrip("/")
            if not member.isfile():
                continue
            _read_member(tar, member, name, out, texts, dists)
    for path in _OS_RELEASE:
        text = texts.get(path) or texts.get(links.get(path, ""))
        if text:
            out.os_release = parse_os_release(text)
            break
    out.dists = sorted(dists.values(), key=lambda d: (d.site, d.dist_info))
    out.native_libs.sort(key=lambda lib: lib.path)
    out.bytes_read = getattr(stream, "total", 0)
    return out


def _read_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, name: str, out: ImageContents,
    texts: dict[str, str], dists: dict[str, PythonDist],
) -> None:
    if name in _OS_RELEASE:
        texts[name] = _text(tar, member)
    elif name == _DPKG_STATUS or _DPKG_STATUS_D.match(name):
        out.dpkg_status.append(_text(tar, member))
    elif m := _COPYRIGHT_RE.match(name):
        if member.size <= _MAX_TEXT:
            out.copyrights[m["pkg"]] = _text(tar, member)
    elif m := _SITE_RE.match(name):
        _read_site_member(tar, member, m, out, dists)


def _read_site_member(
    tar: tarfile.TarFile, member: tarfile.TarInfo, m: re.Match[str], out: ImageContents,
    dists: dict[str, PythonDist],
) -> None:
    site, rel = "/" + m["site"], m["rel"]
    if d := _DIST_INFO_RE.match(rel):
        key = f"{site}/{d['dir']}"
        dist = dists.setdefault(key, PythonDist(site=site, dist_info=d["dir"], python=m["py"]))
        if member.size <= _MAX_TEXT:
            setattr(dist, d["file"].lower(), _text(tar, member))
    elif is_bundled_native_lib(rel):
        sha, size = _sha256(tar, member)
        out.native_libs.append(NativeLib(f"{site}/{rel}", site, rel, sha, size))


def is_bundled_native_lib(rel: str) -> bool:
    """A shared library that a wheel bundles: nvidia/**/lib*.so* or torch/lib/*.so*."""
    base = posixpath.basename(rel)
    if not _SO_RE.search(base):
        return False
    return rel.startswith("nvidia/") or rel.startswith("torch/lib/")


def _text(tar: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    fh = tar.extractfile(member)
    return fh.read().decode("utf-8", errors="replace") if fh else ""


def _sha256(tar: tarfile.TarFile, member: tarfile.TarInfo) -> tuple[str, int]:
    fh = tar.extractfile(member)
    digest = hashlib.sha256()
    if fh is not None:
        while chunk := fh.read(_BUFSIZE):
            digest.update(chunk)
    return digest.hexdigest(), member.size


def parse_os_release(text: str) -> dict[str, str]:
    """KEY=value lines, shell-style quotes removed."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            result[key] = value.strip().strip("\"'")
    return result
