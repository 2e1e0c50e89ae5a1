"""A staged image, as a record: an image in a registry by digest, with its image id. Here so
that the staging and publish steps and their flows share it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a record: no registry client at run time
    from builder.core.oci import Descriptor


@dataclass(frozen=True)
class Staged:
    """An image in a registry, by digest, with its image id (the config digest)."""

    registry: str
    repository: str
    descriptor: Descriptor
    image_id: str

    @property
    def digest(self) -> str:
        return self.descriptor.digest

    @property
    def reference(self) -> str:
        return f"{self.registry}/{self.repository}@{self.digest}"
