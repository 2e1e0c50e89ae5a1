"""bench/debian.py's chain, InRelease → Packages.xz → .deb, on a small fixture mirror: each
link refuses bytes the link above did not vouch for, in one line naming the file, and nothing
reaches the cache. The signature itself is gpgv's (tests/e2e/test_bench_debian_e2e.py runs it
on a key of its own); here `verify` stands in for it: it vouches for the exact bytes signed."""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import lzma
import re
from pathlib import Path

import pytest

from bench import debian
from builder.core.errors import BuilderError

MIRROR = "https://mirror.test/debian"
DEB = b"!<arch>\n" + b"a .deb stand-in " * 64
ENTRY = {"Package": "containerd", "Version": "1.7.24~ds1-6+deb13u1", "Architecture": "amd64",
         "Built-Using": "golang-1.24 (= 1.24.4-1),\n runc (= 1.1)",
         "Filename": "pool/main/c/containerd/containerd_1.7.24~ds1-6+deb13u1_amd64.deb",
         "Size": str(len(DEB)), "SHA256": hashlib.sha256(DEB).hexdigest()}
OTHER = {**ENTRY, "Package": "containerd", "Architecture": "arm64"}


def stanza(fields: dict[str, str]) -> str:
    return "".join(f"{k}: {v}\n" for k, v in fields.items())


def release(packages_xz: bytes, codename: str = "trixie", extra: str = "") -> bytes:
    digest = hashlib.sha256(packages_xz).hexdigest()
    return (f"Origin: Debian\nSuite: stable\nCodename: {codename}\n{extra}SHA256:\n"
            f" {'0' * 64} 12 main/binary-amd64/Packages\n"
            f" {digest} {len(packages_xz)} main/binary-amd64/Packages.xz\n").encode()


def mirror() -> tuple[dict[str, bytes], set[bytes]]:
    """The files a mirror serves, and the InRelease bytes the archive key signed."""
    packages = lzma.compress((stanza(OTHER) + "\n" + stanza(ENTRY)).encode())
    inrelease = release(packages)
    files = {f"{MIRROR}/dists/trixie/InRelease": inrelease,
             f"{MIRROR}/dists/trixie/main/binary-amd64/Packages.xz": packages,
             f"{MIRROR}/{ENTRY['Filename']}": DEB}
    return files, {inrelease}


def served(files: dict[str, bytes], asked: list[str] | None = None) -> debian.Fetch:
    def fetch(url: str) -> bytes:
        (asked if asked is not None else []).append(url)
        return files[url]
    return fetch


def vouching(signed: set[bytes]) -> debian.Verify:
    def verify(data: bytes, keyring: Path) -> bytes:
        if data not in signed:
            raise debian.unsigned(keyring)
        return data
    return verify


def unpack(tmp_path: Path, files: dict[str, bytes], signed: set[bytes],
           asked: list[str] | None = None, allow_expired: bool = False
           ) -> tuple[debian.Package, Path]:
    return debian.unpacked("containerd", "trixie", tmp_path / "cache", mirror=MIRROR,
                           fetch=served(files, asked), verify=vouching(signed),
                           allow_expired=allow_expired)


