"""The Debian security source of `builder rebuild --check`, asked inside a real image."""

from __future__ import annotations

import pytest
from fixtures_base import minbase_image  # noqa: F401  (a fixture: bootstraps the image it needs)

from builder.flows import rebuild_check


@pytest.mark.docker
def test_debian_source_on_a_real_image(minbase_image: str) -> None:  # noqa: F811
    """apt inside a real image answers a dict of name → (old, new), or an error: never a silent
    clean when the mirror is unreachable (apt-get update --error-on=any)."""
    try:
        found = rebuild_check.debian_upgradable(minbase_image)
    except rebuild_check.SourceError as exc:
        assert "apt" in str(exc)
        return
    assert all(isinstance(old, str) and isinstance(new, str) for old, new in found.values())
