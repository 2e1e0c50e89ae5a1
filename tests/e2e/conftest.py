"""End-to-end fixtures: a real Docker engine, a real registry, the `builder` CLI.

Under CI (`CI=true`) a missing engine or fixture is a failure, never a skip: CI must not go
green by testing nothing. Elsewhere such tests skip with the reason. Collection never calls
docker: the engine is asked once, by the first test that needs it.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest
from helpers import free_port, missing

from builder.core import registry

DOCKER = "/usr/bin/docker"


@functools.cache
def engine_problem() -> str | None:
    docker = DOCKER if os.access(DOCKER, os.X_OK) else shutil.which("docker")
    if not docker:
        return "no docker client (tools/setup.sh installs docker.io)"
    result = subprocess.run([docker, "info"], capture_output=True, check=False, timeout=60)
    return None if result.returncode == 0 else "no Docker engine answers (tools/setup.sh starts it)"


@pytest.fixture(autouse=True)
def _engine(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("docker") and (problem := engine_problem()):
        missing(problem)


# What the tests name their images: registries on free loopback ports, private `e2e-…`
# repositories (helpers.private_matrix), and dangling images from rebuilds. Anything else, such
# as the user's own 127.0.0.1:5000 images or the cached bases, is never removed.
TEST_MADE = re.compile(r"<none>:<none>$|127\.0\.0\.1:(?!5000/)\d+/|[^/]*/?e2e-[0-9a-f]{8}-")


def local_images() -> dict[str, list[str]]:
    """Image id → its `repository:tag` references (`<none>:<none>` for a dangling one)."""
    listing = subprocess.run([DOCKER, "images", "--no-trunc", "--format",
                              "{{.ID}} {{.Repository}}:{{.Tag}}"],
                             capture_output=True, text=True, check=True, timeout=120).stdout
    images: dict[str, list[str]] = {}
    for line in listing.splitlines():
        image_id, ref = line.split(" ", 1)
        images.setdefault(image_id, []).append(ref)
    return images


@pytest.fixture(scope="module", autouse=True)
def _remove_images_made_by_the_module() -> Iterator[None]:
    """Remove the images a test module made (TEST_MADE), so that the suite's disk use stays
    that of one module: a run without CUDA still builds dozens of 1 GB images."""
    if engine_problem():
        yield
        return
    before = set(local_images())
    yield
    for image_id, refs in local_images().items():
        if image_id not in before and all(TEST_MADE.match(ref) for ref in refs):
            subprocess.run([DOCKER, "image", "rm", "-f", image_id], capture_output=True,
                           check=False, timeout=300)


@pytest.fixture(scope="session")
def registry_addr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real registry (Debian's docker-registry) on a free port for the session."""
    folder = tmp_path_factory.mktemp("registry")
    addr = f"127.0.0.1:{free_port()}"
    registry.start(addr, folder)
    yield addr
    registry.stop(folder)