@pytest.fixture
def extracted(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """`dpkg-deb -x` (a command: e2e) replaced by a record of the bytes it was given."""
    given: list[bytes] = []

    def extract(deb: bytes, package: debian.Package, cache: Path) -> None:
        given.append(deb)
        (cache / package.sha256 / "root").mkdir(parents=True)
    monkeypatch.setattr(debian, "extract", extract)
    return given


def test_the_chain_yields_the_entry_and_extracts_the_checked_deb_once(tmp_path, extracted):
    files, signed = mirror()
    package, root = unpack(tmp_path, files, signed)
    assert (package.version, package.sha256) == (ENTRY["Version"], ENTRY["SHA256"])
    assert "golang-1.24 (= 1.24.4-1)" in package.built_using
    assert root == tmp_path / "cache" / ENTRY["SHA256"] / "root" and extracted == [DEB]
    asked: list[str] = []
    unpack(tmp_path, files, signed, asked)  # cached: the index is checked, the .deb not fetched
    assert [u.rsplit("/", 1)[1] for u in asked] == ["InRelease", "Packages.xz"]


@pytest.mark.parametrize(("tampered", "named"), [
    ("InRelease", "`InRelease`: no good signature"),
    ("Packages.xz", "`Packages.xz`: sha256"),
    ("_amd64.deb", "`containerd_1.7.24~ds1-6+deb13u1_amd64.deb`: sha256"),
])
def test_a_tampered_file_is_refused_in_one_line_naming_it(tmp_path, extracted, tampered, named):
    files, signed = mirror()
    url = next(u for u in files if u.endswith(tampered))
    files[url] = files[url][:-1] + bytes([files[url][-1] ^ 1])
    with pytest.raises(BuilderError, match=re.escape(named)) as caught:
        unpack(tmp_path, files, signed)
    assert "\n" not in str(caught.value) and caught.value.hint
    assert extracted == [] and not any((tmp_path / "cache").glob("*/root"))


def test_an_index_signed_for_another_release_or_expired_is_refused(tmp_path, extracted):
    files, _ = mirror()
    packages = files[f"{MIRROR}/dists/trixie/main/binary-amd64/Packages.xz"]
    for inrelease, named in ((release(packages, "bookworm"), "signed for `bookworm`"),
                             (release(packages, extra="Valid-Until: Sat, 01 Jan 2000 00:00:00 "
                                      "UTC\n"), "expired")):
        files[f"{MIRROR}/dists/trixie/InRelease"] = inrelease
        with pytest.raises(BuilderError, match=named):
            unpack(tmp_path, files, {inrelease})
    assert extracted == []


def valid_until(days_ago: int) -> str:
    return email.utils.format_datetime(dt.datetime.now(dt.UTC) - dt.timedelta(days=days_ago),
                                       usegmt=True)


def test_an_expired_index_is_used_only_when_asked_and_the_package_says_so(tmp_path, extracted):
    """A frozen mirror's sid (its index lives a week), 30 days past its Valid-Until: accepted
    only with `allow_expired`, and the package records the date that had passed."""
    files, _ = mirror()
    packages = files[f"{MIRROR}/dists/trixie/main/binary-amd64/Packages.xz"]
    until = valid_until(30)
    files[f"{MIRROR}/dists/trixie/InRelease"] = stale = release(
        packages, extra=f"Valid-Until: {until}\n")
    with pytest.raises(BuilderError, match="expired") as caught:
        unpack(tmp_path, files, {stale})
    assert "--allow-expired-index" in caught.value.hint and extracted == []
    package, _ = unpack(tmp_path, files, {stale}, allow_expired=True)
    assert package.expired == until and len(extracted) == 1


@pytest.mark.parametrize(("inrelease", "named"), [
    ({"days_ago": debian.MAX_STALE.days + 1}, "expired more than 90 days ago"),
    ({"codename": "bookworm", "days_ago": 30}, "signed for `bookworm`"),
    ({"days_ago": 30, "tampered": "Packages.xz"}, "`Packages.xz`: sha256"),
    ({"days_ago": 30, "tampered": "_amd64.deb"}, "_amd64.deb`: sha256"),
])
def test_allowing_an_expired_index_relaxes_the_date_alone(tmp_path, extracted, inrelease, named):
    """Even when asked: an index expired too long ago (a replay offering a package since
    fixed), another release's, or a file its hashes do not vouch for is refused."""
    files, _ = mirror()
    packages = files[f"{MIRROR}/dists/trixie/main/binary-amd64/Packages.xz"]
    signed = release(packages, inrelease.get("codename", "trixie"),
                     f"Valid-Until: {valid_until(inrelease['days_ago'])}\n")
    files[f"{MIRROR}/dists/trixie/InRelease"] = signed
    if "tampered" in inrelease:
        url = next(u for u in files if u.endswith(inrelease["tampered"]))
        files[url] = files[url][:-1] + bytes([files[url][-1] ^ 1])
    with pytest.raises(BuilderError, match=re.escape(named)):
        unpack(tmp_path, files, {signed}, allow_expired=True)
    assert extracted == []


def test_a_package_listed_no_times_or_twice_is_refused() -> None:
    text = stanza(ENTRY) + "\n" + stanza(ENTRY)
    with pytest.raises(BuilderError, match="2 entries for `containerd`"):
        debian.entry(text, "containerd", "amd64")
    with pytest.raises(BuilderError, match="0 entries for `runc`"):
        debian.entry(text, "runc", "amd64")


def test_gpgv_status_needs_a_good_signature_and_no_bad_one() -> None:
    good = "[GNUPG:] GOODSIG 1 k\n[GNUPG:] VALIDSIG ABC 2026-11-21\n"
    unknown_key = "[GNUPG:] ERRSIG 6ED0 1 8 01 1795252580 9 4CB5\n[GNUPG:] NO_PUBKEY 6ED0\n"
    assert debian.accepted(unknown_key + good)  # Debian signs with several keys
    assert not debian.accepted(unknown_key)
    assert not debian.accepted(good + "[GNUPG:] BADSIG 2 k\n")
    assert not debian.accepted(good.replace("VALIDSIG", "EXPKEYSIG"))
