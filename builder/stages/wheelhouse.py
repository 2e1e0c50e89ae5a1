"""What the host gives the build beside the lock: tool wheels and wheels from local folders.

The wheels of the locks are not sent through the build context (gigabytes, re-sent after every
cache prune): the install steps fetch them into a BuildKit cache mount shared by all builds, and
uv checks each against the lock's hashes. The host keeps a small content-addressed wheelhouse for
what the build cannot fetch itself: the pinned uv (downloaded once, indexed by sha256) and wheels
that only exist in a variant's local `find_links` folders. A build step's set folder
`context/sets/<set>/` holds its requirements and hard links to those wheels.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from builder.core import proc, settings, simple_index, state
from builder.core.errors import BuilderError
from builder.model import platforms
from builder.model.lockfile import normalize
from builder.model.matrix import Variant

_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@cache
def supported_tags(python: str, platform: str = platforms.DEFAULT) -> frozenset[Tag]:
    """The wheel tags a CPython `python` ("3.13") on `platform` (a glibc-2.28+ Linux) installs."""
    version = tuple(int(p) for p in python.split(".")[:2])
    names = platforms.get(platform).manylinux_tags
    return frozenset([*cpython_tags(version, platforms=names),
                      *compatible_tags(version, f"cp{version[0]}{version[1]}", names)])


def installable(wheel: str, python: str | None, platform: str = platforms.DEFAULT) -> bool:
    """A lock lists the hashes of every python's and platform's wheel (cp311 and cp313, x86_64
    and aarch64 …): a stored wheel serves a variant only if its tags fit the variant's python
    and platform (without a python, only the platform's machine is checked)."""
    if python is None:
        return platforms.wheel_matches(wheel, platforms.get(platform))
    try:
        tags = parse_wheel_filename(wheel)[3]
    except InvalidWheelFilename:
        return False
    return not tags.isdisjoint(supported_tags(python, platform))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class Wheelhouse:
    def __init__(self, root: Path | None = None) -> None:
        self.root = root or state.path("wheelhouse")
        self.root.mkdir(parents=True, exist_ok=True)
        self.index_path = self.root / "index.json"
        self.index: dict[str, str] = (
            json.loads(self.index_path.read_text()) if self.index_path.exists() else {})

    def _save(self) -> None:
        state.atomic_write(self.index_path, json.dumps(self.index, indent=1, sort_keys=True))

    def find(self, hashes: Iterable[str], python: str | None = None,
             platform: str = platforms.DEFAULT) -> Path | None:
        """The stored wheel matching any of the lock's hashes and installable on `python` and
        `platform` (a lock lists the hashes of every platform's wheels)."""
        for h in hashes:
            name = self.index.get(h)
            if name and installable(name, python, platform) and (self.root / name).exists():
                return self.root / name
        return None

    def ensure(self, variant: Variant, requirements: str,
               progress: Callable[[str], None] = print) -> list[Path]:
        """The wheels for these hash-pinned requirements, downloading only the missing ones."""
        blocks = _hash_blocks(requirements)
        missing = [b for b in blocks if self.find(b, variant.python, variant.platform) is None]
        if missing:
            progress(f"  downloading {len(missing)} wheel(s) for {variant.id}")
            self._download(variant, requirements)
        paths = []
        for hashes in blocks:
            path = self.find(hashes, variant.python, variant.platform)
            if path is None:
                raise BuilderError(f"no wheel matching the lock's hashes for {variant.id} "
                                   f"({hashes[0][:12]}…) after download")
            paths.append(path)
        return paths

    def _download(self, variant: Variant, requirements: str) -> None:
        with tempfile.TemporaryDirectory(dir=self.root) as tmp:
            req = Path(tmp) / "requirements.txt"
            req.write_text(requirements)
            dest = Path(tmp) / "dl"
            proc.run(download_command(variant, req, dest), timeout=3600,
                     env={"PIP_CONFIG_FILE": os.devnull})
            for wheel in sorted(dest.iterdir()):
                digest = sha256_file(wheel)
                target = self.root / wheel.name
                if not target.exists():
                    os.replace(wheel, target)
                self.index[digest] = wheel.name
        self._save()

    def source_wheels(self, variant: Variant, find_links: Iterable[str],
                      requirements: str) -> list[Path]:
        """The wheels of a step's `find_links` sources, which the build then installs from its
        set (its Dockerfile names no source but the index): from local folders (the variant's
        own, or the mirror that stands in for its URLs here), else fetched from each URL's page
        into the wheelhouse, by the lock's hashes."""
        sources = settings.current().wheel_sources(find_links)
        found = local_wheels([s for s in sources if not settings.is_url(s)], requirements)
        for url in (s for s in sources if settings.is_url(s)):
            found += self.from_page(url, variant, requirements)
        return found

    def from_page(self, url: str, variant: Variant, requirements: str) -> list[Path]:
        """The wheels a find-links page lists for these pins whose bytes the lock names,
        downloaded once (checked against the hash) and kept by sha256."""
        pinned = set(_name_versions(requirements))
        accepted = {h for block in _hash_blocks(requirements) for h in block}
        paths = []
        for file in simple_index.project_files(url):
            if not (file.pin in pinned
                    and installable(file.filename, variant.python, variant.platform)
                    and (file.sha256 is None or file.sha256 in accepted)):
                continue
            if (path := self.find([file.sha256] if file.sha256 else [])) is None:
                self.index[simple_index.download(file, self.root, accepted)] = file.filename
                self._save()
                path = self.root / file.filename
            paths.append(path)
        return paths

    def link_set(self, set_dir: Path, requirements: str, wheels: list[Path]) -> None:
        """Fill `set_dir` with the requirements file and hard links to its wheels."""
        staging = set_dir.with_name(set_dir.name + ".tmp")
        if set_dir.exists():
            return  # content-addressed: an existing set is complete (it was renamed into place)
        staging.mkdir(parents=True, exist_ok=True)
        (staging / "requirements.txt").write_text(requirements)
        for wheel in wheels:
            link = staging / wheel.name
            if not link.exists():
                try:
                    os.link(wheel, link)
                except OSError:
                    link.write_bytes(wheel.read_bytes())  # another filesystem: copy
        os.replace(staging, set_dir)


def local_wheels(folders: Iterable[str], requirements: str) -> list[Path]:
    """Wheels in local folders whose name and version a requirement pins (uv checks hashes)."""
    wanted = set(_name_versions(requirements))
    found = []
    for folder in folders:
        root = Path(folder)
        if not root.is_dir():
            continue
        for wheel in sorted(root.glob("*.whl")):
            name, _, rest = wheel.name.partition("-")
            if (normalize(name), rest.split("-", 1)[0]) in wanted:
                found.append(wheel)
    return found


def _name_versions(requirements: str) -> Iterable[tuple[str, str]]:
    for line in requirements.splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)", line)
        if match:
            yield normalize(match.group(1)), match.group(2)


def _hash_blocks(requirements: str) -> list[list[str]]:
    """The accepted hashes of each requirement in a hash-pinned requirements text."""
    blocks: list[list[str]] = []
    for line in requirements.splitlines():
        if line and not line.startswith((" ", "\t", "#", "-")):
            blocks.append([])
        blocks[-1:] and blocks[-1].extend(_HASH.findall(line))
    return [b for b in blocks if b]


def download_command(variant: Variant, req: Path, dest: Path) -> list[str]:
    argv = ["python3", "-m", "pip", "--isolated", "download", "--no-deps", "--require-hashes",
            "--only-binary=:all:", "--implementation", "cp", "--python-version", variant.python,
            "--progress-bar", "off", "-d", str(dest), "-r", str(req)]
    for tag in platforms.get(variant.platform).manylinux_tags:
        argv += ["--platform", tag]
    if ca := proc.host_ca_bundle():
        argv += ["--cert", ca]
    for link in variant.find_links:
        argv += ["--find-links", link]
    if variant.index_url:
        argv += ["--index-url", variant.index_url]
    return argv
