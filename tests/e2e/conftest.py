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
from dataclasses import dataclass
from pathlib import Path

import pytest
import run_wide
from fixtures_published import shared_publication  # noqa: F401  (one per session: here, not in modules)
from helpers import PORTS, PRIVATE_REPOSITORIES, free_port, missing
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


@dataclass(frozen=True)
class Made:
    """What one module of this process made: its private repositories (helpers.private_matrix)
    and the ports of its own registries (helpers.free_port). Under xdist the other worker's
    module runs meanwhile, so "new since the module began" is no longer "this module's"."""

    repositories: frozenset[str]
    ports: frozenset[int]

    def named(self, ref: str) -> bool:
        """A reference of a private repository of the module (its -staging and -base too), or
        of a registry of the module's that no longer answers (stopped). Never the user's
        127.0.0.1:5000, a cached base, the run's shared registry or another worker's."""
        repository = ref.rsplit(":", 1)[0].rsplit("/", 1)[-1]
        if repository.startswith(tuple(self.repositories)):
            return True
        loopback = LOOPBACK_REGISTRY.match(ref)
        return bool(loopback) and int(loopback[1]) in self.ports and not answers(int(loopback[1]))

    def unnamed(self, image_id: str) -> bool:
        """A dangling image of the module's: built for one of its private repositories (a tag
        moved to a newer build). Others' dangling images are theirs to remove."""
        return run_wide.built_for(image_id, self.repositories)


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
    module per worker (a run without CUDA still builds dozens of 1 GB images): the module's
    references (Made.named) and its new dangling images (Made.unnamed)."""
    if engine_problem():
        yield
        return
    before = set(local_images())
    repositories, ports = set(PRIVATE_REPOSITORIES), set(PORTS)
    yield
    made = Made(repositories=frozenset(PRIVATE_REPOSITORIES - repositories),
                ports=frozenset(PORTS - ports))
    for image_id, refs in local_images().items():
        mine = [ref for ref in refs if made.named(ref)]
        if refs and mine == refs:
            engine.remove_image(image_id)  # by id: a `repo:<none>` name (pulled by digest) too
        elif mine:
            for ref in mine:  # another's name keeps the image
                engine.remove_image(ref)
        elif not refs and image_id not in before and made.unnamed(image_id):
            engine.remove_image(image_id)


@pytest.fixture(scope="session", autouse=True)
def _twin_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One zstd twin cache (builder.core.twin_cache) for the session's `builder` runs, never
    the user's: a publish of layers an earlier module twinned copies them instead of
    recompressing. One folder for the run, both workers' (the cache takes concurrent writers:
    an entry is written whole, then renamed). A test that must recompress names a folder of its
    own."""
    root = tmp_path_factory.getbasetemp()
    folder = (root.parent if run_wide.worker() else root) / "twin-cache"
    folder.mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("BUILDER_TWIN_CACHE", str(folder))
        yield


@pytest.fixture(scope="session")
def registry_addr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One real registry (Debian's docker-registry) on a free port for the run, shared by the
    xdist workers (run_wide: started by the first that asks, stopped after the last)."""

    def start(folder: Path, undo: list[run_wide.Undo]) -> dict[str, str]:
        addr = f"127.0.0.1:{free_port()}"
        undo.append({"registry": str(folder)})
        registry.start(addr, folder)
        return {"addr": addr}

    with run_wide.shared(tmp_path_factory, "registry", start) as record:
        yield record["addr"]


@pytest.fixture
def made() -> Iterator[list[str]]:
    """The image references a test made (append to it): removed after the test."""
    refs: list[str] = []
    yield refs
    for ref in refs:
        engine.remove_image(ref)
