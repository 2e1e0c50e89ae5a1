"""Render each variant's Dockerfile from templates/ — pure and offline, byte-for-byte deterministic.

Output for a variant, `DIR/<id>/`, mirrors the part of the shared build context it uses:
  Dockerfile, Dockerfile.dockerignore  (only this variant's files are sent to the engine)
  lock.txt                             the lock it installs
  sets/<set>/requirements.txt          one per install step (wheels are linked in at build time)
  facts/<hash>.json                    facts copied into the image as /opt/torch-images/image.json
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from builder import labels, platforms
from builder.errors import ConfigError
from builder.locks import Lock, lock_stem, normalize, parse_pins
from builder.matrix import Matrix, Variant

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
SMOKE_DIR = Path(__file__).resolve().parent.parent / "smoke"
OS_PACKAGES_APT = ("ca-certificates", "python3", "python3-venv")
OS_PACKAGES_IMAGE = ("ca-certificates",)
DEVEL_PACKAGES = ("build-essential", "ninja-build", "git")
# What slim leaves out; the label and image.json list it, and the smoke suite reads it.
SLIM_DROPPED = ("triton", "headers", "static-libraries", "tests", "docs")
_SAFE = re.compile(r"^[A-Za-z0-9_.,:/@=+<>*~!\-\[\] ]*$")


def dockerfile_value(value: object) -> str:
    """The last guard before text reaches a Dockerfile: no quote, newline or shell character."""
    text = str(value)
    if not _SAFE.match(text):
        raise ConfigError(f"refusing to render {text!r} into a Dockerfile: it contains a character "
                          "outside letters, digits and . , : / @ = + < > * ~ ! - [ ]")
    return text


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True, autoescape=False,
    )
    env.filters["dockerfile_value"] = dockerfile_value
    return env


@dataclass(frozen=True)
class Step:
    name: str
    requirements: str  # the lines of the lock this step installs
    prune: str = ""
    # Platform suffix: a lock's hashes cover every platform's wheels, so the same text needs
    # a different set of wheels per platform ("" on linux/amd64 keeps its set ids).
    platform: str = ""

    @property
    def set_id(self) -> str:
        return hashlib.sha256((self.requirements + self.platform).encode()).hexdigest()[:20]

    @property
    def source(self) -> str:
        return f"sets/{self.set_id}"


@dataclass(frozen=True)
class Rendered:
    variant: Variant
    dockerfile: str
    dockerignore: str
    lock: Lock
    steps: tuple[Step, ...]
    facts: dict[str, Any]
    files: dict[str, str] = field(default_factory=dict)  # relative path -> text

    @property
    def facts_source(self) -> str:
        return facts_source(self.facts)


def facts_source(facts: Mapping[str, Any]) -> str:
    text = facts_json(facts)
    return f"facts/{hashlib.sha256(text.encode()).hexdigest()[:20]}.json"


def facts_json(facts: Mapping[str, Any]) -> str:
    return json.dumps(facts, indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------- splitting the lock


def split_requirements(text: str) -> list[tuple[str, str]]:
    """The lock as (normalised name, requirement block) pairs, hashes included."""
    blocks: list[tuple[str, str]] = []
    current: list[str] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith(("#", "--index-url", "--find-links")):
            continue
        if not line.startswith((" ", "\t")) and current:
            blocks.append(_block(current))
            current = []
        current.append(line)
    if current:
        blocks.append(_block(current))
    return blocks


def _block(lines: list[str]) -> tuple[str, str]:
    name = normalize(re.split(r"[=<>!~ ;\\]", lines[0].strip(), maxsplit=1)[0])
    return name, "\n".join(lines) + "\n"


def step_of(name: str) -> str:
    if name.startswith(("nvidia-", "cuda-")):
        return "nvidia"
    if name in ("torch", "triton"):
        return "torch"
    return "rest"


def site_packages(variant: Variant) -> str:
    return f"{labels.VENV}/lib/python{variant.python}/site-packages"


def slim_prune(variant: Variant) -> str:
    site = site_packages(variant)
    return (f"find {site} \\( -type d \\( -name include -o -name __pycache__ -o -path "
            f"'*/numpy/*/tests' \\) -o -type f -name '*.a' \\) -prune -exec rm -rf {{}} +")


def install_steps(variant: Variant, text: str, skip: frozenset[str] = frozenset()) -> list[Step]:
    """One step per part (nvidia, torch, rest), in that order: the CUDA libraries change least."""
    parts: dict[str, str] = {"nvidia": "", "torch": "", "rest": ""}
    for name, block in split_requirements(text):
        if name in skip:
            continue
        parts[step_of(name)] += block
    prune = slim_prune(variant) if variant.flavor == "slim" else ""
    suffix = platforms.get(variant.platform).suffix
    return [Step(n, reqs, prune, suffix) for n, reqs in parts.items() if reqs]


def delta_steps(base_text: str, full_text: str, platform: str = "") -> list[Step]:
    """What a devel image adds over its runtime stage: pins that are new or differ."""
    base = parse_pins(base_text)
    extra = "".join(block for name, block in split_requirements(full_text)
                    if base.get(name) != parse_pins(block).get(name))
    return [Step("toolkit", extra, platform=platform)] if extra else []


# ---------------------------------------------------------------- the render context


def image_facts(variant: Variant, lock: Lock) -> dict[str, Any]:
    facts = {k: lock.facts.get(k) for k in (
        "torch", "python", "accelerator", "cuda", "cudnn", "nccl", "triton", "min_driver")}
    dropped = list(SLIM_DROPPED) if variant.flavor == "slim" else []
    if "triton" in dropped:
        facts["triton"] = None
    extra = {"platform": variant.platform} if variant.platform != platforms.DEFAULT else {}
    return {**facts, "variant": variant.id, "flavor": variant.flavor, "dropped": dropped, **extra}


def static_labels(matrix: Matrix, variant: Variant, facts: Mapping[str, Any]) -> dict[str, str]:
    """Labels fixed by the inputs; created/revision/digests/hashes are added at build time."""
    licenses = "BSD-3-Clause" if variant.accelerator == "cpu" else \
        "BSD-3-Clause AND LicenseRef-NVIDIA-Software-License"
    values = {
        labels.OCI + "title": f"{matrix.repository}:{variant.id}",
        labels.OCI + "version": facts["torch"],
        labels.OCI + "licenses": licenses,
        labels.OCI + "base.name": variant.base.image,
        labels.VARIANT: variant.id,
        labels.TORCH: facts["torch"],
        labels.PYTHON: variant.python,
        labels.ACCELERATOR: variant.accelerator,
        labels.CUDA: facts["cuda"] or "",
        labels.CUDNN: facts["cudnn"] or "",
        labels.NCCL: facts["nccl"] or "",
        labels.TRITON: facts["triton"] or "",
        labels.FLAVOR: variant.flavor,
        labels.MIN_DRIVER: facts["min_driver"] or "",
        labels.DROPPED: ",".join(facts["dropped"]),
    }
    return {k: str(v) for k, v in values.items()}


def base_ref(variant: Variant, matrix: Matrix) -> str:
    """The image name of the variant's base (`builder base` makes it exist): local on
    linux/amd64; off it, a bootstrapped base is served from the registry (BuildKit resolves a
    foreign-platform FROM there), and a normal ref is pulled for that platform."""
    suite = variant.base.bootstrap_suite
    platform = platforms.get(variant.platform)
    if suite and platform.suffix:
        repo = platforms.base_repository(matrix.repository)
        return f"{matrix.registry}/{repo}:{platforms.base_tag(suite, platform)}"
    return f"torch-images-base:{suite}" if suite else variant.base.image


def render(matrix: Matrix, variant: Variant, lock: Lock, base_lock: Lock | None = None) -> Rendered:
    facts = image_facts(variant, lock)
    skip = frozenset({"triton"}) if variant.flavor == "slim" else frozenset()
    runtime_text = base_lock.text if base_lock else lock.text
    steps = install_steps(variant, runtime_text, skip)
    devel_steps = (delta_steps(runtime_text, lock.text, platforms.get(variant.platform).suffix)
                   if variant.flavor == "devel" else [])
    toolkit = matrix.toolkit_for(facts["cuda"]) if facts["cuda"] else None
    apt_python = variant.base.python_from == "apt"
    context = {
        "v": variant,
        "facts": facts,
        "base_ref": base_ref(variant, matrix),
        "lock_stem": lock_stem(variant),
        "venv": labels.VENV,
        "home": labels.HOME,
        "uid": labels.USER_UID,
        "python": "python3",
        "os_packages": OS_PACKAGES_APT if apt_python else OS_PACKAGES_IMAGE,
        "devel_packages": DEVEL_PACKAGES + (("python3-dev",) if apt_python else ()),
        "steps": steps,
        "devel_steps": devel_steps,
        "toolkit_image": (toolkit or {}).get("image"),
        "cuda_home": (f"{site_packages(variant)}/nvidia/cu{facts['cuda'].split('.')[0]}"
                      if toolkit and toolkit.get("wheels") else None),
        "facts_source": facts_source(facts),
        "labels": static_labels(matrix, variant, facts),
        "cuda_env": {"require": f"cuda>={facts['cuda']}"} if facts["cuda"] else None,
    }
    template = environment().get_template(f"{variant.flavor}.j2")
    dockerfile = re.sub(r"\n{3,}", "\n\n", template.render(**context))
    all_steps = [*steps, *devel_steps]
    files = {f"{s.source}/requirements.txt": s.requirements for s in all_steps}
    files[facts_source(facts)] = facts_json(facts)
    files["lock.txt"] = lock.text
    ignore = ["# Generated by `builder render`: send the engine only this variant's files.", "*"]
    ignore += [f"!{s.source}" for s in all_steps] + [f"!{facts_source(facts)}", "!smoke",
                                                      "smoke/**/__pycache__"]
    return Rendered(variant, dockerfile, "\n".join(ignore) + "\n", lock, tuple(all_steps), facts,
                    files)


def write(rendered: Rendered, out_dir: Path) -> Path:
    """Write DIR/<id>/ atomically: a half-written variant directory is never left behind."""
    target = out_dir / rendered.variant.key
    staging = out_dir / f".{rendered.variant.key}.tmp"
    if staging.exists():
        shutil.rmtree(staging)
    for rel, text in {"Dockerfile": rendered.dockerfile,
                      "Dockerfile.dockerignore": rendered.dockerignore, **rendered.files}.items():
        path = staging / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return target
