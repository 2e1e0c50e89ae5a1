"""The committed lock files, read and checked offline: `locks/<id>.txt` (a pip requirements file,
every line `==` and `--hash=sha256:`), `locks/<id>.json` (the facts read off the resolved wheels,
the inputs and their hash) and a devel variant's `locks/<id>.base.txt`.

Here so that every step reads a lock the same way without importing the step that resolves it
(builder.stages.locks, which runs uv and writes these files).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.errors import ConfigError
from builder.model import platforms
from builder.model.matrix import Variant

LOCK_FORMAT = 1
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


@dataclass(frozen=True)
class Lock:
    variant_id: str
    text: str
    facts: dict[str, Any]

    @property
    def pins(self) -> dict[str, str]:
        return parse_pins(self.text)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_pins(text: str) -> dict[str, str]:
    """`name==version` of every requirement line, names normalised (PEP 503)."""
    pins = {}
    for line in text.splitlines():
        match = _PIN.match(line.strip())
        if match:
            pins[normalize(match.group(1))] = match.group(2)
    return pins


def lock_stem(variant: Variant) -> str:
    """`<id>` on linux/amd64 (the names locks always had), `<id>.linux-arm64` elsewhere."""
    return variant.id + platforms.get(variant.platform).suffix


def lock_paths(locks_dir: Path, variant: Variant) -> tuple[Path, Path]:
    stem = lock_stem(variant)
    return locks_dir / f"{stem}.txt", locks_dir / f"{stem}.json"


def requirements(variant: Variant, toolkit_cuda: str | None = None) -> list[str]:
    """What the variant asks for. A CUDA 13 devel variant adds the toolkit wheels, every
    component pinned to torch's CUDA minor (a floating component breaks ptxas)."""
    reqs = [f"torch=={variant.torch}", *variant.packages]
    if toolkit_cuda:
        reqs += [f"{name}=={toolkit_cuda}.*" for name in TOOLKIT_WHEELS]
    return reqs


TOOLKIT_WHEELS = ("nvidia-cuda-nvcc", "nvidia-cuda-runtime", "nvidia-cuda-cccl", "nvidia-nvvm",
                  "nvidia-cuda-crt")


# Names how resolve() asks uv for a lock; change it whenever resolve()'s flags change, so every
# lock made the old way reads as out of date.
RESOLVER = "uv pip compile --generate-hashes --emit-find-links --emit-index-url (1)"


def lock_inputs(variant: Variant) -> dict[str, Any]:
    """Every input that shapes a variant's lock, by name (so a stale lock can say which moved)."""
    return {
        "torch": variant.torch, "packages": list(variant.packages),
        "index_url": variant.index_url, "find_links": list(variant.find_links),
        "python": variant.python, "platform": platforms.get(variant.platform).uv,
        "resolver": RESOLVER,
    }


def inputs_hash(variant: Variant, reqs: Iterable[str]) -> str:
    """Everything resolution depends on; a lock whose recorded hash matches is reused."""
    payload = {"format": LOCK_FORMAT, "requirements": sorted(reqs), **lock_inputs(variant)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def lock_metadata(variant: Variant, reqs: list[str], facts: Mapping[str, Any], text: str,
                  base_text: str | None = None) -> str:
    """The text of locks/<id>.json: the inputs (and their hash) beside the derived facts, and
    the sha256 of the lock text (and of a devel lock's base), so a hand edit is refused."""
    doc = {"format": LOCK_FORMAT, "inputs_hash": inputs_hash(variant, reqs),
           "inputs": lock_inputs(variant), "requirements": reqs, "facts": facts,
           "text_sha256": text_sha256(text)}
    if base_text is not None:
        doc["base_text_sha256"] = text_sha256(base_text)
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def read_lock(locks_dir: Path, variant: Variant) -> Lock | None:
    """The variant's lock, its text checked against the sha256 its `.json` recorded and line by
    line (ConfigError naming file:line otherwise); None when there is none."""
    txt, js = lock_paths(locks_dir, variant)
    if not (txt.exists() and js.exists()):
        return None
    meta = read_meta(js)
    text = txt.read_text()
    check_text(txt, text, meta, "text_sha256")
    base = base_lock_path(locks_dir, variant)
    if "base_text_sha256" in meta or base.exists():
        check_text(base, base.read_text() if base.exists() else "", meta, "base_text_sha256")
    return Lock(variant.id, text, meta["facts"])


# Lines a lock may hold: options uv writes (checked against the recorded inputs), blank lines,
# comments, `name==version \` and its `--hash=sha256:` continuation lines.
_REQUIREMENT = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?==[A-Za-z0-9.+!_-]+ \\")
_HASH = re.compile(r" {4}--hash=sha256:[0-9a-f]{64}( \\)?")
DEFAULT_INDEX = "https://pypi.org/simple"


def check_text(path: Path, text: str, meta: Mapping[str, Any], field: str) -> None:
    """Refuse a lock text that is not the one `builder lock` wrote: its sha256 must be the one
    recorded in the `.json`, and every line must be of the lock grammar."""
    hint = "locks are written by `builder lock`, never by hand: restore it from git or re-lock"
    if meta.get(field) != text_sha256(text):
        raise ConfigError(f"{path}: its sha256 {text_sha256(text)[:12]} is not the "
                          f"{str(meta.get(field) or 'none')[:12]} recorded in its .json "
                          f"(`{field}`): edited by hand?", hint=hint)
    if problem := line_problem(text, meta.get("inputs") or {}):
        raise ConfigError(f"{path}:{problem}", hint=hint)


def line_problem(text: str, inputs: Mapping[str, Any]) -> str:
    """`<line>: <what>` for the first line outside the lock grammar ('' when none): a
    requirement is `name==version` followed by one or more `--hash=sha256:` lines; the only
    options are the index and find-links the lock's inputs name."""
    options = {f"--index-url {inputs.get('index_url') or DEFAULT_INDEX}",
               *(f"--find-links {x}" for x in inputs.get("find_links") or [])}
    open_requirement = False
    for number, line in enumerate(text.splitlines(), 1):
        if open_requirement:
            if not _HASH.fullmatch(line):
                return f"{number}: expected `    --hash=sha256:<64 hex>` after a requirement"
            open_requirement = line.endswith("\\")
            continue
        if not line.strip() or line.startswith("#"):
            continue
        if line.startswith("-"):
            if line not in options:
                return f"{number}: option `{line[:80]}` is not one this lock's inputs allow"
            continue
        if not _REQUIREMENT.fullmatch(line):
            return f"{number}: `{line[:80]}` is not `name==version \\` followed by its hashes"
        open_requirement = True
    return "end: a requirement without hashes" if open_requirement else ""


_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,63}")
REQUIRED_FACTS = ("torch", "python", "accelerator", "cuda", "cudnn", "nccl", "triton",
                  "min_driver")


