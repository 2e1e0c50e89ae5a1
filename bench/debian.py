"""One Debian package's files, trusted only through Debian's signature chain, as apt trusts them.

  dists/<codename>/InRelease   gpgv against a Debian archive keyring; only the signed text is
                               read (gpgv's --output: lines outside the signature never count),
                               and it must name <codename> and not be past its Valid-Until
                               (unless asked, up to MAX_STALE past it: `allow_expired`, which
                               the package then records)
  main/binary-<arch>/Packages.xz  its sha256 and size as that signed text lists them
  pool/…/<package>_….deb       its sha256 and size as the Packages entry lists them
then `dpkg-deb -x` into `<cache>/<deb sha256>/root` (made in a scratch folder, renamed into place
when complete, so a cache entry is always a whole, checked package). The signed index is fetched
every time (a cache hit still has to be the package Debian lists now); a mismatch anywhere is one
line naming the file. No byte that is not checked is written where it could be run.
"""

from __future__ import annotations

import datetime as dt
import email.utils
import hashlib
import json
import lzma
import os
import shutil
import tempfile
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from builder.core import proc
from builder.core.errors import BuilderError

MIRROR = "https://deb.debian.org/debian"
KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
MAX_STALE = dt.timedelta(days=90)  # the oldest expired index --allow-expired-index accepts
REFUSED = ("BADSIG", "EXPKEYSIG", "REVKEYSIG", "EXPSIG")  # gpgv status words that refuse a file
Fetch = Callable[[str], bytes]
Verify = Callable[[bytes, Path], bytes]


@dataclass(frozen=True)
class Package:
    """A Packages entry: what the signed index says the .deb is."""

    name: str
    version: str
    filename: str
    sha256: str
    size: int
    built_using: str
    expired: str = ""  # the index's Valid-Until, when it had passed and that was accepted


