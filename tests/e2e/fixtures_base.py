"""The small Debian image engine tests build on, made by the project's own `builder base` code.

`minbase_image` bootstraps `torch-images-base:bookworm` (mmdebstrap --variant=minbase, then
`docker import`), or reuses it while its content key (suite, packages, day) holds, so a test
machine needs nothing prepared by hand. Import the fixture into a test module to use it
(`from fixtures_base import minbase_image`: pytest puts tests/e2e on sys.path).

A missing engine, mmdebstrap or Debian mirror skips the tests that need it; under CI=true it fails
them instead, so that CI cannot pass by skipping.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import run_wide
from helpers import missing

from builder.core.errors import BuilderError
from builder.model import bases
from builder.model.matrix import Base

MINBASE = Base(image="mmdebstrap:bookworm")


def ensure_minbase() -> str:
    """The minbase image's local ref, bootstrapped when absent or stale."""
    from builder.stages import base

    try:
        base.ensure(MINBASE)
    except BuilderError as exc:
        missing(f"cannot provide {bases.local_ref(MINBASE)}: {exc}")
    return bases.local_ref(MINBASE)


@pytest.fixture(scope="session")
def minbase_image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`torch-images-base:bookworm`, present in the engine (kept afterwards: it is a cache);
    bootstrapped by one xdist worker at a time (run_wide), not by both at once."""
    with run_wide.shared(tmp_path_factory, "minbase", lambda _, __: {"ref": ensure_minbase()}
                         ) as record:
        yield record["ref"]
