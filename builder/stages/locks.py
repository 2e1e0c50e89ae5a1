"""Resolve each variant to a hash-pinned lock (uv) and derive its facts from what was resolved.

The files it writes, and how every other step reads them, are builder.model.lockfile:
`locks/<id>.txt` (the requirements, hash-pinned) and `locks/<id>.json` (the facts read off the
resolved distributions: CUDA runtime, cuDNN, NCCL, triton …, plus the hash of the inputs, so
unchanged variants are not resolved again).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from builder.core import proc, settings, simple_index
from builder.core.errors import BuilderError, ConfigError
from builder.core.state import atomic_write
from builder.model import platforms
from builder.model.flavors import FLAVORS
from builder.model.lockfile import (
    Lock,
    base_lock_path,
    inputs_hash,
    is_current,
    lock_metadata,
    lock_paths,
    normalize,
    parse_pins,
    require_lock,
    requirements,
    text_sha256,
)
from builder.model.matrix import Matrix, Variant
from smoke.versions import MIN_DRIVER, MINOR_COMPAT_FLOOR

# Each target platform resolves for its own machine and glibc 2.28 (the cuDNN wheels need
# ≥ 2.27; Debian 12 and Ubuntu 22.04+ have newer): builder.model.platforms.Platform.uv.


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
        # The target python is only a marker environment (`--python-version`): uv runs on this
        # interpreter, never searching PATH (seconds of shims) nor downloading a managed python
        # (a minute per resolve, under one machine-wide lock, where it cannot be reached).
        argv = ["uv", "pip", "compile", "--no-config", "--native-tls", "--quiet",
                "--python", sys.executable, "--no-python-downloads",
                "--python-version", variant.python,
                "--python-platform", platforms.get(variant.platform).uv,
                "--generate-hashes", "--no-header", "--no-annotate", "--emit-find-links",
                "--emit-index-url", str(req_in), "-o", str(out)]
        sources = settings.current().wheel_sources(variant.find_links)
        for link in sources:
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
        text = with_page_hashes(out.read_text(), [s for s in sources if settings.is_url(s)])
        return declared_find_links(text, variant.find_links)


def with_page_hashes(text: str, pages: Sequence[str]) -> str:
    """uv writes no hash for a pin it found on a remote `find_links` page (astral-sh/uv#10308):
    each such pin gets the sha256 of every wheel of its version the pages list, as pip-tools
    does (a local mirror's wheels uv hashes itself). ConfigError naming a pin still unhashed."""
    if not pages:
        return text
    listed: dict[tuple[str, str], set[str]] = {}
    for page in pages:
        for pin, hashes in page_hashes(page).items():
            listed.setdefault(pin, set()).update(hashes)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        if match:
            hashes = sorted(listed.get((normalize(match[1]), match[2]), ()))
            if not hashes:
                raise ConfigError(f"{line}: no page of {', '.join(pages)} lists its sha256",
                                  hint="a find-links page must give `#sha256=` with each file")
            lines[i] = " \\\n".join([line, *(f"    --hash=sha256:{h}" for h in hashes)])
    return "\n".join(lines) + "\n"


_PAGES: dict[str, dict[tuple[str, str], frozenset[str]]] = {}
_PAGES_LOCK = threading.Lock()


def page_hashes(page: str) -> dict[tuple[str, str], frozenset[str]]:
    """The sha256 of each (name, version) a `find_links` page lists, fetched once per run: the
    variants resolved at once (`lock --check`'s threads) share the page (it is megabytes)."""
    with _PAGES_LOCK:
        if page not in _PAGES:
            listed: dict[tuple[str, str], set[str]] = {}
            for file in simple_index.project_files(page):
                if file.pin and file.sha256:
                    listed.setdefault(file.pin, set()).add(file.sha256)
            _PAGES[page] = {pin: frozenset(h) for pin, h in listed.items()}
        return _PAGES[page]


def declared_find_links(text: str, find_links: Sequence[str]) -> str:
    """The lock names the variant's declared `find_links`, never the mirror folders this machine
    resolved from (settings.wheel_sources): the same lock wherever it is made, its hashes
    pinning the bytes either way."""
    kept = [line for line in text.splitlines(keepends=True)
            if not line.startswith("--find-links ")]
    at = next((i + 1 for i, line in enumerate(kept) if line.startswith("--index-url ")), 0)
    return "".join([*kept[:at], *(f"--find-links {link}\n" for link in find_links), *kept[at:]])


def torch_pulls_cuda(variant: Variant) -> bool | None:
    """Whether torch alone, resolved for the variant's python and platform, brings NVIDIA's CUDA
    libraries (None when it cannot be resolved): what builder.stages.wheels asks when an index
    serves no wheel METADATA."""
    try:
        text = resolve(variant, [f"torch=={variant.torch}"])
    except BuilderError:
        return None
    return bool(derive_facts(variant, text)["cuda"])


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


