"""The Debian security source of `builder rebuild --check`, asked inside a real image."""

from __future__ import annotations

import pytest

from builder.flows import rebuild


@pytest.mark.docker
def test_debian_source_on_a_real_image() -> None:
    """apt inside a real image answers a dict of name → (old, new), or an error: never a silent
    clean when the mirror is unreachable (apt-get update --error-on=any)."""
    from builder.core import engine

    image = "torch-images-base:bookworm"
    if engine.inspect_image(image) is None:
        pytest.skip(f"no {image} (run builder build once)")
    try:
        found = rebuild.debian_upgradable(image)
    except rebuild.SourceError as exc:
        assert "apt" in str(exc)
        return
    assert all(isinstance(old, str) and isinstance(new, str) for old, new in found.values())
