"""Which containerd the pull bench measures: `--containerd system|debian-13|debian-sid|PATH`.

  system     the containerd on PATH (this machine's: Debian 12's 1.6.20, built with Go 1.19,
             whose sha256 is about a third as fast as than Go ≥ 1.21's; bench/PULL.md)
  debian-13  the containerd a current Debian node runs: trixie's `containerd` package, fetched
             from deb.debian.org and trusted only through Debian's signature chain
             (bench/debian.py), extracted under the bench's folder, keyed by the .deb's sha256
  debian-sid the same from Debian unstable: containerd 2.x (2.1.9 when measured), whose CRI
             pulls through the transfer service; sid's index expires within a week, so a
             frozen mirror needs `--allow-expired-index` (the report then says so)
  PATH       a folder holding `containerd`, `ctr` and `containerd-shim-runc-v2` (or the
             `containerd` binary in such a folder): a build of your own
runc, unpigz and every other helper stay the system's: the daemon's PATH gets the chosen folder
first, so its own shim is the one started. Any of them with `:no-unpigz` (`debian-13:no-unpigz`)
runs with CONTAINERD_DISABLE_PIGZ=1: containerd then inflates gzip in its own process, as on a
node without pigz (Debian's containerd package depends on runc alone; pigz is optional, and
tools/setup.sh installs it on this machine for dockerd's own pulls). Each is shown with its
version and the Go that built it, read from the binary's Go build info, not from a name.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench import debian
from bench.varint import read_varint
from builder.core import proc
from builder.core.errors import BuilderError

BINARIES = ("containerd", "ctr", "containerd-shim-runc-v2")
GO_BUILDINFO = b"\xff Go buildinf:"  # Go ≥ 1.18: 32-byte header, then the version inline
DEBIAN = {"debian-13": "trixie", "debian-sid": "sid"}
CHOICES = ("system", *DEBIAN, "PATH")
NO_UNPIGZ = ":no-unpigz"  # containerd reads CONTAINERD_DISABLE_PIGZ (archive/compression)


@dataclass(frozen=True)
class Containerd:
    """One containerd to measure: its binaries and what it is."""

    name: str  # the spec: system, debian-13, debian-sid or the folder given, maybe :no-unpigz
    containerd: str
    ctr: str
    bin_dir: str  # first on the daemon's PATH ("" for the system's own)
    version: str  # `containerd --version`
    go: str  # the Go release that built the daemon
    source: str  # where it came from and how it was trusted
    unpigz: bool = True  # False: CONTAINERD_DISABLE_PIGZ=1, gzip inflated in-process

    def facts(self) -> dict[str, Any]:
        """What the report shows of it, with the `unpigz` it runs ("" for none, "disabled"
        under CONTAINERD_DISABLE_PIGZ): containerd decompresses gzip in that child process."""
        found = shutil.which("unpigz", path=self.env()["PATH"]) or ""
        return {**asdict(self), "unpigz": found if self.unpigz or not found else "disabled"}

    def env(self) -> dict[str, str]:
        """The daemon's environment: its own folder first on PATH (its shim), the rest kept."""
        path = os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        env = {**os.environ, "PATH": f"{self.bin_dir}:{path}" if self.bin_dir else path}
        env.pop("CONTAINERD_DISABLE_PIGZ", None)
        return env if self.unpigz else {**env, "CONTAINERD_DISABLE_PIGZ": "1"}


def go_version(binary: Path) -> str:
    """The Go release a binary was built with, from its build info (`go version FILE` reads
    the same bytes); "unknown" for a binary without it (Go < 1.18 or not Go)."""
    data = binary.read_bytes()
    at = data.find(GO_BUILDINFO)
    if at < 0 or not data[at + 15] & 2:
        return "unknown"
    size, start = read_varint(data, at + 32)
    return data[start:start + size].decode(errors="replace")


def version(containerd: str) -> str:
    """`containerd --version`'s version fields (upstream and, for a distribution, its own)."""
    out = proc.run([containerd, "--version"], timeout=60).stdout.split()
    return " ".join(out[2:]) or "unknown"


def in_folder(name: str, folder: Path, source: str) -> Containerd:
    """The three binaries in `folder`, each required."""
    paths = {b: folder / b for b in BINARIES}
    absent = [str(p) for p in paths.values() if not os.access(p, os.X_OK)]
    if absent:
        raise BuilderError(f"no executable `{absent[0]}`",
                           hint=f"--containerd PATH names a folder holding {', '.join(BINARIES)}")
    daemon = str(paths["containerd"])
    return Containerd(name=name, containerd=daemon, ctr=str(paths["ctr"]),
                      bin_dir=str(folder), version=version(daemon),
                      go=go_version(paths["containerd"]), source=source)


def system() -> Containerd:
    daemon = proc.which("containerd", hint="apt-get install containerd")
    return Containerd(name="system", containerd=daemon, ctr=proc.which("ctr"), bin_dir="",
                      version=version(daemon), go=go_version(Path(daemon)),
                      source=f"{daemon} on PATH")


def from_debian(name: str, cache: Path, allow_expired: bool = False) -> Containerd:
    package, root = debian.unpacked("containerd", DEBIAN[name], cache,
                                    allow_expired=allow_expired)
    stale = (f"; the index's Valid-Until ({package.expired}) had passed, accepted by "
             "--allow-expired-index" if package.expired else "")
    source = (f"deb.debian.org {DEBIAN[name]} {Path(package.filename).name}, sha256 "
              f"{package.sha256} (InRelease signature, Packages.xz and .deb hashes "
              f"checked{stale})")
    return in_folder(name, root / "usr" / "bin", source)


def resolve(spec: str, cache: Path, allow_expired: bool = False) -> Containerd:
    """`system`, `debian-13`, `debian-sid` or a folder (or a containerd binary in one), each
    optionally with `:no-unpigz`."""
    if spec.endswith(NO_UNPIGZ):
        node = resolve(spec.removesuffix(NO_UNPIGZ), cache, allow_expired)
        return replace(node, name=spec, unpigz=False)
    if spec == "system":
        return system()
    if spec in DEBIAN:
        return from_debian(spec, cache, allow_expired)
    path = Path(spec).resolve()
    if not path.exists():
        raise BuilderError(f"--containerd `{spec}`: no such folder",
                           hint=f"one of {', '.join(CHOICES)}")
    return in_folder(spec, path if path.is_dir() else path.parent, f"{path} (given)")
