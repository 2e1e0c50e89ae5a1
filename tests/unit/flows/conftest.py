"""Fixtures the flow tests share."""

from __future__ import annotations

import pytest
from memregistry import MemoryRegistry

from builder.core import oci


@pytest.fixture
def reg(monkeypatch: pytest.MonkeyPatch) -> MemoryRegistry:
    """An in-memory registry that every `oci.Registry(...)` of the flows under test gets (a
    module that defines its own `reg` keeps it)."""
    reg = MemoryRegistry()
    monkeypatch.setattr(oci, "Registry", lambda _addr: reg)
    return reg
