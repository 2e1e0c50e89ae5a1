"""Resolve each variant to a hash-pinned lock and derive its facts from what was resolved.

`locks/<id>.txt` is a pip requirements file (every line `==` and `--hash=sha256:`), and
`locks/<id>.json` holds the facts read off the resolved distributions (CUDA runtime, cuDNN,
NCCL, triton …) plus the hash of the inputs, so unchanged variants are not resolved again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core import proc
from builder.core.errors import BuilderError, ConfigError
from builder.core.state import atomic_write
from builder.model import platforms
from builder.model.flavors import FLAVORS
from builder.model.matrix import Matrix, Variant
from smoke.versions import MIN_DRIVER, MINOR_COMPAT_FLOOR

LOCK_FORMAT = 1
# Each target platform resolves for its own machine and glibc 2.28 (the cuDNN wheels need
# ≥ 2.27; Debian 12 and Ubuntu 22.04+ have newer): builder.model.platforms.Platform.uv.

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


def uv_env() -> dict[str, str]:
    ca = proc.host_ca_bundle()
    return {"SSL_CERT_FILE": ca} if ca and "SSL_CERT_FILE" not in os.environ else {}


def resolve(variant: Variant, reqs: list[str], *, upgrade: bool = False,
            current: str | None = None, upgrade_packages: Sequence[str] = ()) -> str:
    """Run `uv pip compile` for the variant's python and platform (not the host's).

    With `current` (an existing lock), uv keeps its pins except for `upgrade_packages`.
    """
    with tempfile.TemporaryDirectory() as tmp:
        req_in = Path(tmp) / "requirements.in"
        req_in.write_text("\n".join(reqs) + "\n")
        out = Path(tmp) / "lock.txt"
        if current is not None:
            out.write_text(current)  # uv prefers the pins of an existing output file
        argv = ["uv", "pip", "compile", "--no-config", "--native-tls", "--quiet",
                "--python-version", variant.python,
                "--python-platform", platforms.get(variant.platform).uv,
                "--generate-hashes", "--no-header", "--no-annotate", "--emit-find-links",
                "--emit-index-url", str(req_in), "-o", str(out)]
        for link in variant.find_links:
            argv += ["--find-links", link]
        if variant.index_url:
            argv += ["--index-url", variant.index_url]
        if upgrade:
            argv.append("--upgrade")
        for name in upgrade_packages:
            argv += ["--upgrade-package", name]
        try:
            proc.run(argv, env=uv_env(), timeout=600)
        except BuilderError as exc:
            raise ConfigError(f"cannot resolve {variant.key}: {exc}", hint=exc.hint) from None
        return out.read_text()


# ---------------------------------------------------------------- facts from resolved wheels


def _find(pins: Mapping[str, str], *names: str) -> str | None:
    """The first pinned version among names, also with a -cuXX suffix (CUDA 12 names)."""
    for name in names:
        for key, version in pins.items():
            if key == name or re.fullmatch(re.escape(name) + r"-cu[0-9]+", key):
                return version
    return None


def major_minor(version: str | None) -> str | None:
    return ".".join(version.split(".")[:2]) if version else None


def min_driver(cuda: str | None) -> tuple[str | None, str | None]:
    """(minimum driver, where the figure comes from) for CUDA major.minor."""
    if not cuda:
        return None, None
    if cuda in MIN_DRIVER:
        return MIN_DRIVER[cuda], "release notes"
    floor = MINOR_COMPAT_FLOOR.get(cuda.split(".")[0])
    return (floor, "minor-version compatibility") if floor else (None, None)


def derive_facts(variant: Variant, text: str) -> dict[str, Any]:
    """Versions read off the resolved distributions, never from a torch→CUDA table."""
    pins = parse_pins(text)
    cuda_full = _find(pins, "nvidia-cuda-runtime")
    cuda = major_minor(cuda_full)
    driver, basis = min_driver(cuda)
    cudnn_full = _find(pins, "nvidia-cudnn")
    return {
        "variant": variant.id,
        "torch": pins.get("torch"),
        "python": variant.python,
        "accelerator": variant.accelerator,
        "flavor": variant.flavor,
        "platform": variant.platform,
        "cuda": cuda,
        "cuda_full": cuda_full,
        "cudnn": ".".join(cudnn_full.split(".")[:3]) if cudnn_full else None,
        "nccl": _find(pins, "nvidia-nccl"),
        "triton": pins.get("triton"),
        "min_driver": driver,
        "min_driver_basis": basis,
        "packages": len(pins),
    }


def check_facts(variant: Variant, facts: Mapping[str, Any], matrix: Matrix) -> list[str]:
    """Problems only visible once resolved (the matrix file cannot know the wheel's CUDA)."""
    problems = []
    if variant.accelerator == "cuda" and not facts["cuda"]:
        problems.append(f"{variant.key}: torch {variant.torch} resolved without CUDA libraries "
                        f"for {variant.platform} (PyPI serves a CPU-only wheel there); drop "
                        "the platform or the cuda accelerator for it")
    if variant.accelerator == "cpu" and facts["cuda"]:
        problems.append(f"{variant.id}: accelerator cpu resolved CUDA {facts['cuda']} libraries")
    if variant.cuda and facts["cuda"] != variant.cuda:
        problems.append(f"{variant.id}: declares cuda {variant.cuda} but the wheels bring "
                        f"{facts['cuda']}")
    wants_toolkit = FLAVORS[variant.flavor].toolkit and facts["cuda"]
    if wants_toolkit and matrix.toolkit_for(facts["cuda"]) is None:
        problems.append(f"{variant.id}: no toolkit source for CUDA {facts['cuda']} in `toolkits` "
                        "(devel images need an nvcc of the same major.minor as torch's CUDA)")
    return problems


# ---------------------------------------------------------------- the lock stage


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


def lock_variant(matrix: Matrix, variant: Variant, locks_dir: Path, *, upgrade: bool = False,
                 upgrade_packages: Sequence[str] = (),
                 memo: dict[str, str] | None = None) -> tuple[Lock, bool]:
    """Resolve one variant unless its recorded inputs are unchanged. Returns (lock, changed?).

    With `upgrade_packages` (a security re-lock), the existing pins are kept except for those
    packages, which move to the newest release the matrix allows.
    """
    memo = {} if memo is None else memo
    txt_path, json_path = lock_paths(locks_dir, variant)
    existing = json.loads(json_path.read_text()) if json_path.exists() else None
    base_path = base_lock_path(locks_dir, variant)

    def resolve_reqs(reqs: list[str], current_path: Path) -> str:
        if upgrade_packages and current_path.exists():
            return resolve(variant, reqs, current=current_path.read_text(),
                           upgrade_packages=upgrade_packages)
        return _resolve_memo(variant, reqs, upgrade, memo)

    reqs = requirements(variant)
    text = base_text = resolve_reqs(reqs, base_path if base_path.exists() else txt_path)
    facts = derive_facts(variant, text)
    with_toolkit = False
    if FLAVORS[variant.flavor].toolkit and facts["cuda"]:
        toolkit = matrix.toolkit_for(facts["cuda"]) or {}
        if toolkit.get("wheels"):
            with_toolkit = True
            reqs = requirements(variant, toolkit_cuda=facts["cuda"])
            text = resolve_reqs(reqs, txt_path)
            facts = derive_facts(variant, text)
    problems = check_facts(variant, facts, matrix)
    if problems:
        raise ConfigError("\n".join(problems))
    unchanged = txt_path.exists() and txt_path.read_text() == text and (
        not with_toolkit or (base_path.exists() and base_path.read_text() == base_text))
    if existing and existing.get("inputs_hash") == inputs_hash(variant, reqs) and unchanged \
            and existing.get("text_sha256") == text_sha256(text) and not upgrade:
        return Lock(variant.id, text, existing["facts"]), False
    if with_toolkit:
        atomic_write(base_path, base_text)
    atomic_write(txt_path, text)
    atomic_write(json_path, lock_metadata(variant, reqs, facts, text,
                                          base_text if with_toolkit else None))
    return Lock(variant.id, text, facts), True


def _resolve_memo(variant: Variant, reqs: list[str], upgrade: bool, memo: dict[str, str]) -> str:
    key = inputs_hash(variant, reqs)
    if key not in memo:
        memo[key] = resolve(variant, reqs, upgrade=upgrade)
    return memo[key]


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


def lock_all(matrix: Matrix, variants: list[Variant], locks_dir: Path, *, upgrade: bool = False,
             progress: Callable[[str], None] = print) -> list[tuple[Lock, bool]]:
    memo: dict[str, str] = {}
    results = []
    for variant in variants:
        if not upgrade and is_current(locks_dir, variant):
            results.append((require_lock(locks_dir, variant), False))
            progress(f"  up-to-date  {variant.key}")
            continue
        lock, changed = lock_variant(matrix, variant, locks_dir, upgrade=upgrade, memo=memo)
        progress(f"  {'locked' if changed else 'unchanged':10}  {variant.key}  "
                 f"cuda={lock.facts['cuda']} cudnn={lock.facts['cudnn']} nccl={lock.facts['nccl']}")
        results.append((lock, changed))
    return results


def base_lock_path(locks_dir: Path, variant: Variant) -> Path:
    """A devel variant with toolkit wheels also records the runtime resolution it builds on."""
    return locks_dir / f"{lock_stem(variant)}.base.txt"


def read_base_lock(locks_dir: Path, variant: Variant) -> Lock | None:
    path = base_lock_path(locks_dir, variant)
    return Lock(variant.id, path.read_text(), {}) if path.exists() else None
