"""Render each variant's Dockerfile from templates/ — pure and offline, byte-for-byte deterministic.

Output for a variant, `DIR/<id>/`, mirrors the part of the shared build context it uses:
  Dockerfile, Dockerfile.dockerignore  (only this variant's files are sent to the engine)
  lock.txt                             the lock it installs
  sets/<set>/requirements.txt          one per install step (local find-links wheels are linked
                                       in at build time; the rest come from the wheel cache)
  tools/uv/requirements.txt            the hash-pinned uv the install steps run
  facts/<hash>.json                    facts copied into the image as /opt/torch-images/image.json
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from builder.core import labels, state, swap
from builder.core.errors import BuilderError, ConfigError
from builder.model import bases, flavors, lockfile, platforms
from builder.model.lockfile import Lock, lock_stem, normalize, parse_pins
from builder.model.matrix import Matrix, Variant
from builder.model.rendered import Rendered, Step, facts_json, facts_source
from smoke.versions import nvidia_require_cuda

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"
OS_PACKAGES_APT = ("ca-certificates", "python3", "python3-venv")
OS_PACKAGES_IMAGE = ("ca-certificates",)
DEVEL_PACKAGES = ("build-essential", "ninja-build", "git")
# The smallest toolchain torch.compile needs (pytorch/pytorch#116696): inductor compiles C++ on
# CPU and triton builds a C launcher on GPU, both against Python.h. An image's own python
# (python_from: image) ships its headers; Debian's needs libpython3-dev.
COMPILER_PACKAGES = ("g++",)
PYTHON_HEADERS_APT = ("libpython3-dev",)
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
    """The templates: `$BUILDER_TEMPLATES` (a folder searched first, e.g. a test's planted
    variation), then templates/."""
    extra = os.environ.get("BUILDER_TEMPLATES")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader([*([extra] if extra else []), TEMPLATES]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True, autoescape=False,
    )
    env.filters["dockerfile_value"] = dockerfile_value
    return env


# NVIDIA's wheels go to a python-independent folder (a site dir the venv reads through a .pth):
# two pythons or two flavors that pin the same nvidia-* wheels share one layer blob.
NVIDIA_SITE = "/opt/nvidia/lib/python3/site-packages"
# Every apt step's apt-get. dpkg skips its fsyncs: a build step's layer is committed whole or not
# at all, so they only cost time (2-3 s of an apt step here).
APT_GET = "DEBIAN_FRONTEND=noninteractive apt-get -o Dpkg::Options::=--force-unsafe-io"
# SOURCE_DATE_EPOCH of every layer: one fixed time, not the lock's, so that a layer's bytes do not
# change when another part of the lock does (a numpy bump must not re-date the torch layer) and
# variants share their common layers (templates/reproducible.j2 applies it).
FIXED_EPOCH = bases.SOURCE_DATE_EPOCH
# Where install steps mount things: made in the os layer, so a mount leaves no stub behind.
MOUNTS = {"cache": "/mnt/build/cache", "set": "/mnt/build/set", "uv": "/mnt/build/uv"}
UV_REQUIREMENTS = TEMPLATES / "uv.txt"


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


def part_of(name: str) -> str:
    """Which part of the lock a package belongs to; each part is one layer."""
    if name.startswith("nvidia-"):
        return "nvidia"
    if name in ("torch", "triton"):
        return name
    if name.startswith("cuda-"):
        return "torch"  # cuda-bindings is built per python: not in the shared NVIDIA layer
    return "rest"


# The shared layers, in this order: the CUDA libraries change least.


def lock_parts(text: str) -> dict[str, str]:
    parts: dict[str, str] = {}
    for name, block in split_requirements(text):
        part = part_of(name)
        parts[part] = parts.get(part, "") + block
    return parts


def site_packages(variant: Variant) -> str:
    return f"{labels.VENV}/lib/python{variant.python}/site-packages"


def part_step(variant: Variant, part: str, requirements: str, **extra: Any) -> Step:
    nvidia = part == "nvidia"
    return Step(name=part, requirements=requirements, find_links=variant.find_links,
                target=NVIDIA_SITE if nvidia else site_packages(variant),
                platform=platforms.get(variant.platform).suffix, **extra)


def shared_steps(variant: Variant, parts: Mapping[str, str]) -> list[Step]:
    """The layers every flavor has, pruned of everything in PRUNED as they are installed."""
    prune = flavors.prune_expression(flavors.PRUNED)
    return [part_step(variant, p, parts[p], prune=prune)
            for p in flavors.SHARED_PARTS if parts.get(p)]


def flavor_steps(variant: Variant, flavor: flavors.Flavor, parts: Mapping[str, str],
                 shared: list[Step]) -> list[Step]:
    """What a flavor adds over its parent: its own packages, then what it copies back."""
    steps = [part_step(variant, p, parts[p]) for p in flavor.adds if parts.get(p)]
    for s in shared:
        categories = [c for c, parts in flavor.restores if s.name in parts]
        if categories:
            steps.append(replace(s, name=f"{s.name} {' + '.join(categories)}", prune="",
                                 restore=flavors.prune_expression(categories)))
    return steps


def delta_steps(variant: Variant, base_text: str, full_text: str) -> list[Step]:
    """What a devel image adds over its runtime lock: pins that are new or differ, by part."""
    base_pins = parse_pins(base_text)
    extra = "".join(block for name, block in split_requirements(full_text)
                    if base_pins.get(name) != parse_pins(block).get(name))
    return [replace(part_step(variant, p, reqs), name=f"toolkit {p}")
            for p, reqs in lock_parts(extra).items()]


def install_args(step: Step, variant: Variant) -> str:
    """uv's arguments for a step (the template adds --offline on the first try)."""
    args = ["--require-hashes", "--no-deps", "--no-config",
            "--cache-dir", MOUNTS["cache"], "--index-url",
            dockerfile_value(variant.index_url or "https://pypi.org/simple"),
            "--find-links", MOUNTS["set"]]  # the host puts every `find_links` wheel there
    if step.restore:  # links into a scratch folder, from which only the matches are copied
        args += ["--link-mode", "symlink", "--target", '"$scratch"']
    else:
        into_venv = step.target == site_packages(variant)  # uv finds it through $VIRTUAL_ENV
        args += ["--link-mode", "copy"] + ([] if into_venv else ["--target", step.target])
    return " ".join([*args, "-r", MOUNTS["set"] + "/requirements.txt"])


