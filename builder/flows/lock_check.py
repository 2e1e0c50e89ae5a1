"""`builder lock --check`: every lock re-resolved from its recorded inputs and compared with
the index, as `uv lock --check` does: packages, versions and hashes, one `locks/<id>.txt:LINE`
per difference.

`validate` only checks that a lock's text matches its recorded `text_sha256` — which whoever
edits the lock can update too. Here the index is asked again: uv resolves the recorded
requirements for the variant's python and platform, preferring the locked versions (given
without their hashes, so every hash comes from the index, not from the file being checked). A
swapped hash, an added package or a changed pin shows as a difference. Needs the network.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from builder.model import lockfile
from builder.model.matrix import Variant
from builder.stages import locks

WORKERS = 8
_HASH = re.compile(r"\s*--hash=(sha256:[0-9a-f]{64})")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    line: int  # 1-based line of `name==version`
    hashes: dict[str, int]  # hash → its line


def pins(text: str) -> dict[str, Pin]:
    """The `name==version` entries of a lock with their lines and hashes."""
    found: dict[str, Pin] = {}
    current: Pin | None = None
    for number, line in enumerate(text.splitlines(), 1):
        if match := _PIN.match(line):
            current = Pin(lockfile.normalize(match[1]), match[2], number, {})
            found[current.name] = current
        elif (hashed := _HASH.match(line)) and current is not None:
            current.hashes[hashed[1]] = number
        elif line.strip() and not line.startswith((" ", "-", "#")):
            current = None
    return found


def preferences(text: str) -> str:
    """The lock without its hashes: uv keeps these versions, and asks the index for hashes."""
    kept = [line.rstrip().removesuffix("\\").rstrip() for line in text.splitlines()
            if not _HASH.match(line)]
    return "\n".join(kept) + "\n"


def differences(path: Path, locked: str, resolved: str) -> list[str]:
    """One `path:LINE: …` per package, version or hash that differs from the resolution."""
    have, want = pins(locked), pins(resolved)
    out = []
    for name, pin in have.items():
        where = f"{path}:{pin.line}"
        if name not in want:
            out.append(f"{where}: {name}=={pin.version} is not part of the resolution "
                       "(not required by anything the lock's inputs ask for)")
            continue
        if pin.version != want[name].version:
            out.append(f"{where}: {name}=={pin.version}, the index resolves "
                       f"{name}=={want[name].version}")
            continue
        out += [f"{path}:{line}: {name}=={pin.version} --hash={digest} is not a hash the index "
                "serves for it" for digest, line in pin.hashes.items()
                if digest not in want[name].hashes]
        missing = sorted(set(want[name].hashes) - set(pin.hashes))
        if missing:
            out.append(f"{where}: {name}=={pin.version} lacks {len(missing)} hash(es) the index "
                       f"serves (first: --hash={missing[0]})")
    last = max((p.line for p in have.values()), default=1)
    for name in sorted(set(want) - set(have)):
        at = min((p.line for n, p in have.items() if n > name), default=last)
        out.append(f"{path}:{at}: {name}=={want[name].version} is required but missing")
    return out


Resolver = Callable[[Variant, list[str], str], str]


def _resolve(variant: Variant, reqs: list[str], preferred: str) -> str:
    return locks.resolve(variant, reqs, current=preferred)


def check_variant(variant: Variant, locks_dir: Path, resolver: Resolver = _resolve) -> list[str]:
    """The differences of one variant's lock files (the `.base.txt` of a toolkit devel too)."""
    txt_path, json_path = lockfile.lock_paths(locks_dir, variant)
    if not txt_path.exists() or not json_path.exists():
        return [f"{txt_path}: no lock (run builder lock)"]
    meta = lockfile.read_meta(json_path)
    reqs = list(meta.get("requirements") or lockfile.requirements(variant))
    files = [(txt_path, reqs)]
    base_path = lockfile.base_lock_path(locks_dir, variant)
    if base_path.exists():
        files.insert(0, (base_path, lockfile.requirements(variant)))
    problems = []
    for path, wanted in files:
        text = path.read_text()
        problems += differences(path, text, resolver(variant, wanted, preferences(text)))
    return problems


def check_all(variants: Iterable[Variant], locks_dir: Path, resolver: Resolver = _resolve,
              progress: Callable[[str], None] = print) -> list[str]:
    """Every selected variant's differences (each platform's lock is its own), in matrix
    order; uv runs for several variants at once (it mostly waits on the index)."""
    chosen = list(variants)
    with ThreadPoolExecutor(WORKERS) as pool:
        found = list(pool.map(lambda v: check_variant(v, locks_dir, resolver), chosen))
    problems: list[str] = []
    for variant, lines in zip(chosen, found, strict=True):
        progress(f"  {'differs' if lines else 'matches':8}  {variant.key}")
        problems += lines
    return problems
