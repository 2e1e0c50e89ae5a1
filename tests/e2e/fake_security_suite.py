"""A stand-in for Debian's security suite, on loopback: a fake server, on purpose.

The images are built with `apt-get upgrade` from bookworm-security, so on the day they are
audited no package is older than the suite's and the real mirror gives no Debian row at all.
To prove the row path end to end (Packages index → a newer version → that `.deb`'s
changelog → the CVE ids), this server says the suite has one installed package in a newer
version, and serves a `.deb` of it whose `changelog.Debian.gz` names CVE ids in the entry for
that version (and an older CVE in the installed version's entry, which must not be reported).
`$BUILDER_DEBIAN_SECURITY_MIRROR` points the audit at it.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import lzma
import tarfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SUITE = "bookworm-security"
FIXED = ("CVE-2099-41001", "CVE-2099-41002")  # named by the newer version's changelog entry
OLDER = "CVE-2000-41000"  # named by the installed version's entry: already fixed there


@dataclass(frozen=True)
class Suite:
    url: str  # the mirror's base URL
    package: str
    installed: str
    newer: str


def changelog(package: str, installed: str, newer: str) -> bytes:
    text = (f"{package} ({newer}) {SUITE}; urgency=high\n\n"
            f"  * Fix {FIXED[0]} and {FIXED[1]} (torch-images e2e stand-in).\n\n"
            " -- Test <test@example.org>  Sun, 06 Dec 2026 00:00:00 +0000\n\n"
            f"{package} ({installed}) bookworm; urgency=medium\n\n"
            f"  * Fix {OLDER}.\n\n"
            " -- Test <test@example.org>  Sun, 01 Nov 2026 00:00:00 +0000\n")
    return gzip.compress(text.encode())


def tar_gz(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def ar(members: dict[str, bytes]) -> bytes:
    """An `ar` archive, as a .deb is one."""
    out = b"!<arch>\n"
    for name, data in members.items():
        header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n"
        out += header.encode() + data + (b"\n" if len(data) % 2 else b"")
    return out


def deb(package: str, installed: str, newer: str) -> bytes:
    doc = f"./usr/share/doc/{package}/changelog.Debian.gz"
    return ar({"debian-binary": b"2.0\n",
               "control.tar.gz": tar_gz({"./control": f"Package: {package}\n".encode()}),
               "data.tar.gz": tar_gz({doc: changelog(package, installed, newer)})})


def files(package: str, installed: str, newer: str, arch: str) -> dict[str, bytes]:
    """path → bytes: the suite's Packages index for `arch` and the one `.deb` it names."""
    pool = f"pool/updates/main/{package[0]}/{package}/{package}_{newer}_{arch}.deb"
    stanza = (f"Package: {package}\nVersion: {newer}\nArchitecture: {arch}\n"
              f"Filename: {pool}\n\n")
    return {f"/dists/{SUITE}/main/binary-{arch}/Packages.xz": lzma.compress(stanza.encode()),
            f"/{pool}": deb(package, installed, newer)}


@contextlib.contextmanager
def security_suite(package: str, installed: str, arch: str = "amd64") -> Iterator[Suite]:
    """The fake suite on a free loopback port while the block runs; `package` is newer there."""
    newer = f"{installed}+e2e1"  # dpkg orders it after the installed version
    served = files(package, installed, newer, arch)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = served.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.send_header("Content-Length", str(len(body or b"")))
            self.end_headers()
            self.wfile.write(body or b"")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Suite(f"http://127.0.0.1:{server.server_address[1]}", package, installed, newer)
    finally:
        server.shutdown()
        server.server_close()
