"""`apt list --upgradable` read (rebuild --check's Debian source), and the token of what it
listed (a new token re-runs the apt upgrade step). Pure: the container that asks apt is
builder.flows.rebuild_check's."""

from __future__ import annotations

import hashlib
import re

# `libssl3/stable-security 3.0.15-1~deb12u1 amd64 [upgradable from: 3.0.14-1~deb12u2]`
_APT_LINE = re.compile(r"^(\S+?)/\S*\s+(\S+)\s+\S+\s+\[upgradable from:\s*([^\]\s]+)\]")
# `Inst libssl3 [3.0.14-1~deb12u2] (3.0.15-1~deb12u1 Debian-Security:12/stable-security [amd64])`
_APT_SIM = re.compile(r"^Inst\s+(\S+)\s+\[([^\]]+)\]\s+\((\S+)")


def parse_upgradable(text: str) -> dict[str, tuple[str, str]]:
    """name → (installed, candidate) from `apt list --upgradable` or `apt-get -s upgrade`."""
    found: dict[str, tuple[str, str]] = {}
    for line in text.splitlines():
        line = line.strip()
        m = _APT_LINE.match(line)
        if m:
            found[m.group(1)] = (m.group(3), m.group(2))
            continue
        m = _APT_SIM.match(line)
        if m:
            found[m.group(1)] = (m.group(2), m.group(3))
    return dict(sorted(found.items()))


def apt_token(upgradable: dict[str, tuple[str, str]], day: str) -> str:
    """`<day>-<hash of the upgradable list>` (day: the command's `YYYYMMDD`): a new token
    re-runs the apt upgrade step."""
    listing = "\n".join(f"{n} {o} {nw}" for n, (o, nw) in sorted(upgradable.items()))
    return f"{day}-{hashlib.sha256(listing.encode()).hexdigest()[:12]}"
