"""One published CPU runtime for the whole session, which the modules that read a publication
share (issue 39: building, smoking, SBOM-ing, staging and publishing it again in each module was
most of the e2e suite's time).

`shared_publication` makes a `builder keygen` key pair, then `builder build --stage --key` and
`builder publish --key` of the CPU runtime into the session registry (conftest's
`registry_addr`), under a repository of its own, with its zstd twin and an alias, exactly as a
user does; it returns a frozen record of what was published. Once per run: under xdist the
first worker that asks makes it and the other reads its record (tests/run_wide.py). conftest.py
imports it, so that a test asks for it by name: a module that imported it too would get a copy
of its own, built again.

Read it, never change it: a module that forges does so in a registry of its own
(`own_registry`), which it fills cheaply: a signature binds `registry/repository`, and the
repository name is in the image (its title label, hence its content hash and image id), so the
copy keeps the repository name and moves the registry. `republish` publishes the shared staged
image there (nothing built; blobs copied registry to registry); `restage` also stages it there,
for a module that forges its staging: the build is the build cache's and the smoke report and
SBOM the shared state folder's (evidence by image id), so only the push is paid again.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import run_wide
import yaml
from helpers import cosign_env, cpu_alias_matrix, free_port, remove_images_at, run_builder

from builder.core import registry

CPU = "2.13.0-py3.11-cpu-runtime"
SLIM = "2.13.0-py3.11-cpu-slim"  # a prefix of CPU's layers: built from the build cache
ALIAS = "latest-cpu-runtime"
PASSWORD = "correct horse"


@dataclass(frozen=True, kw_only=True)
class Publication:
    """A published CPU runtime, as `builder publish --manifest` recorded it."""

    addr: str  # the registry
    matrix: Path  # its matrix (registry moved to `addr`, amd64 only, the alias)
    repository: str  # the vetted repository; staging is `staging`
    staging: str  # the staging repository (`republish`: still the shared registry's)
    key: Path  # cosign.key of `builder keygen` (password PASSWORD)
    pub: Path  # cosign.pub
    env: dict[str, str]  # the environment to run `builder` with (password, state folder)
    state: Path  # BUILDER_STATE of the build (its smoke report and SBOM by image id)
    built: dict[str, Any]  # `build --json`'s outcome (local image, image id, smoke, SBOM…)
    staged: str  # the staged digest
    record: dict[str, Any]  # the publication in published.json (tags, twin, reference…)

    @property
    def image(self) -> str:
        """The local image the build made (kept until the session ends)."""
        return self.built["image"]

    @property
    def digest(self) -> str:
        return self.record["digest"]

    @property
    def reference(self) -> str:
        return self.record["reference"]

    @property
    def tags(self) -> list[str]:
        return self.record["tags"]

    @property
    def twin(self) -> str:
        """The zstd twin's digest ("" when the matrix asks for gzip only)."""
        return self.record.get("zstd", {}).get("digest", "")


def publish(matrix: Path, key: Path, env: dict[str, str], out: Path, vid: str = CPU
            ) -> dict[str, Any]:
    """`builder publish --key` of variant `vid` (the CPU runtime); its publication from `out`
    (published.json)."""
    run_builder("publish", "--select", f"id={vid}", "--key", str(key), "--manifest", str(out),
                matrix=matrix, env=env)
    [pub] = json.loads(out.read_text())["variants"][vid]["publications"]
    assert pub["signed"] is True and pub["unsigned"] is False, pub
    return pub


@pytest.fixture(scope="session")
def shared_publication(registry_addr: str, tmp_path_factory: pytest.TempPathFactory
                       ) -> Iterator[Publication]:
    """The run's CPU runtime: built, staged with signed evidence, published and signed (with
    its zstd twin and ALIAS), once for all xdist workers (run_wide). Its local images outlive
    every module (conftest removes only a module's own images) and are removed at the run's
    end."""
    with run_wide.shared(tmp_path_factory, "published",
                         lambda tmp, undo: publish_shared(registry_addr, tmp, undo)) as record:
        paths = {name: Path(record[name]) for name in PATHS}
        yield Publication(**(record | paths), env=publication_env(paths["state"]))


PATHS = ("matrix", "key", "pub", "state")  # Publication's paths (strings in run_wide's record)


def publication_env(state: Path) -> dict[str, str]:
    """The environment to run `builder` with for the shared publication (this process's)."""
    return {**cosign_env(PASSWORD), "BUILDER_STATE": str(state)}


def publish_shared(addr: str, tmp: Path, undo: list[run_wide.Undo]) -> dict[str, Any]:
    """`builder keygen`, `build --stage --key` and `publish --key` of the CPU runtime into `tmp`
    and the registry at `addr`; Publication's fields as JSON (its env is made again)."""
    repository = f"e2e-shared-{uuid.uuid4().hex[:8]}-torch"
    matrix = cpu_alias_matrix(tmp, addr, ALIAS, repository=repository)
    env = publication_env(tmp / "state")
    undo.append({"images": f"{addr}/{repository}*"})  # the local images, its staging's too
    run_builder("keygen", "--out", str(tmp), env=env)
    outcomes = json.loads(run_builder("build", "--select", f"id={CPU}", "--stage", "--key",
                                      str(tmp / "cosign.key"), "--json", matrix=matrix,
                                      env=env).stdout)
    [built] = outcomes
    staged_ref = built["message"]
    staging = f"{repository}-staging"
    assert re.fullmatch(rf"{addr}/{staging}@sha256:[0-9a-f]{{64}}", staged_ref)
    record = publish(matrix, tmp / "cosign.key", env, tmp / "published.json")
    assert record["digest"] == staged_ref.rsplit("@", 1)[1]
    return {"addr": addr, "matrix": str(matrix), "repository": repository, "staging": staging,
            "key": str(tmp / "cosign.key"), "pub": str(tmp / "cosign.pub"),
            "state": str(tmp / "state"), "built": built, "staged": record["digest"],
            "record": record}


