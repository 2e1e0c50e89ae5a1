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
import socket
import subprocess
from collections.abc import Iterator

import pytest
from fixtures_published import shared_publication  # noqa: F401  (one per session: here, not in modules)
from helpers import PRIVATE_REPOSITORIES, free_port, missing
from keyless_mock import mock  # noqa: F401  (the mock sigstore services: here, not in modules)

from builder.core import engine, registry

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


LOOPBACK_REGISTRY = re.compile(r"127\.0\.0\.1:(\d+)/")


def answers(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


def made_by_this_session(ref: str) -> bool:
    """An image of a private repository of this session (helpers.private_matrix), or of a
    loopback test registry that no longer answers (a module's registry, stopped). Never the
    user's 127.0.0.1:5000, a cached base, or another session's running registry."""
    repository = ref.rsplit(":", 1)[0].rsplit("/", 1)[-1]
    if repository.startswith(tuple(PRIVATE_REPOSITORIES)):  # its -staging and -base too
        return True
    loopback = LOOPBACK_REGISTRY.match(ref)
    return bool(loopback) and loopback[1] != "5000" and not answers(int(loopback[1]))


def local_images() -> dict[str, list[str]]:
    """Image id → its `repository:tag` references (none for a dangling image)."""
    listing = subprocess.run([DOCKER, "images", "--no-trunc", "--format",
                              "{{.ID}} {{.Repository}}:{{.Tag}}"],
                             capture_output=True, text=True, check=True, timeout=120).stdout
    images: dict[str, list[str]] = {}
    for line in listing.splitlines():
        image_id, ref = line.split(" ", 1)
        images.setdefault(image_id, [])
        if ref != "<none>:<none>":
            images[image_id].append(ref)
    return images


@pytest.fixture(scope="module", autouse=True)
def _remove_images_made_by_the_module() -> Iterator[None]:
    """Remove the images a test module made, so that the suite's disk use stays that of one
    module (a run without CUDA still builds dozens of 1 GB images): new images whose every
    reference is this session's (made_by_this_session), and new dangling ones."""
    if engine_problem():
        yield
        return
    before = set(local_images())
    yield
    for image_id, refs in local_images().items():
        if image_id not in before and all(made_by_this_session(ref) for ref in refs):
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


@pytest.fixture
def made() -> Iterator[list[str]]:
    """The image references a test made (append to it): removed after the test."""
    refs: list[str] = []
    yield refs
    for ref in refs:
        engine.remove_image(ref)
