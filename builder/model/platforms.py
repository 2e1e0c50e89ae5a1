"""Target platforms (`linux/amd64`, `linux/arm64`): names, wheel tags, lock and tag suffixes,
foreign-platform base images, and the multi-arch image index that joins one variant's platforms
under one tag.

linux/amd64 is the reference platform: its locks, local tags and base keep the names they had
before platforms existed (`locks/<id>.txt`, `torch-images-base:<suite>`), so adding a platform
changes nothing for amd64. Every other platform adds a `.linux-<arch>` suffix.
"""

from __future__ import annotations

import hashlib
import platform as host_platform
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from builder.core import media
from builder.core.errors import ConfigError

if TYPE_CHECKING:  # render reads this table: no registry client at run time
    from builder.core.oci import Descriptor


@dataclass(frozen=True, kw_only=True)
class Platform:
    name: str  # OCI form: linux/arm64
    arch: str  # OCI/Debian architecture: arm64
    machine: str  # uname -m and wheel tags: aarch64
    variant: str | None = None  # OCI platform variant (arm64 → v8)
    # wheel tags older than manylinux_2_17 that pip still accepts here (only x86 had them)
    legacy_wheel_tags: tuple[str, ...] = ()

    @property
    def uv(self) -> str:
        """`uv pip compile --python-platform`: glibc 2.28, which the cuDNN wheels need."""
        return f"{self.machine}-manylinux_2_28"

    @property
    def suffix(self) -> str:
        """Lock-file and local-tag suffix; empty for the reference platform."""
        return "" if self.name == DEFAULT else "." + self.name.replace("/", "-")

    @property
    def manylinux_tags(self) -> list[str]:
        """Every wheel platform tag a glibc-2.28+ Linux of this machine accepts (pip --platform)."""
        tags = [f"manylinux_2_{n}_{self.machine}" for n in range(28, 16, -1)]
        tags.append(f"manylinux2014_{self.machine}")
        return [*tags, *self.legacy_wheel_tags, f"linux_{self.machine}"]

    def as_oci(self) -> dict[str, str]:
        out = {"architecture": self.arch, "os": "linux"}
        return out | ({"variant": self.variant} if self.variant else {})


DEFAULT = "linux/amd64"
KNOWN: Mapping[str, Platform] = {
    "linux/amd64": Platform(name="linux/amd64", arch="amd64", machine="x86_64",
                            legacy_wheel_tags=(
                                *(f"manylinux_2_{n}_x86_64" for n in range(16, 4, -1)),
                                "manylinux2010_x86_64", "manylinux1_x86_64")),
    "linux/arm64": Platform(name="linux/arm64", arch="arm64", machine="aarch64", variant="v8"),
}
_MACHINES = {p.machine: p for p in KNOWN.values()}


def get(name: str) -> Platform:
    try:
        return KNOWN[name]
    except KeyError:
        raise ConfigError(f"unknown platform `{name}`; known: {', '.join(KNOWN)}") from None


def host() -> Platform | None:
    """The platform this machine runs natively (None when it is none of the known ones)."""
    return _MACHINES.get(host_platform.machine())


def of_image(info: Mapping[str, Any]) -> Platform | None:
    """The platform of a `docker image inspect` result (None for an unknown architecture)."""
    found = [p for p in KNOWN.values() if p.arch == info.get("Architecture", KNOWN[DEFAULT].arch)]
    return found[0] if found else None


def emulated(name: str) -> bool:
    """True when images of this platform run here through binfmt/qemu, not natively."""
    native = host()
    return native is None or native.name != name


BINFMT_MISC = Path("/proc/sys/fs/binfmt_misc")
ENABLE_EMULATION = "tools/setup_emulation.sh"


def cannot_run(name: str) -> str | None:
    """Why this host cannot run programs of platform `name` (bootstrap, build, smoke), or None:
    natively, or through an enabled qemu binfmt handler with the F flag (which also works
    inside containers) plus mmdebstrap's arch-test."""
    if not emulated(name):
        return None
    machine = get(name).machine
    try:
        handler = (BINFMT_MISC / f"qemu-{machine}").read_text()
    except OSError:
        handler = ""
    flags = next((line for line in handler.splitlines() if line.startswith("flags:")), "")
    if handler.startswith("enabled") and "F" in flags and shutil.which("arch-test"):
        return None
    here = host()
    return (f"{name} needs emulation on this {here.name if here else 'unknown'} host: run "
            f"{ENABLE_EMULATION} (or build on a {name} host)")


