"""Pure version helpers (no torch): driver minimums, CUDA arch compatibility, version formats."""

from __future__ import annotations

import re

# Minimum drivers from NVIDIA's CUDA release notes; used only when the facts lack `min_driver`.
_MIN_DRIVER = {
    "11.8": "520.61.05",
    "12.0": "525.60.13",
    "12.4": "550.54.14",
    "12.6": "560.28.03",
    "12.8": "570.26",
    "12.9": "575.51.03",
    "13.0": "580.65.06",
}
# Minor-version compatibility floors per CUDA major.
_MAJOR_FLOOR = {"11": "450.80.02", "12": "525.60.13", "13": "580.65.06"}


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
    return _MIN_DRIVER.get(key) or _MAJOR_FLOOR.get(key.split(".")[0])


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
