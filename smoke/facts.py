"""The image's promised facts: /opt/torch-images/image.json, or locks/<variant>.json outside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DEFAULT_FACTS = Path("/opt/torch-images/image.json")


def load_facts(path: Path) -> dict[str, Any]:
    """Read a facts file; a lock's JSON may nest them under `facts`. Unknown keys are kept."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    if isinstance(data.get("facts"), dict):
        data = {**data["facts"]}
    return normalize(data)


def normalize(data: dict[str, Any]) -> dict[str, Any]:
    """Accept label-style keys (`min-driver`) and a comma-separated `dropped`."""
    out = {key.replace("-", "_"): value for key, value in data.items()}
    dropped = out.get("dropped")
    if isinstance(dropped, str):
        out["dropped"] = [d.strip() for d in dropped.split(",") if d.strip()]
    for key in ("cuda", "cudnn", "nccl", "triton", "min_driver"):
        if out.get(key) == "":
            out[key] = None  # labels write "" for "none"
    return out


def dropped(facts: dict[str, Any] | None) -> list[str]:
    return list((facts or {}).get("dropped") or [])
