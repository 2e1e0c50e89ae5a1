"""What `builder render` makes of one variant, as a record: the Dockerfile, its ignore file, the
install steps and the files of its build context. Here so that plan and build read it without
importing the render step (and a planned variant can carry it)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from builder.model.lockfile import Lock
from builder.model.matrix import Variant

# The smoke package on the host: copied into every build context and hashed into the plan.
SMOKE_SOURCE = Path(__file__).resolve().parents[2] / "smoke"


@dataclass(frozen=True, kw_only=True)
class Step:
    """One install RUN: a part of the lock, installed with uv from the shared wheel cache."""

    name: str
    requirements: str  # the lines of the lock this step installs
    find_links: tuple[str, ...] = ()  # the variant's `find_links`: their wheels go in the set
    target: str = ""  # the site directory it installs into (the venv's, or NVIDIA_SITE)
    prune: str = ""  # a find expression of what to delete right after installing
    restore: str = ""  # a find expression of what to copy back in from the wheels (only that)
    # The platform's lock suffix ("" on linux/amd64, which keeps its set ids): a lock's hashes
    # cover every platform's wheels, so the same lines need another set of wheels per platform.
    platform: str = ""

    @property
    def set_id(self) -> str:
        # "uv": sets of the pip-era layout held the wheels themselves; never reuse one of those
        key = "\0".join(("uv", self.requirements, *self.find_links)) + self.platform
        return hashlib.sha256(key.encode()).hexdigest()[:20]

    @property
    def source(self) -> str:
        return f"sets/{self.set_id}"


@dataclass(frozen=True, kw_only=True)
class Rendered:
    """One variant's Dockerfile and build context, as `builder render` writes them to DIR/<key>/."""

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
