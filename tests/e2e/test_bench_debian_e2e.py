"""bench/debian.py's chain with the real gpgv and dpkg-deb, on a mirror of this test's own: an
archive key made here signs InRelease; a small .deb holds stand-ins of containerd's three
binaries. What the key signed is used; a changed signed line, a key outside the keyring, and
lines added outside the signature are refused or ignored, and nothing reaches the cache."""

from __future__ import annotations

import hashlib
import lzma
import os
import subprocess
from pathlib import Path

import pytest

from bench import containerds, debian
from builder.core.errors import BuilderError

MIRROR = "https://mirror.test/debian"
VERSION = "1.7.24~ds1-6+deb13u1"


def gpg(home: Path, *args: str) -> None:
    subprocess.run(["gpg", "--batch", "--quiet", "--homedir", str(home), "--pinentry-mode",
                    "loopback", "--passphrase", "", *args], check=True, capture_output=True)


def small_deb(tmp: Path) -> bytes:
    pkg = tmp / "pkg"
    (pkg / "DEBIAN").mkdir(parents=True)
    (pkg / "DEBIAN" / "control").write_text(
        f"Package: containerd\nVersion: {VERSION}\nArchitecture: amd64\n"
        "Maintainer: test <t@test>\nDescription: stand-in\n")
    (pkg / "usr" / "bin").mkdir(parents=True)
    for name in containerds.BINARIES:
        path = pkg / "usr" / "bin" / name
        path.write_text(f"#!/bin/sh\necho {name} github.com/containerd/containerd 1.7.24~ds1 "
                        f"{VERSION}\n")
        path.chmod(0o755)
    subprocess.run(["dpkg-deb", "-Zgzip", "--root-owner-group", "--build", str(pkg),
                    str(tmp / "c.deb")], check=True, capture_output=True)
    return (tmp / "c.deb").read_bytes()


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The mirror's files and the keyring that trusts its key."""
    tmp = tmp_path_factory.mktemp("archive")
    home = tmp / "gnupg"
    home.mkdir(mode=0o700)
    gpg(home, "--quick-gen-key", "bench test archive <archive@test>", "ed25519", "sign", "never")
    keyring = tmp / "keyring.gpg"
    keyring.write_bytes(subprocess.run(["gpg", "--homedir", str(home), "--export"],
                                       check=True, capture_output=True).stdout)
    deb = small_deb(tmp)
    filename = f"pool/main/c/containerd/containerd_{VERSION}_amd64.deb"
    packages = lzma.compress(
        (f"Package: containerd\nVersion: {VERSION}\nArchitecture: amd64\n"
         f"Built-Using: golang-1.24 (= 1.24.4-1)\nFilename: {filename}\nSize: {len(deb)}\n"
         f"SHA256: {hashlib.sha256(deb).hexdigest()}\n").encode())
    release = (f"Origin: Debian\nCodename: trixie\nSHA256:\n {hashlib.sha256(packages).hexdigest()}"
               f" {len(packages)} main/binary-amd64/Packages.xz\n")

    def sign(text: str) -> bytes:
        (tmp / "Release").write_text(text)
        (tmp / "InRelease").unlink(missing_ok=True)
        gpg(home, "--clearsign", "--output", str(tmp / "InRelease"), str(tmp / "Release"))
        return (tmp / "InRelease").read_bytes()

    files = {f"{MIRROR}/dists/trixie/InRelease": sign(release),
             f"{MIRROR}/dists/trixie/main/binary-amd64/Packages.xz": packages,
             f"{MIRROR}/{filename}": deb}
    return {"files": files, "keyring": keyring}


def unpack(cache: Path, files: dict[str, bytes], keyring: Path) -> tuple[debian.Package, Path]:
    return debian.unpacked("containerd", "trixie", cache, mirror=MIRROR, keyring=keyring,
                           fetch=files.__getitem__)


def test_what_the_archive_key_signed_is_extracted_and_runs(archive, tmp_path):
    package, root = unpack(tmp_path, archive["files"], archive["keyring"])
    node = containerds.in_folder("debian-13", root / "usr" / "bin", "test")
    assert package.version == VERSION and node.version == f"1.7.24~ds1 {VERSION}"
    assert [p.name for p in tmp_path.iterdir()] == [package.sha256]


def test_a_changed_signed_line_or_another_key_is_refused(archive, tmp_path):
    inrelease = f"{MIRROR}/dists/trixie/InRelease"
    changed = archive["files"][inrelease].replace(b"Codename: trixie", b"Codename: trixiE")
    for files, keyring in (({**archive["files"], inrelease: changed}, archive["keyring"]),
                           (archive["files"], debian.KEYRING)):
        with pytest.raises(BuilderError, match="`InRelease`: no good signature"):
            unpack(tmp_path / "cache", files, keyring)
    assert not (tmp_path / "cache").exists()


def test_lines_outside_the_signature_are_never_read(archive, tmp_path):
    """A proxy prepends its own index hash before the signed block and serves its Packages.xz:
    gpgv still finds the signature good, but only the signed text is read, so the proxy's
    Packages.xz is checked against the signed hash and refused."""
    evil = lzma.compress(b"Package: containerd\n")
    inrelease = f"{MIRROR}/dists/trixie/InRelease"
    prepended = (f"Codename: trixie\nSHA256:\n {hashlib.sha256(evil).hexdigest()} {len(evil)} "
                 "main/binary-amd64/Packages.xz\n\n").encode() + archive["files"][inrelease]
    files = {**archive["files"], inrelease: prepended,
             f"{MIRROR}/dists/trixie/main/binary-amd64/Packages.xz": evil}
    with pytest.raises(BuilderError, match=r"`Packages\.xz`: sha256"):
        unpack(tmp_path, files, archive["keyring"])
    assert os.listdir(tmp_path) == []
