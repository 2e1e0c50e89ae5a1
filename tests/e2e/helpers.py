"""Helpers the end-to-end tests share (imported as `helpers`: pytest puts tests/e2e on sys.path)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import run_wide
import transcript

from builder.core import oci

ROOT = Path(__file__).resolve().parents[2]


def missing(reason: str) -> None:
    """Fail under CI, skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: required)", pytrace=False)
    pytest.skip(reason)


# The loopback ports this process handed out (for its modules' registries): conftest removes
# the images of a module's own registries once they are stopped, never another worker's.
PORTS: set[int] = set()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        PORTS.add(s.getsockname()[1])
        return s.getsockname()[1]


def run_builder(*args: str, matrix: Path | None = None, env: dict[str, str] | None = None,
                check: bool = True) -> subprocess.CompletedProcess[str]:
    """`python -m builder COMMAND [--matrix FILE] ARGS` as a user runs it, from the checkout;
    on an unexpected exit the test fails with the command's output. With BUILDER_TRANSCRIPT
    set, the command and its output are appended to that file (tests/transcript.py)."""
    argv = [*args[:1], "--matrix", str(matrix), *args[1:]] if matrix else list(args)
    with run_wide.the_base(exclusive=False):  # not while the other worker holds it aside
        result = subprocess.run([sys.executable, "-m", "builder", *argv], cwd=ROOT, env=env,
                                capture_output=True, text=True, check=False, timeout=3600)
    transcript.append(argv, result.returncode, result.stdout, result.stderr)
    if check and result.returncode != 0:
        pytest.fail(f"builder {' '.join(argv)} exited {result.returncode}:\n"
                    f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}", pytrace=False)
    return result


# The private repositories this process made (helpers.private_matrix): conftest removes their
# images after the module that made them; another worker's or session's are never touched.
PRIVATE_REPOSITORIES: set[str] = set()


def private_matrix(folder: Path, source: Path = ROOT / "matrix.yaml", **changes: object) -> Path:
    """The shipped matrix (or `source`) under a repository name of its own (plus `changes`), in
    `folder`: images a test builds never take the names of the user's images (`nox -s build`
    would call them up to date), nor of the session's publication. Remove them with
    `remove_images_of`."""
    import yaml

    data = yaml.safe_load(source.read_text())
    data |= {"repository": f"e2e-{uuid.uuid4().hex[:8]}-torch", **changes}
    PRIVATE_REPOSITORIES.add(data["repository"])
    path = folder / "matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def remove_images_of(matrix_path: Path) -> None:
    """Remove every local image of that matrix: `<registry>/<repository>*` (its staging and
    base repositories and their cache tags too)."""
    import yaml

    data = yaml.safe_load(matrix_path.read_text())
    run_wide.remove_images(f"{data['registry']}/{data['repository']}*")


def amd64_matrix(folder: Path, addr: str) -> Path:
    """The shipped matrix with its registry moved to `addr`, linux/amd64 only (the emulated
    arm64 build, ~30 min, is the bench's: python -m bench arm64); returns its path."""
    import yaml

    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["registry"] = addr
    data.setdefault("exclude", []).append({"platform": "linux/arm64"})
    path = folder / "matrix.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def cpu_alias_matrix(folder: Path, addr: str, alias: str, **changes: object) -> Path:
    """amd64_matrix with an alias for the CPU runtime (a tag to verify by) and `changes`."""
    import yaml

    path = amd64_matrix(folder, addr)
    data = yaml.safe_load(path.read_text())
    data["aliases"].append({"tag": alias, "torch": "2.13.0+cpu", "flavor": "runtime"})
    path.write_text(yaml.safe_dump(data | changes, sort_keys=False))
    return path


def remove_images_at(addr: str) -> None:
    """Remove every local image named after the registry at `addr` (a module's own)."""
    run_wide.remove_named(f"{addr}/*")


