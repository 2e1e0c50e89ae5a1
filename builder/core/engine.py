"""The Docker engine: one client path, clear errors, and the few calls the pipeline needs.

Builds go through the `docker` CLI with BuildKit (`DOCKER_BUILDKIT=1`), which works with a local
or a remote engine (`DOCKER_HOST`). Nothing else in the project calls `docker` directly.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from functools import cache
from io import BufferedReader
from pathlib import Path
from typing import Any

from builder.core import proc
from builder.core.errors import CommandFailed, EngineError

# Debian's docker.io client (20.10) runs BuildKit builds without buildx; a newer client without the
# buildx plugin cannot, so it is preferred when both are installed.
_PREFERRED_CLIENTS = ("/usr/bin/docker",)


@cache
def client() -> str:
    """Path of the docker client to use: $BUILDER_DOCKER, Debian's, then the one on PATH."""
    explicit = os.environ.get("BUILDER_DOCKER")
    if explicit:
        return proc.which(explicit)
    for path in _PREFERRED_CLIENTS:
        if os.access(path, os.X_OK):
            return path
    return proc.which("docker", hint="install Docker (apt-get install docker.io)")


def engine_address() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def docker(*args: str | os.PathLike[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run `docker ARGS` with BuildKit on; raises CommandFailed on a non-zero exit."""
    env = {"DOCKER_BUILDKIT": "1", **kwargs.pop("env", {})}
    return proc.run([client(), *args], env=env, **kwargs)


@cache
def ensure_engine() -> dict[str, Any]:
    """Fail with a clear message unless an engine answers; returns `docker info`."""
    try:
        result = docker("info", "--format", "{{json .}}", timeout=30)
    except CommandFailed as exc:
        raise EngineError(
            f"cannot reach the Docker engine at {engine_address()}: "
            "start dockerd or set DOCKER_HOST",
            hint=exc.hint,
        ) from None
    info = json.loads(result.stdout)
    if info.get("ServerErrors"):
        raise EngineError(
            f"cannot reach the Docker engine at {engine_address()}: "
            + "; ".join(info["ServerErrors"]),
            hint="start dockerd or set DOCKER_HOST",
        )
    return info


def ensure_disk(path: Path, need_gb: float) -> None:
    """Refuse to start work that needs `need_gb` GB when the disk holding `path` has less."""
    path.mkdir(parents=True, exist_ok=True)
    free_gb = shutil.disk_usage(path).free / 1e9
    if free_gb < need_gb:
        raise EngineError(
            f"only {free_gb:.1f} GB free on the disk holding {path}; "
            f"this needs about {need_gb:.0f} GB",
            hint="free space (docker image prune, docker builder prune) and run again",
        )


def inspect_image(ref: str) -> dict[str, Any] | None:
    """`docker image inspect` of a local image, or None when it is not there."""
    result = docker("image", "inspect", ref, check=False)
    if result.returncode != 0:
        return None
    return json.loads(result.stdout)[0]


def image_labels(ref: str) -> dict[str, str]:
    info = inspect_image(ref)
    if info is None:
        raise EngineError(f"no image `{ref}` in the engine", hint="build it first: builder build")
    return info["Config"].get("Labels") or {}


def run_container(name: str, run_args: Sequence[str], **kwargs: Any
                  ) -> subprocess.CompletedProcess[str]:
    """`docker RUN_ARGS` (a `run … --name NAME …` command line); on SIGINT/SIGTERM the container
    is killed and removed (`rm -f`: no stop grace period) before the client is stopped, so the
    tool exits within a second or two and no container outlives it (CI runners SIGKILL a few
    seconds after SIGTERM)."""
    return docker(*run_args, **kwargs,
                  on_interrupt=lambda: docker("rm", "-f", name, check=False, timeout=30))


def remove_image(ref: str) -> None:
    docker("image", "rm", "-f", ref, check=False)


def export(container_id: str) -> contextlib.AbstractContextManager[BufferedReader]:
    """`docker export` of a container: its filesystem as a tar byte stream (any engine address
    the CLI reaches: unix, tcp with TLS, ssh). Use as a context manager."""
    return proc.stream([client(), "export", container_id])


@contextlib.contextmanager
def container(image: str, cmd: Sequence[str] = (), *,
              create_args: Sequence[str] = ()) -> Iterator[str]:
    """A created (not started) container that is always removed; yields its id."""
    name = f"builder-{uuid.uuid4().hex[:12]}"
    docker("create", "--name", name, *create_args, image, *cmd)
    try:
        yield name
    finally:
        docker("rm", "-f", name, check=False)
