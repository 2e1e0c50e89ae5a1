"""Collect an image's contents from its filesystem, without running it.

Only the few files the SBOM needs are read (dpkg status, copyright files, os-release, dist-info
metadata), and native libraries bundled in wheels are hashed. Two ways, same result:

- fast: with a local engine storing images as overlay2, straight from the image's layer
  directories on disk, merged with overlayfs' rules (sbom/layers.py); a library's digest is its
  wheel's RECORD line when that gives the same size and lies in the same layer (one install
  wrote both; nothing replaced the file since), else it is hashed by a small thread pool;
- fallback (remote engine, another storage driver, not root, unreadable layers): one pass over
  `docker export` of a created (never started) container, read as a tar stream, the libraries
  hashed while they stream past.

`ImageContents.collector` says which was used; SBOM_COLLECTOR=export forces the export,
SBOM_COLLECTOR=overlay2 makes a refusal of the fast path an error. Nothing is written to disk,
and only in-image paths are recorded. The engine's socket API is sbom/engine_socket.py, the
tar format sbom/tarstream.py.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import logging
import os
import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from builder.core import engine
from builder.core.errors import EngineError
from sbom.engine_socket import export_stream, inspect_image
from sbom.tarstream import Readable, TarReader

_SITE_RE = re.compile(
    r"^(?P<site>(?:.*/)?lib/python(?P<py>\d+(?:\.\d+)?)/(?:site|dist)-packages)/(?P<rel>.+)$"
)
# Nested dist-info too: setuptools and pip vendor packages (syft reports them, so must we).
_DIST_INFO_RE = re.compile(r"^(?P<dir>(?:[^/]+/)*[^/]+\.dist-info)/(?P<file>METADATA|RECORD)$")
_COPYRIGHT_RE = re.compile(r"^usr/share/doc/(?P<pkg>[^/]+)/copyright$")
_SO_RE = re.compile(r"\.so(\.\d+)*$")
_OS_RELEASE = ("etc/os-release", "usr/lib/os-release")
_DPKG_STATUS = "var/lib/dpkg/status"
_DPKG_STATUS_D = re.compile(r"^var/lib/dpkg/status\.d/[^/]+$")
_MAX_TEXT = 4 << 20  # a METADATA or copyright file larger than this is not text we want
_FAST_ENV = "SBOM_COLLECTOR"  # "export" forces the export stream, "overlay2" refuses to fall back
log = logging.getLogger(__name__)



@dataclass
class NativeLib:
    """A shared library bundled inside a wheel (site-packages/nvidia/**, torch/lib)."""

    path: str  # absolute in-image path
    site: str  # absolute site-packages directory holding it
    rel: str  # path relative to `site`, as RECORD names it
    sha256: str
    size: int
    digest_from: str = "file"  # "file": hashed here; "wheel-record": its RECORD line, same size


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
    collector: str = ""  # how it was read: "overlay2" (layer directories) or "docker-export"


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
    """Inspect `image_ref` and read its filesystem: from its overlay2 layers, else an export."""
    info = inspect_image(image_ref)
    if info is None:
        raise EngineError(f"no image `{image_ref}` in the engine", hint="build or pull it first")
    contents = read_contents(info)
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


def read_contents(info: dict[str, Any]) -> ImageContents:
    """The image's contents (`info` is its `docker image inspect`); see `collect`.

    The local engine's overlay2 layer directories are read when they can be vouched for (see
    sbom.layers); otherwise, or when reading them fails, the container export stream is.
    `ImageContents.collector` and a debug log line say which was used and why.
    """
    from sbom import layers

    choice = os.environ.get(_FAST_ENV, "")
    if choice != "export":
        try:
            contents = read_layers(layers.layer_dirs(info, engine.engine_address()))
            log.debug("sbom: read %s from its overlay2 layers", info["Id"])
            return contents
        except layers.Unavailable as exc:
            if choice == "overlay2":
                raise EngineError(f"cannot read the layers of {info['Id']}: {exc}") from exc
            log.debug("sbom: overlay2 layers of %s not used (%s); exporting", info["Id"], exc)
    return read_export(info["Id"])


def read_export(image_id: str) -> ImageContents:
    """The contents from one streamed `docker export` of a created (never started) container."""
    # An imported image may have no CMD; `create` needs one but never runs it.
    with engine.container(image_id, ["/sbom-collect-never-runs"]) as name, \
            export_stream(name) as stream:
        return read_tar_stream(stream)


def read_tar_stream(stream: Readable) -> ImageContents:
    """Read the needed members from an uncompressed tar stream of a root filesystem."""
    acc = _Accumulator()
    tar = TarReader(stream)
    for kind, raw_name, linkname, size in tar.members():
        name = raw_name.removeprefix("./").lstrip("/")
        if kind == "2":
            acc.add_link(name, linkname)
        wanted = _wanted(name, size) if kind in "07" else None
        if wanted is None:
            tar.skip(size)
        elif wanted[0] == "lib":
            digest = hashlib.sha256()
            for chunk in tar.chunks(size):
                digest.update(chunk)
            acc.add_lib(wanted[1], digest.hexdigest(), size)
        else:
            acc.add_text(wanted, tar.data(size))
    return acc.finish(tar.total, "docker-export")


def read_layers(dirs: list[bytes]) -> ImageContents:
    """The same contents as `read_tar_stream` of an export, from overlay2 layer directories.

    Walks the union view (see sbom.layers) and opens only the needed files. A bundled native
    library's digest is taken from its wheel's RECORD when that names it with its size and both
    files come from the same layer (written by one install, nothing changed them since);
    others are hashed in a thread pool, largest first. Raises layers.Unavailable when a
    directory or file cannot be read, or changes while read.
    """
    from sbom import layers

    acc = _Accumulator()
    total = 0
    texts: list[tuple[tuple[str, Any], bytes]] = []
    libs: list[tuple[int, bytes, tuple[str, str]]] = []
    try:
        for member in layers.walk(dirs):
            if member.kind == "2":
                if member.name in _OS_RELEASE:
                    acc.add_link(member.name, os.fsdecode(os.readlink(member.path)))
            elif _wanted(member.name, None) is not None:
                size = member.size()
                wanted = _wanted(member.name, size)
                if wanted is None:
                    continue
                if wanted[0] == "lib":
                    libs.append((size, member.path, wanted[1]))
                else:
                    texts.append((wanted, member.path))
        recorded: dict[str, tuple[str, int, bytes]] = {}  # lib path → (sha256, size, layer)
        for wanted, path in texts:  # walk order, which dpkg_status keeps
            with open(path, "rb") as f:
                data = f.read()
            total += len(data)
            acc.add_text(wanted, data)
            if wanted[0] == "dist" and wanted[1][3] == "record":
                layer = _layer_of(path, dirs)
                for rel, digest, size in record_digests(data.decode("utf-8", "replace")):
                    recorded[f"{wanted[1][0]}/{rel}"] = (digest, size, layer)
        total += _hash_libs(acc, libs, recorded, dirs)
    except OSError as exc:
        raise layers.Unavailable(f"cannot read the image's layers: {exc}") from exc
    return acc.finish(total, "overlay2")


def _hash_libs(acc: _Accumulator, libs: list[tuple[int, bytes, tuple[str, str]]],
               recorded: dict[str, tuple[str, int, bytes]], dirs: list[bytes]) -> int:
    """Add each library's digest, from RECORD (see read_layers) or hashed; bytes read."""
    from sbom import layers

    hasher = layers.Hasher()
    total = 0
    try:
        for size, path, where in sorted(libs, key=lambda lib: -lib[0]):
            known = recorded.get(f"{where[0]}/{where[1]}")
            if known and known[1] == size and known[2] == _layer_of(path, dirs):
                acc.add_lib(where, known[0], size, "wheel-record")
            else:
                hasher.submit(path, (where, size))
        for (where, size), hexdigest, n in hasher.results():
            if n != size:
                raise layers.Unavailable(f"{where[0]}/{where[1]} changed size while read")
            total += n
            acc.add_lib(where, hexdigest, size)
    finally:
        hasher.close()
    return total


def _layer_of(path: bytes, dirs: list[bytes]) -> bytes:
    return next((d for d in dirs if path.startswith(d + b"/")), b"")


def record_digests(record: str) -> Iterator[tuple[str, str, int]]:
    """(path, sha256 hex, size) of the bundled native libraries a RECORD lists with both."""
    for row in csv.reader(line for line in record.splitlines() if ".so" in line):
        if len(row) != 3 or not is_bundled_native_lib(row[0]) or not row[2].isdigit():
            continue
        algo, _, value = row[1].partition("=")
        if algo != "sha256" or len(value) != 43:
            continue
        try:
            digest = base64.urlsafe_b64decode(value + "=")
        except ValueError:
            continue
        if len(digest) == 32:
            yield row[0], digest.hex(), int(row[2])


def _wanted(name: str, size: int | None) -> tuple[str, Any] | None:
    """What the collector reads from a regular file at `name` (relative): None for nothing.

    `size` None asks whether the name alone could be wanted (the size limit not applied yet).
    """
    # Cheap substring tests first: this runs for every file of the image.
    if "-packages/" in name and (m := _SITE_RE.match(name)):
        site, rel = "/" + m["site"], m["rel"]
        if ".dist-info/" in rel and (d := _DIST_INFO_RE.match(rel)):
            ok = size is None or size <= _MAX_TEXT
            return ("dist", (site, d["dir"], m["py"], d["file"].lower())) if ok else None
        if ".so" in rel and is_bundled_native_lib(rel):
            return "lib", (site, rel)
        return None
    if name in _OS_RELEASE:
        return "os", name
    if name == _DPKG_STATUS or _DPKG_STATUS_D.match(name):
        return "dpkg", None
    if m := _COPYRIGHT_RE.match(name):
        return ("copyright", m["pkg"]) if size is None or size <= _MAX_TEXT else None
    return None


class _Accumulator:
    """Builds ImageContents from members in tar order, whichever way they were read."""

    def __init__(self) -> None:
        self.out = ImageContents()
        self.links: dict[str, str] = {}  # os-release is usually a symlink
        self.texts: dict[str, str] = {}
        self.dists: dict[str, PythonDist] = {}

    def add_link(self, name: str, linkname: str) -> None:
        if name in _OS_RELEASE:
            target = posixpath.join(posixpath.dirname(name), linkname)
            self.links[name] = posixpath.normpath(target).lstrip("/")

    def add_text(self, wanted: tuple[str, Any], data: bytes) -> None:
        what, arg = wanted
        text = data.decode("utf-8", errors="replace")
        if what == "os":
            self.texts[arg] = text
        elif what == "dpkg":
            self.out.dpkg_status.append(text)
        elif what == "copyright":
            self.out.copyrights[arg] = text
        else:
            site, dist_info, python, file = arg
            dist = self.dists.setdefault(
                f"{site}/{dist_info}", PythonDist(site=site, dist_info=dist_info, python=python))
            setattr(dist, file, text)

    def add_lib(self, where: tuple[str, str], sha256: str, size: int,
                digest_from: str = "file") -> None:
        site, rel = where
        self.out.native_libs.append(
            NativeLib(f"{site}/{rel}", site, rel, sha256, size, digest_from))

    def finish(self, bytes_read: int, collector: str) -> ImageContents:
        out = self.out
        for path in _OS_RELEASE:
            text = self.texts.get(path) or self.texts.get(self.links.get(path, ""))
            if text:
                out.os_release = parse_os_release(text)
                break
        out.dists = sorted(self.dists.values(), key=lambda d: (d.site, d.dist_info))
        out.native_libs.sort(key=lambda lib: lib.path)
        out.bytes_read = bytes_read
        out.collector = collector
        return out


def is_bundled_native_lib(rel: str) -> bool:
    """A shared library that a wheel bundles: nvidia/**/lib*.so* or torch/lib/*.so*."""
    base = posixpath.basename(rel)
    if not _SO_RE.search(base):
        return False
    return rel.startswith("nvidia/") or rel.startswith("torch/lib/")


def parse_os_release(text: str) -> dict[str, str]:
    """KEY=value lines, shell-style quotes removed."""
    result: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key and not key.startswith("#"):
            result[key] = value.strip().strip("\"'")
    return result
