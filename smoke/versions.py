"""Pure version helpers (no torch): driver minimums, CUDA arch compatibility, version formats."""

from __future__ import annotations

import re

# Minimum Linux driver per CUDA release (NVIDIA's CUDA toolkit release notes, table 3), and the
# floor of each major under minor-version compatibility for minors not listed. The one copy:
# builder.stages.locks writes `min_driver` into the facts from it; the suite falls back on it.
MIN_DRIVER = {
    "11.8": "520.61.05", "12.0": "525.60.13", "12.1": "530.30.02", "12.2": "535.54.03",
    "12.3": "545.23.06", "12.4": "550.54.14", "12.5": "555.42.02", "12.6": "560.28.03",
    "12.8": "570.26", "12.9": "575.51.03", "13.0": "580.65.06",
}
MINOR_COMPAT_FLOOR = {"11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}


def numeric(version: str | None) -> tuple[int, ...]:
    """`"2.15.0+cu132"` → (2, 15, 0); `"535.104.05"` → (535, 104, 5); stops at a non-number."""
    parts: list[int] = []
    for piece in re.split(r"[.+]", (version or "").strip()):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group()))
        if match.group() != piece:
            break
    return tuple(parts)


def same_prefix(expected: str, actual: str | None, parts: int) -> bool:
    """Whether the first `parts` numeric components agree (e.g. CUDA major.minor)."""
    want = numeric(expected)[:parts]
    return actual is not None and bool(want) and numeric(actual)[:parts] == want


def torch_matches(expected: str, actual: str) -> bool:
    """A local tag in the facts (`+cpu`) must match exactly; else compare public versions."""
    if "+" in expected:
        return expected == actual
    return actual.split("+", 1)[0] == expected


def minimum_driver(cuda: str | None) -> str | None:
    """Fallback minimum driver for a CUDA major.minor when the facts do not say."""
    if not cuda:
        return None
    key = ".".join(str(p) for p in numeric(cuda)[:2])
    return MIN_DRIVER.get(key) or MINOR_COMPAT_FLOOR.get(key.split(".")[0])


def driver_problem(driver: str | None, min_driver: str | None, cuda: str | None) -> str | None:
    """A message when `driver` is older than `min_driver`; None when fine or not comparable."""
    if not driver or not min_driver or not numeric(driver) or not numeric(min_driver):
        return None
    if numeric(driver) >= numeric(min_driver):
        return None
    needed_by = f" needed by CUDA {cuda}" if cuda else ""
    return (
        f"driver {driver} is older than {min_driver}{needed_by}: upgrade the driver "
        "or use an image built for an older CUDA"
    )


def driver_cuda(driver: str | None) -> str | None:
    """The newest CUDA major.minor a driver is known (MIN_DRIVER) to support: 580.95.05 → 13.0.
    What the NVIDIA container runtime compares `NVIDIA_REQUIRE_CUDA` with is the driver's own
    figure, which is this one or newer."""
    if not driver or not numeric(driver):
        return None
    known = [cuda for cuda, floor in MIN_DRIVER.items() if numeric(driver) >= numeric(floor)]
    return max(known, key=numeric, default=None)


def nvidia_require_cuda(min_driver: str | None) -> str | None:
    """`NVIDIA_REQUIRE_CUDA` for an image whose minimum driver is `min_driver` (its
    io.torch-images.min-driver label): the CUDA that driver supports (13.0 for a CUDA 13.2 image
    under minor-version compatibility, so R580 nodes start it), and the driver itself when it is
    newer than that CUDA's first driver. Space separates alternatives, a comma joins (AND)."""
    cuda = driver_cuda(min_driver)
    if not cuda:
        return None
    if numeric(min_driver) > numeric(MIN_DRIVER[cuda]):
        return f"cuda>={cuda},driver>={min_driver}"
    return f"cuda>={cuda}"


def cudnn_version_str(value: int | None) -> str | None:
    """cuDNN's integer version: 9.x encodes M*10000+m*100+p (92600), 8.x M*1000+m*100+p (8902)."""
    if value is None:
        return None
    if value >= 10000:
        return f"{value // 10000}.{value % 10000 // 100}.{value % 100}"
    return f"{value // 1000}.{value % 1000 // 100}.{value % 100}"


