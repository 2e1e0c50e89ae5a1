"""A host-side, content-addressed wheelhouse shared by every variant.

Each wheel is downloaded once (pip, against the lock's hashes) into `wheelhouse/`, indexed by its
sha256. A build step gets a set folder `context/sets/<set>/` holding its requirements and hard
links to exactly its wheels, bind-mounted into the install step: builds need no network, and a
wheel used by ten variants is fetched and stored once.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from builder import platforms, proc, state
from builder.errors import BuilderError
from builder.matrix import Variant

_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


@dataclass
class Stats:
    downloaded_bytes: int = 0
    reused_bytes: int = 0


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
        self.stats = Stats()

    def _save(self) -> None:
        state.atomic_write(self.index_path, json.dumps(self.index, indent=1, sort_keys=True))

    def find(self, hashes: Iterable[str],
             platform: platforms.Platform | None = None) -> Path | None:
        """The stored wheel matching any of the lock's hashes, re-verified if present. A lock
        lists the hashes of every platform's wheels: only one for `platform` is taken."""
        for h in hashes:
            name = self.index.get(h)
            if name and (self.root / name).exists() and (
                    platform is None or platforms.wheel_matches(name, platform)):
                return self.root / name
        return None

    def ensure(self, variant: Variant, requirements: str,
               progress: Callable[[str], None] = print) -> list[Path]:
        """The wheels for these hash-pinned requirements, downloading only the missing ones."""
        blocks = _hash_blocks(requirements)
        platform = platforms.get(variant.platform)
        missing = [b for b in blocks if self.find(b, platform) is None]
        if missing:
            progress(f"  downloading {len(missing)} wheel(s) for {variant.id}")
            self._download(variant, requirements)
        paths = []
        for hashes in blocks:
            path = self.find(hashes, platform)
            if path is None:
                raise BuilderError(f"no wheel matching the lock's hashes for {variant.id} "
                                   f"({hashes[0][:12]}…) after download")
            size = path.stat().st_size
            if hashes in missing:
                self.stats.downloaded_bytes += size
            else:
                self.stats.reused_bytes += size
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