# ---------------------------------------------------------------- the render context


def image_facts(variant: Variant, lock: Lock) -> dict[str, Any]:
    facts = {k: lock.facts.get(k) for k in (
        "torch", "python", "accelerator", "cuda", "cudnn", "nccl", "triton", "min_driver")}
    left_out = flavors.dropped(variant.flavor)
    if "triton" in left_out:
        facts["triton"] = None
    # The smoke suite compares the installed nvidia-* wheels with these pins.
    wheels = {name: version for name, version in sorted(lock.pins.items())
              if name.startswith("nvidia-")}
    extra = {"platform": variant.platform} if variant.platform != platforms.DEFAULT else {}
    return {**facts, "variant": variant.id, "flavor": variant.flavor, "dropped": left_out,
            "wheels": wheels, **extra}


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
    if suite := bases.registry_served(variant):
        repo = platforms.base_repository(matrix.repository)
        arch = platforms.get(variant.platform).arch
        return f"{matrix.registry}/{repo}:{platforms.base_tag(suite, arch)}"
    return bases.local_ref(variant.base)


def render(matrix: Matrix, variant: Variant, lock: Lock, base_lock: Lock | None = None) -> Rendered:
    """The variant's Dockerfile and build context from its lock (and a devel variant's runtime
    lock, `base_lock`): the install steps by layer, then the template, then the files."""
    facts = image_facts(variant, lock)
    runtime_text = base_lock.text if base_lock else lock.text
    parts = lock_parts(runtime_text)
    steps = shared_steps(variant, parts)
    by_flavor = {row.name: flavor_steps(variant, row, parts, steps)
                 for row in flavors.lineage(variant.flavor)}
    if flavors.FLAVORS[variant.flavor].toolkit:
        by_flavor[variant.flavor] += delta_steps(variant, runtime_text, lock.text)
    context = template_context(matrix, variant, facts, steps, by_flavor,
                               nvidia=bool(parts.get("nvidia")))
    template = environment().get_template(f"{variant.flavor}.j2")
    dockerfile = re.sub(r"\n{3,}", "\n\n", template.render(**context))
    all_steps = (*steps, *(s for row in by_flavor.values() for s in row))
    files, ignore = context_files(variant, lock, facts, all_steps)
    return Rendered(variant=variant, dockerfile=dockerfile, dockerignore=ignore, lock=lock,
                    steps=all_steps, facts=facts, files=files)


def render_locked(matrix: Matrix, variant: Variant, locks_dir: Path) -> Rendered:
    """Render from the committed lock in `locks_dir` (refusing a missing or stale one)."""
    return render(matrix, variant, lockfile.require_lock(locks_dir, variant),
                  lockfile.read_base_lock(locks_dir, variant))


