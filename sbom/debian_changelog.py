"""The CVE ids a Debian security update fixes, read from the fixed package's own changelog.

The security suite's Packages index says only that a newer version exists; the `.deb` it names
carries `usr/share/doc/<package>/changelog.Debian.gz`, whose entries newer than the installed
version name the CVEs they fix (`* Fix CVE-2025-1234: …`). A package whose doc folder is a link
to another package's (`libfoo1` → `libfoo-common`) has no changelog of its own: no ids, said so.
"""

from __future__ import annotations

import gzip
import io
import re
import tarfile
import urllib.request

from sbom import dpkg

CVE = re.compile(r"\bCVE-\d{4}-\d{4,}\b")
ENTRY = re.compile(r"^(?P<source>[a-z0-9][a-z0-9+.-]*) \((?P<version>[^)]+)\) ", re.MULTILINE)
DEB_CAP = 64 * 1024 * 1024  # a security update's .deb; libc6's is a few MB


def ar_members(data: bytes) -> dict[str, bytes]:
    """The members of an `ar` archive (a .deb: debian-binary, control.tar.*, data.tar.*)."""
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("not a .deb (no ar header)")
    out, pos = {}, 8
    while pos + 60 <= len(data):
        header = data[pos:pos + 60]
        name = header[:16].decode().strip().rstrip("/")
        size = int(header[48:58].decode().strip())
        out[name] = data[pos + 60:pos + 60 + size]
        pos += 60 + size + (size % 2)
    return out


def changelog_of(deb: bytes, package: str) -> str:
    """`package`'s changelog.Debian.gz text inside `deb` ('' when it has none of its own)."""
    data = next((v for k, v in ar_members(deb).items() if k.startswith("data.tar")), None)
    if data is None:
        raise ValueError("the .deb has no data.tar member")
    wanted = {f"./usr/share/doc/{package}/changelog.Debian.gz",
              f"usr/share/doc/{package}/changelog.Debian.gz"}
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:  # gz, xz or bz2, by its header
        for member in tar:
            if member.name in wanted and member.isfile():
                found = tar.extractfile(member)
                return gzip.decompress(found.read()).decode("utf-8", "replace") if found else ""
    return ""


def cves_since(changelog: str, installed: str) -> list[str]:
    """The CVE ids of the entries newer than `installed` (the changelog is newest first)."""
    heads = list(ENTRY.finditer(changelog))
    found: list[str] = []
    for head, after in zip(heads, [*heads[1:], None], strict=True):
        if dpkg.compare_versions(head["version"], installed) <= 0:
            break
        text = changelog[head.end():after.start() if after else len(changelog)]
        found += [c for c in dict.fromkeys(CVE.findall(text)) if c not in found]
    return found


def fixed_cves(mirror: str, filename: str, package: str, installed: str,
               timeout: float = 120) -> list[str]:
    """The CVE ids that the `.deb` at `mirror/filename` fixes since `installed`."""
    url = f"{mirror.rstrip('/')}/{filename}"
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        deb = resp.read(DEB_CAP + 1)
    if len(deb) > DEB_CAP:
        raise ValueError(f"{url} is larger than {DEB_CAP} bytes")
    return cves_since(changelog_of(deb, package), installed)
