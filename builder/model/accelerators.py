"""The accelerator table (`cpu`, `cuda`): whether an image of that accelerator needs GPU
evidence before it is published or verified.

Every gate (the publish gate, the smoke report's pass rule, `verify`, the catalog's verdict)
reads this row instead of testing a name, and a name not in the table fails closed: it needs
GPU evidence, so a new accelerator added to the schema cannot publish an image that never ran
on its device without the CPU waiver being recorded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Accelerator:
    name: str
    # its smoke report must show the GPU checks passing on a GPU (or the CPU waiver, recorded)
    gpu_evidence: bool


KNOWN: Mapping[str, Accelerator] = {a.name: a for a in (
    Accelerator("cpu", gpu_evidence=False),
    Accelerator("cuda", gpu_evidence=True),
)}


def get(name: str | None) -> Accelerator:
    """The row for `name`; an unknown (or missing) name gets the strictest row: GPU evidence
    required."""
    return KNOWN.get(name or "") or Accelerator(str(name), gpu_evidence=True)


def needs_gpu_evidence(name: str | None) -> bool:
    return get(name).gpu_evidence