def read_meta(path: Path) -> dict[str, Any]:
    """A lock's `.json` (facts and inputs), or a ConfigError naming the file and the problem."""
    hint = "restore it from git, or run `builder lock` to resolve it again"
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the lock's facts: {exc}", hint=hint) from None
    if not isinstance(meta, dict) or not isinstance(meta.get("facts"), dict):
        raise ConfigError(f"{path}: no `facts` object (an incomplete lock)", hint=hint)
    if missing := [key for key in REQUIRED_FACTS if key not in meta["facts"]]:
        raise ConfigError(f"{path}: facts lack {', '.join(missing)} (an incomplete lock)",
                          hint=hint)
    for key in REQUIRED_FACTS:  # they become tags and labels: versions only
        value = meta["facts"][key]
        if value is not None and not (isinstance(value, str) and _VERSION.fullmatch(value)):
            raise ConfigError(f"{path}: facts.{key} {str(value)[:40]!r} is not a version "
                              "(letters, digits, `.+_-`; it goes into tags)", hint=hint)
    return meta


def require_lock(locks_dir: Path, variant: Variant) -> Lock:
    """The variant's lock, refusing one made from other inputs than the matrix now gives."""
    lock = read_lock(locks_dir, variant)
    if lock is None:
        raise ConfigError(f"no lock for {variant.key} in {locks_dir}/", hint="run: builder lock")
    reason = stale_reason(locks_dir, variant)
    if reason:
        raise ConfigError(reason, hint="or pass --relock to `builder build` to re-lock first")
    return lock


def is_current(locks_dir: Path, variant: Variant) -> bool:
    """True when the lock exists and was made from the inputs the matrix now describes."""
    txt_path, json_path = lock_paths(locks_dir, variant)
    return txt_path.exists() and json_path.exists() and stale_reason(locks_dir, variant) is None


def stale_reason(locks_dir: Path, variant: Variant) -> str | None:
    """`locks/<id>.txt is out of date (packages changed): run builder lock`, or None when the
    recorded inputs hash matches (or there is no lock: require_lock says that).

    A devel lock may carry toolkit pins; its hash is checked against the requirements it
    recorded, so adding or removing packages in the matrix still shows as a change.
    """
    txt_path, json_path = lock_paths(locks_dir, variant)
    if not json_path.exists():
        return None
    meta = read_meta(json_path)
    recorded = list(meta.get("requirements") or [])
    base = requirements(variant)
    if recorded[: len(base)] == base and meta.get("inputs_hash") == inputs_hash(variant, recorded):
        return None
    was = meta.get("inputs") or {}
    changed = [k for k, v in lock_inputs(variant).items() if k in was and was[k] != v]
    if not changed and recorded[: len(base)] != base:  # metadata from before `inputs`
        changed = ["torch"] if recorded[:1] != base[:1] else ["packages"]
    what = ", ".join(changed) if changed else "inputs"
    return f"{txt_path} is out of date ({what} changed): run builder lock"


def base_lock_path(locks_dir: Path, variant: Variant) -> Path:
    """A devel variant with toolkit wheels also records the runtime resolution it builds on."""
    return locks_dir / f"{lock_stem(variant)}.base.txt"


def read_base_lock(locks_dir: Path, variant: Variant) -> Lock | None:
    path = base_lock_path(locks_dir, variant)
    return Lock(variant.id, path.read_text(), {}) if path.exists() else None
