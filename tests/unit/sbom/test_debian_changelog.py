"""CVE ids from a fixed Debian package's changelog (a .deb made here, no network)."""

from __future__ import annotations

import gzip
import io
import tarfile

import pytest

from sbom import debian_changelog

CHANGELOG = """openssl (3.0.17-1~deb12u2) bookworm-security; urgency=medium

  * Fix CVE-2025-9230: out-of-bounds read in RFC 3211 KEK unwrap.
  * Fix CVE-2025-9232 and CVE-2025-9230 (again).

 -- Debian Security <team@security.debian.org>  Tue, 30 Sep 2025 00:00:00 +0000

openssl (3.0.17-1~deb12u1) bookworm-security; urgency=medium

  * Fix CVE-2025-27587.

 -- Debian Security <team@security.debian.org>  Mon, 01 Jul 2025 00:00:00 +0000

openssl (3.0.16-1~deb12u1) bookworm; urgency=medium

  * Fix CVE-2024-0001 (already installed).

 -- Debian <team@debian.org>  Mon, 01 Jan 2025 00:00:00 +0000
"""


def deb(package: str, changelog: str | None) -> bytes:
    """An ar archive with a data.tar.xz holding `package`'s changelog.Debian.gz."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as tar:
        if changelog is not None:
            body = gzip.compress(changelog.encode())
            info = tarfile.TarInfo(f"./usr/share/doc/{package}/changelog.Debian.gz")
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    out = b"!<arch>\n"
    for name, member in ((b"debian-binary", b"2.0\n"), (b"data.tar.xz", data.getvalue())):
        out += (name.ljust(16) + b"0".ljust(12) + b"0".ljust(6) + b"0".ljust(6)
                + b"100644".ljust(8) + str(len(member)).encode().ljust(10) + b"`\n")
        out += member + (b"\n" if len(member) % 2 else b"")
    return out


def test_the_entries_newer_than_the_installed_version_name_the_cves() -> None:
    text = debian_changelog.changelog_of(deb("openssl", CHANGELOG), "openssl")
    assert debian_changelog.cves_since(text, "3.0.16-1~deb12u1") == [
        "CVE-2025-9230", "CVE-2025-9232", "CVE-2025-27587"]
    assert debian_changelog.cves_since(text, "3.0.17-1~deb12u1") == [
        "CVE-2025-9230", "CVE-2025-9232"]
    assert debian_changelog.cves_since(text, "3.0.17-1~deb12u2") == []


def test_a_package_without_its_own_changelog_names_none() -> None:
    assert debian_changelog.changelog_of(deb("libssl3", None), "libssl3") == ""
    with pytest.raises(ValueError, match=r"not a \.deb"):
        debian_changelog.changelog_of(b"PK\x03\x04", "x")