def timeout_scale(name: str) -> float:
    """Emulated CPUs are 10 to 30 times slower: the per-check smoke timeouts grow."""
    return EMULATED_TIMEOUT_SCALE if emulated(name) else 1.0


EMULATED_TIMEOUT_SCALE = 15.0


# ---------------------------------------------------------------- wheels per platform


def wheel_matches(filename: str, platform: Platform) -> bool:
    """Whether a wheel file name is built for this platform's machine (or for any)."""
    tags = filename.removesuffix(".whl").split("-")[-1]
    return any(t == "any" or t.endswith("_" + platform.machine) for t in tags.split("."))


def requires_cuda(metadata: str, platform: Platform, python: str) -> bool:
    """Whether a wheel's METADATA pulls NVIDIA CUDA libraries on this platform: a CUDA build.
    torch's Requires-Dist markers name platform_machine, so they are evaluated, not grepped."""
    from packaging.requirements import InvalidRequirement, Requirement

    env = {"platform_machine": platform.machine, "sys_platform": "linux",
           "platform_system": "Linux", "os_name": "posix", "python_version": python,
           "python_full_version": python + ".0", "implementation_name": "cpython",
           "platform_python_implementation": "CPython", "extra": ""}
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        try:
            req = Requirement(line.split(":", 1)[1].strip())
        except InvalidRequirement:
            continue
        if req.name.lower().startswith("nvidia-") and (
                req.marker is None or req.marker.evaluate(env)):
            return True
    return False


def wheel_problem(torch: str, python: str, accelerator: str, platform: Platform,
                  wheels: Sequence[str], cuda_build: Callable[[str], bool | None]) -> str | None:
    """Why torch==`torch` cannot serve this (python, platform, accelerator), or None.
    `wheels` are the file names for that torch and python; `cuda_build(name)` says whether one
    is a CUDA build (None: unknown, and the check is left to the lock)."""
    here = [w for w in wheels if wheel_matches(w, platform)]
    if not here:
        return (f"torch {torch} has no wheel for python {python} on {platform.name} "
                f"(no cp{python.replace('.', '')} {platform.machine} wheel on its index)")
    if accelerator != "cuda":
        return None
    if cuda_build(here[0]) is False:
        return (f"torch {torch} on {platform.name} is a CPU-only build (its {platform.machine} "
                "wheel requires no nvidia-* CUDA libraries); drop the platform or the cuda "
                "accelerator for it")
    return None


# ---------------------------------------------------------------- foreign-platform bases


def base_key(image: str, platform: str) -> str:
    """Key of a base digest: the base ref, plus the platform suffix off linux/amd64."""
    return image + get(platform).suffix


def base_repository(repository: str) -> str:
    return f"{repository}-base"


def base_tag(suite: str, arch: str) -> str:
    """The floating tag a foreign-platform FROM names: `<suite>-slim-<arch>`."""
    return f"{suite}-slim-{arch}"  # the slim bootstrap (builder.stages.base.SLIM_OPTIONS)


def layers_digest(diff_ids: Sequence[str]) -> str:
    """The same base digest `builder.stages.base.digest_of` computes for a local image: over its
    filesystem layers, so a re-bootstrap with the same packages changes nothing."""
    return "sha256:" + hashlib.sha256("\n".join(diff_ids).encode()).hexdigest()


# ---------------------------------------------------------------- the multi-arch index


@dataclass(frozen=True)
class PlatformManifest:
    platform: Platform
    descriptor: Descriptor


def index_document(manifests: Sequence[PlatformManifest],
                   annotations: Mapping[str, str] | None = None) -> dict[str, Any]:
    """An OCI image index: one entry per platform, in a fixed order (reference platform first),
    so the same manifests always give the same index digest."""
    names = [m.platform.name for m in manifests]
    if len(set(names)) != len(names):
        raise ConfigError(f"an image index needs one manifest per platform, got {names}")
    order = list(KNOWN)
    entries = sorted(manifests, key=lambda m: (order.index(m.platform.name)
                                               if m.platform.name in order else len(order),
                                               m.platform.name))
    doc: dict[str, Any] = {
        "schemaVersion": 2, "mediaType": media.OCI_INDEX,
        "manifests": [{**m.descriptor.as_json(), "platform": m.platform.as_oci()}
                      for m in entries],
    }
    if annotations:
        doc["annotations"] = dict(sorted(annotations.items()))
    return doc