def download(url: str, timeout: float = 600) -> bytes:
    """The bytes at `url` (trusted for nothing: every caller checks them)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.read()
    except OSError as exc:
        raise BuilderError(f"cannot fetch `{url}`: {exc}",
                           hint="check the network to deb.debian.org, or measure "
                           "`--containerd system`") from exc


def gpgv(signed: bytes, keyring: Path) -> bytes:
    """The text of a clear-signed file that a key of `keyring` signed, via gpgv."""
    with tempfile.TemporaryDirectory(prefix="bench-gpgv-") as tmp:
        given, out = Path(tmp) / "InRelease", Path(tmp) / "signed"
        given.write_bytes(signed)
        result = proc.run([proc.which("gpgv", hint="apt-get install gpgv"), "--keyring",
                           str(keyring), "--status-fd", "1", "--output", str(out), str(given)],
                          check=False, timeout=120)
        if not accepted(result.stdout) or not out.is_file():
            raise unsigned(keyring)
        return out.read_bytes()


def unsigned(keyring: Path) -> BuilderError:
    return BuilderError(f"`InRelease`: no good signature by a key of `{keyring}`",
                        hint="a mirror or proxy served other bytes; the package is not used")


def accepted(status: str) -> bool:
    """gpgv's --status-fd lines: at least one signature made by a key of the keyring (VALIDSIG)
    and none bad, expired or revoked. A signature by a key not in the keyring (ERRSIG,
    NO_PUBKEY) is ignored, as apt ignores it: Debian signs with several keys."""
    words = [line.split()[1] for line in status.splitlines()
             if line.startswith("[GNUPG:] ") and len(line.split()) > 1]
    return "VALIDSIG" in words and not any(w in REFUSED for w in words)


def stanzas(text: str) -> list[dict[str, str]]:
    """Debian control stanzas (blank-line separated `Field: value`, continuation lines kept)."""
    out: list[dict[str, str]] = []
    for block in text.split("\n\n"):
        fields: dict[str, str] = {}
        last = ""
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and last:
                fields[last] += "\n" + line.strip()
            elif ":" in line:
                last, value = line.split(":", 1)
                fields[last] = value.strip()
        if fields:
            out.append(fields)
    return out


def release(signed: bytes, codename: str, now: dt.datetime | None = None,
            allow_expired: bool = False) -> tuple[dict[str, str], str]:
    """The signed Release fields, checked to be `codename`'s and still valid, and "" — or,
    with `allow_expired` (apt's Acquire::Check-Valid-Until=false), the Valid-Until that had
    passed, when it passed less than MAX_STALE ago: the index is still Debian's, only not its
    newest, and an older one (a replay offering a package since fixed) is still refused."""
    fields = stanzas(signed.decode())[0]
    if fields.get("Codename") != codename:
        raise BuilderError(f"`InRelease`: signed for `{fields.get('Codename')}`, not "
                           f"`{codename}`", hint="a mirror served another release's index")
    until = fields.get("Valid-Until")
    late = (now or dt.datetime.now(dt.UTC)) - email.utils.parsedate_to_datetime(until) \
        if until else dt.timedelta(0)
    if late <= dt.timedelta(0):
        return fields, ""
    if not allow_expired:
        raise BuilderError(f"`InRelease`: expired (Valid-Until {until})",
                           hint="the mirror is stale; try another, or accept an index less "
                           f"than {MAX_STALE.days} days past it with --allow-expired-index")
    if late > MAX_STALE:
        raise BuilderError(f"`InRelease`: expired more than {MAX_STALE.days} days ago "
                           f"(Valid-Until {until})",
                           hint="too old even for --allow-expired-index; try another mirror")
    return fields, until


def listed(fields: dict[str, str], path: str) -> tuple[str, int]:
    """The sha256 and size a Release lists for `path` (its SHA256 section)."""
    for line in fields.get("SHA256", "").splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == path:
            return parts[0], int(parts[1])
    raise BuilderError(f"`InRelease`: lists no `{path}`", hint="check the architecture")


def check(data: bytes, sha256: str, size: int, name: str, source: str) -> bytes:
    """`data` when it is what the signed `source` says `name` is; else a one-line refusal."""
    have = hashlib.sha256(data).hexdigest()
    if have != sha256 or len(data) != size:
        raise BuilderError(f"`{name}`: sha256 {have[:16]}… ({len(data)} bytes) is not the "
                           f"{sha256[:16]}… ({size} bytes) `{source}` lists",
                           hint="a mirror or proxy served other bytes; nothing was used")
    return data


def entry(packages: str, name: str, arch: str, expired: str = "") -> Package:
    """The one Packages entry of `name` for `arch`."""
    found = [s for s in stanzas(packages)
             if s.get("Package") == name and s.get("Architecture") == arch]
    if len(found) != 1:
        raise BuilderError(f"`Packages.xz`: {len(found)} entries for `{name}` ({arch}), "
                           "expected one", hint="name a package this release ships")
    s = found[0]
    return Package(name=name, version=s["Version"], filename=s["Filename"], sha256=s["SHA256"],
                   size=int(s["Size"]), built_using=s.get("Built-Using", ""), expired=expired)


def resolve(name: str, codename: str, *, arch: str = "amd64", mirror: str = MIRROR,
            keyring: Path = KEYRING, fetch: Fetch = download, verify: Verify = gpgv,
            allow_expired: bool = False) -> Package:
    """What Debian's signed index of `codename` says `name` is today."""
    fields, expired = release(verify(fetch(f"{mirror}/dists/{codename}/InRelease"), keyring),
                              codename, allow_expired=allow_expired)
    index = f"main/binary-{arch}/Packages.xz"
    packed = check(fetch(f"{mirror}/dists/{codename}/{index}"), *listed(fields, index),
                   "Packages.xz", "InRelease")
    return entry(lzma.decompress(packed).decode(), name, arch, expired)


def unpacked(name: str, codename: str, cache: Path, *, mirror: str = MIRROR,
             keyring: Path = KEYRING, fetch: Fetch = download, verify: Verify = gpgv,
             allow_expired: bool = False) -> tuple[Package, Path]:
    """The package's files, extracted under `cache/<sha256>/root` (fetched and checked the
    first time), and its entry."""
    package = resolve(name, codename, mirror=mirror, keyring=keyring, fetch=fetch,
                      verify=verify, allow_expired=allow_expired)
    home = cache / package.sha256
    if not (home / "root").is_dir():
        deb = check(fetch(f"{mirror}/{package.filename}"), package.sha256, package.size,
                    Path(package.filename).name, "Packages.xz")
        extract(deb, package, cache)
    return package, home / "root"


def extract(deb: bytes, package: Package, cache: Path) -> None:
    """`dpkg-deb -x` of a checked .deb into a scratch folder, renamed to `cache/<sha256>`
    once whole (a run stopped half-way leaves no entry that looks complete)."""
    cache.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".unpacking-", dir=cache))
    try:
        (scratch / "package.deb").write_bytes(deb)
        proc.run([proc.which("dpkg-deb"), "-x", str(scratch / "package.deb"),
                  str(scratch / "root")], timeout=600)
        (scratch / "package.deb").unlink()
        (scratch / "package.json").write_text(json.dumps(asdict(package), indent=2) + "\n")
        os.rename(scratch, cache / package.sha256)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