@contextlib.contextmanager
def own_registry(folder: Path) -> Iterator[str]:
    """A registry of the caller's own on a free port (its storage in `folder`); stopped, and
    the local names of its images removed, afterwards."""
    addr = f"127.0.0.1:{free_port()}"
    registry.start(addr, folder / "registry")
    try:
        yield addr
    finally:
        registry.stop(folder / "registry")
        remove_images_at(addr)


def moved_matrix(shared: Publication, folder: Path, addr: str, **changes: object) -> Path:
    """The shared matrix with its registry moved to `addr` (and `changes`), in `folder`."""
    data = yaml.safe_load(shared.matrix.read_text()) | {"registry": addr, **changes}
    matrix = folder / "matrix.yaml"
    matrix.write_text(yaml.safe_dump(data, sort_keys=False))
    return matrix


def republish(shared: Publication, folder: Path, addr: str, **changes: object) -> Publication:
    """The shared staged image published and signed by the same key into the registry at
    `addr` (matrix `changes` applied, e.g. `compression: [gzip]`); staging stays the shared one,
    which is only read."""
    staging = f"{shared.addr}/{shared.staging}"
    matrix = moved_matrix(shared, folder, addr, staging=staging, **changes)
    record = publish(matrix, shared.key, shared.env, folder / "published.json")
    assert record["digest"] == shared.staged
    return replace(shared, addr=addr, matrix=matrix, record=record)


def restage(shared: Publication, folder: Path, addr: str, **changes: object) -> Publication:
    """The shared image built (the build cache's: the same image id), staged with signed
    evidence (the shared state's smoke report and SBOM, by image id) and published by the same
    key into the registry at `addr`: its staging too is the caller's to forge in."""
    matrix = moved_matrix(shared, folder, addr, **changes)
    [built] = json.loads(run_builder("build", "--select", f"id={CPU}", "--stage", "--key",
                                     str(shared.key), "--json", matrix=matrix,
                                     env=shared.env).stdout)
    assert built["image_id"] == shared.built["image_id"], (built, shared.built)
    assert built["reused"] == ["smoke", "sbom"], built
    staged = built["message"].rsplit("@", 1)[1]
    record = publish(matrix, shared.key, shared.env, folder / "published.json")
    assert record["digest"] == staged
    return replace(shared, addr=addr, matrix=matrix, built=built, staged=staged, record=record)


def publish_slim(shared: Publication, folder: Path, addr: str, env: dict[str, str],
                 **changes: object) -> tuple[Path, dict[str, Any]]:
    """The CPU slim built (its steps the runtime's, from the build cache; its own smoke test
    and SBOM), staged with signed evidence in a staging of its own (`own_staging`) and published
    by the session's key into the registry at `addr`, under the shared repository name, as its
    pipeline would. Its local images are removed afterwards (the registry holds it): a `plan`
    then asks the registry. Returns its matrix (in `folder`) and its publication."""
    folder.mkdir()
    image = f"{addr}/{shared.repository}:{SLIM}"
    try:
        with own_staging(shared, "slim") as staging:
            matrix = moved_matrix(shared, folder, addr, staging=staging, **changes)
            run_builder("build", "--select", f"id={SLIM}", "--stage", "--key", str(shared.key),
                        matrix=matrix, env=env)
            return matrix, publish(matrix, shared.key, env, folder / "published.json", SLIM)
    finally:
        run_wide.remove_named(image)


def evidence_state(shared: Publication, folder: Path) -> Path:
    """A state folder `folder` holding what the session's build left by image id (its smoke
    report, SBOM and build times): a runner that built that image id before, for a module
    whose proof starts after the smoke test (a rebuild from the build cache reuses them)."""
    for part in ("reports", "sbom", "builds"):
        shutil.copytree(shared.state / part, folder / part)
    return folder


def lend_evidence(shared: Publication, state: Path, image: str, image_id: str) -> None:
    """The session image's smoke report (made out to `image`, `image_id`) and SBOM, where the
    state folder `state` keeps evidence by image id: for a module whose proof is not the smoke
    test (`reproduce`, the build cache) and whose image differs from the session's only in what
    neither looks at (a label, a file of its own), so that its build reuses them instead of
    smoking a CPU torch again. Publish's gate on them is test_publish's proof."""
    hex_id, shared_hex = (i.removeprefix("sha256:") for i in (image_id, shared.built["image_id"]))
    report = json.loads((shared.state / "reports" / f"{shared_hex}.json").read_text())
    report["image"] = {"ref": image, "id": image_id, "digest": None}
    for part in ("reports", "sbom"):
        (state / part).mkdir(parents=True, exist_ok=True)
    (state / "reports" / f"{hex_id}.json").write_text(json.dumps(report))
    shutil.copy(shared.state / "sbom" / f"{shared_hex}.cdx.json",
                state / "sbom" / f"{hex_id}.cdx.json")


@contextlib.contextmanager
def own_staging(shared: Publication, name: str) -> Iterator[str]:
    """`registry/repository` of a staging repository of the caller's own in the session's
    registry (a matrix's `staging`): `docker push` there mounts the layers the session's staging
    holds instead of compressing them again, as a push to another registry must. Its local
    names (the kept cache image) removed afterwards."""
    ref = f"{shared.addr}/e2e-{name}-{uuid.uuid4().hex[:8]}-staging"
    try:
        yield ref
    finally:
        run_wide.remove_named(ref)