def nccl_version_str(value: object) -> str | None:
    """`torch.cuda.nccl.version()`: a tuple on current torch, an int (2708, 21903) on old ones."""
    if value is None:
        return None
    if isinstance(value, (tuple, list)):
        return ".".join(str(int(v)) for v in value[:3])
    number = int(value)  # type: ignore[call-overload]
    if number >= 10000:
        return f"{number // 10000}.{number % 10000 // 100}.{number % 100}"
    return f"{number // 1000}.{number % 1000 // 100}.{number % 100}"


def _parse_arch(arch: str) -> tuple[str, int, int, str] | None:
    match = re.fullmatch(r"(sm|compute)_(\d+)(\d)([af]?)", arch)
    if not match:
        return None
    kind, major, minor, suffix = match.groups()
    return kind, int(major), int(minor), suffix


def arch_supported(capability: tuple[int, int], arch_list: list[str]) -> bool:
    """Whether a device of `capability` can run this torch build's kernels.

    A cubin `sm_XY` runs on the same major with minor ≥ Y (`sm_XYa`: exactly XY); PTX
    `compute_XY` is JIT-compiled for any device ≥ XY.
    """
    major, minor = capability
    for arch in arch_list:
        parsed = _parse_arch(arch)
        if parsed is None:
            continue
        kind, a_major, a_minor, suffix = parsed
        if kind == "compute" and (a_major, a_minor) <= (major, minor):
            return True
        if kind == "sm" and a_major == major:
            if suffix == "a" and a_minor == minor:
                return True
            if suffix != "a" and a_minor <= minor:
                return True
    return False


def cuda_arch_list(arch_flags: str | None) -> str:
    """`torch._C._cuda_getArchFlags()` ("sm_75 sm_90a compute_120") as a TORCH_CUDA_ARCH_LIST
    ("7.5;9.0a;12.0+PTX"): what extensions must be compiled for to run wherever torch runs.

    Read from the wheel rather than `torch.cuda.get_arch_list()`, which is empty without a GPU.
    """
    archs: list[str] = []
    ptx: set[str] = set()
    for flag in (arch_flags or "").split():
        parsed = _parse_arch(flag)
        if parsed is None:
            continue
        kind, major, minor, suffix = parsed
        name = f"{major}.{minor}{suffix}"
        if kind == "compute":
            ptx.add(name)
        if name not in archs:
            archs.append(name)
    return ";".join(a + ("+PTX" if a in ptx else "") for a in archs)


def one_arch(arch_list: str) -> str:
    """The first real architecture of a TORCH_CUDA_ARCH_LIST ("7.5;9.0a;12.0+PTX" → "7.5"):
    enough to prove that nvcc, the headers and torch's extension build work, at a fraction of
    the time of every architecture (the list itself is checked against the wheel apart)."""
    archs = [a for a in arch_list.split(";") if a]
    return next((a for a in archs if not a.endswith("+PTX")), archs[0].removesuffix("+PTX")
                if archs else "")


def dist_name(name: str) -> str:
    """A distribution name normalised as in the locks (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_mismatches(promised: dict[str, str], installed: dict[str, str]) -> list[str]:
    """One message per nvidia-* wheel whose installed version is not the lock's (or is missing,
    or is not in the lock at all)."""
    want = {dist_name(k): v for k, v in promised.items()}
    have = {dist_name(k): v for k, v in installed.items() if dist_name(k).startswith("nvidia-")}
    problems = []
    for name in sorted(want.keys() | have.keys()):
        if want.get(name) != have.get(name):
            problems.append(f"{name}: lock pins {want.get(name) or 'nothing'}, "
                            f"installed {have.get(name) or 'nothing'}")
    return problems


def runtime_matches_wheel(runtime: str | None, wheel: str | None) -> bool:
    """A library's runtime version (9.26.0) is its wheel's version (9.26.0.51) or a prefix of
    it, the comparison PyTorch's own release smoke test makes."""
    if runtime is None or wheel is None:
        return runtime == wheel
    return wheel == runtime or wheel.startswith(runtime + ".")