def template_context(matrix: Matrix, variant: Variant, facts: Mapping[str, Any],
                     steps: list[Step], by_flavor: Mapping[str, list[Step]], *,
                     nvidia: bool) -> dict[str, Any]:
    """Everything a flavor template reads (StrictUndefined: a name missing here fails)."""
    toolkit = matrix.toolkit_for(facts["cuda"]) if facts["cuda"] else None
    apt_python = variant.base.python_from == "apt"
    source = facts_source(facts)
    return {
        "v": variant,
        "facts": facts,
        "base_ref": base_ref(variant, matrix),
        "base_by_digest": bool(bases.registry_served(variant)),
        "lock_stem": lock_stem(variant),
        "venv": labels.VENV,
        "site": site_packages(variant),
        "home": labels.HOME,
        "uid": labels.USER_UID,
        "python": "python3",
        "os_packages": OS_PACKAGES_APT if apt_python else OS_PACKAGES_IMAGE,
        "compiler_packages": COMPILER_PACKAGES + (PYTHON_HEADERS_APT if apt_python else ()),
        "devel_packages": DEVEL_PACKAGES + (("python3-dev",) if apt_python else ()),
        "dpkg_excludes": bases.DPKG_EXCLUDES,
        "apt_get": APT_GET,
        "steps": steps,
        "flavor_steps": by_flavor,
        "final_user": 0 if flavors.FLAVORS[variant.flavor].root else labels.USER_UID,
        "nvidia_site": NVIDIA_SITE if nvidia else None,
        "mounts": MOUNTS,
        "epoch": FIXED_EPOCH,
        "uv_source": uv_source(variant.platform),
        "install_args": lambda step: install_args(step, variant),
        "toolkit_image": (toolkit or {}).get("image"),
        "cuda_home": (f"{NVIDIA_SITE}/nvidia/cu{facts['cuda'].split('.')[0]}"
                      if toolkit and toolkit.get("wheels") else None),
        "facts_source": source,
        "facts_dir": source.rsplit("/", 1)[0],
        "facts_file": source.rsplit("/", 1)[1],
        "home_dir": "/home/user",
        "ca_target": "/etc/ssl/certs/ca-certificates.crt",
        "labels": static_labels(matrix, variant, facts),
        # Derived from the min-driver label's fact, so the container runtime admits exactly
        # the drivers the label promises (a unit test checks every shipped variant).
        "cuda_env": {"require": nvidia_require_cuda(facts["min_driver"])
                     or f"cuda>={facts['cuda']}"} if facts["cuda"] else None,
    }


def context_files(variant: Variant, lock: Lock, facts: Mapping[str, Any],
                  steps: tuple[Step, ...]) -> tuple[dict[str, str], str]:
    """(relative path → text of each file the build context holds, the ignore file that sends
    the engine only those)."""
    uv_dir = uv_source(variant.platform)
    files = {f"{s.source}/requirements.txt": s.requirements for s in steps}
    files[f"{uv_dir}/requirements.txt"] = uv_requirements()
    files[facts_source(facts)] = facts_json(facts)
    files["lock.txt"] = lock.text
    ignore = ["# Generated by `builder render`: send the engine only this variant's files.", "*"]
    ignore += sorted({f"!{s.source}" for s in steps}) + [
        f"!{uv_dir}", f"!{facts_source(facts)}", "!smoke", "smoke/**/__pycache__"]
    return files, "\n".join(ignore) + "\n"


@cache
def uv_requirements() -> str:
    """The hash-pinned uv that installs every image (kept out of the images themselves)."""
    return UV_REQUIREMENTS.read_text()


def uv_source(platform: str = platforms.DEFAULT) -> str:
    """Its folder in the build context (by content: a new pin is a new folder), with the
    platform's suffix off linux/amd64: one context serves every platform, each its own uv wheel."""
    digest = hashlib.sha256(uv_requirements().encode()).hexdigest()[:12]
    return f"tools/uv-{digest}{platforms.get(platform).suffix}"


def write(rendered: Rendered, out_dir: Path) -> Path:
    """Write DIR/<id>/ atomically: stage a private sibling folder, then exchange it with the old
    output in one step (builder.core.swap), so DIR/<id> is always the old output or the new one,
    never half-written, half-deleted or missing, even under SIGKILL."""
    target = out_dir / rendered.variant.key
    staging: Path | None = None
    try:
        if target.is_symlink() or (target.exists() and not target.is_dir()):
            kind = "a symbolic link" if target.is_symlink() else "a file"
            raise BuilderError(f"cannot write {target}: it is {kind}, not a folder")
        out_dir.mkdir(parents=True, exist_ok=True)
        staging = swap.staging_folder(target)
        for rel, text in {"Dockerfile": rendered.dockerfile,
                          "Dockerfile.dockerignore": rendered.dockerignore,
                          **rendered.files}.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        swap.replace_dir(staging, target)
    except OSError as exc:
        raise state.path_error(target, exc) from None
    finally:
        if staging is not None:
            swap.remove_tree(staging)  # the old tree, or the new one when something failed
    return target