def smoke_with_fake_docker(tmp_path: Path, script: str, log: Path) -> subprocess.Popen[str]:
    """`builder smoke img:tag` with `script` as its docker (BUILDER_DOCKER), returned once the
    fake `docker run` wrote `started` into `log` (so a signal then reaches a running child)."""
    import time

    docker = tmp_path / "docker"
    docker.write_text(script)
    docker.chmod(0o755)
    env = {**os.environ, "BUILDER_DOCKER": str(docker), "BUILDER_STATE": str(tmp_path / "state"),
           "PATH": "/usr/bin:/bin"}
    tool = subprocess.Popen([sys.executable, "-m", "builder", "smoke", "img:tag"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (log.exists() and "started" in log.read_text()):
        assert time.monotonic() < deadline and tool.poll() is None, tool.communicate()
        time.sleep(0.05)
    return tool


@contextlib.contextmanager
def base_removed(suite: str = "bookworm") -> Iterator[None]:
    """The slim base's names removed (a fresh runner's engine), the image held under another tag
    (other tests on this engine may be building FROM it); its names put back afterwards
    whatever the code inside did. The other xdist worker's `builder` commands wait meanwhile."""
    from builder.core import engine
    from builder.model.bases import bootstrap_ref
    from builder.stages import base

    ref, keyed = bootstrap_ref(suite), base.keyed_ref(suite)
    hold = f"e2e-hold-{uuid.uuid4().hex[:8]}:base"
    with run_wide.the_base(exclusive=True):  # the other xdist worker's commands wait
        engine.docker("tag", ref, hold)
        for name in (keyed, ref):
            engine.docker("image", "rm", name, check=False)
        try:
            yield
        finally:
            if not base.have_bootstrapped(suite):
                engine.docker("tag", hold, ref)
                engine.docker("tag", hold, keyed)
            engine.docker("image", "rm", hold, check=False)


def cosign_env(password: str) -> dict[str, str]:
    """This process's environment for `builder` with keys from `builder keygen`: the password
    given, no COSIGN_PRIVATE_KEY of the user's."""
    environ = {**os.environ, "COSIGN_PASSWORD": password}
    environ.pop("COSIGN_PRIVATE_KEY", None)
    return environ


# ---- forging registry content, as anyone with push rights could ------------------------------


class Saved:
    """Manifests put back after a forgery (by tag), so each test starts from the real thing."""

    def __init__(self, addr: str) -> None:
        self.reg = oci.Registry(addr)
        self.kept: list[tuple[str, str, bytes | None, str]] = []

    def keep(self, repository: str, tag: str) -> None:
        found = self.reg.manifest(repository, tag)
        self.kept.append((repository, tag, found[0] if found else None,
                          found[1].media_type if found else ""))

    def restore(self) -> None:
        for repository, tag, body, media_type in reversed(self.kept):
            if body is not None:
                self.reg.put_manifest(repository, tag, body, media_type)


def fake_image(reg: oci.Registry, repository: str, labels: dict[str, str]) -> str:
    """A tiny image (one small layer) wearing `labels`, pushed by digest; returns its digest
    (a new one each time)."""
    layer = reg.push_blob(repository, b"not torch")
    config = json.dumps({"architecture": "amd64", "os": "linux", "created": uuid.uuid4().hex,
                         "config": {"Labels": labels},
                         "rootfs": {"type": "layers", "diff_ids": [layer]}}).encode()
    manifest = {"schemaVersion": 2, "mediaType": oci.OCI_MANIFEST,
                "config": {"mediaType": oci.OCI_CONFIG, "size": len(config),
                           "digest": reg.push_blob(repository, config)},
                "layers": [{"mediaType": oci.OCI_LAYER_GZIP, "size": 9, "digest": layer}]}
    body = json.dumps(manifest).encode()
    return reg.put_manifest(repository, oci.sha256(body), body, oci.OCI_MANIFEST)


def real_labels(reg: oci.Registry, repository: str, digest: str) -> dict[str, str]:
    body, _ = reg.manifest(repository, digest)
    config = json.loads(reg.blob(repository, json.loads(body)["config"]["digest"]))
    return config["config"]["Labels"]
