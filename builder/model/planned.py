"""A planned variant, as a record: what `builder plan` decided for one rendered variant (its
tags, content hash and state). Here so that the build and publish steps and their flows read it
without importing the plan step."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from builder.model import tags
from builder.model.matrix import Matrix, Variant
from builder.model.rendered import Rendered


@dataclass(frozen=True, kw_only=True)
class PlannedVariant:
    variant: Variant
    rendered: Rendered
    content_hash: str
    lock_hash: str
    base_digest: str | None
    tags: tuple[str, ...]
    local_image: str  # the engine's name for the built image: <image_name>:<local_tag>
    state: str = "build"  # "build" | "up-to-date" | "unknown" (plan --offline)
    where: str = ""  # "local" | "registry" when up-to-date

    @property
    def floating_tag(self) -> str:
        return self.tags[0]

    @property
    def local_tag(self) -> str:
        """The engine's tag for this platform's image (see stages.plan.plan_variant)."""
        return self.local_image.rpartition(":")[2]

    @property
    def hash_tag(self) -> str:
        return tags.HASH_TAG_PREFIX + self.content_hash[:20]

    def as_json(self, matrix: Matrix) -> dict[str, Any]:
        v = self.variant
        return {
            "id": v.id, "key": v.key, "platform": v.platform, "torch": v.torch,
            "python": v.python, "accelerator": v.accelerator,
            "flavor": v.flavor, "default": v.default, "tags": list(self.tags),
            "image": self.local_image,
            "content_hash": self.content_hash, "lock_hash": self.lock_hash,
            "base": v.base.image, "base_digest": self.base_digest, "state": self.state,
            "where": self.where, "facts": self.rendered.facts,
        }
