"""`builder reproduce` for real: the session's published CPU runtime (fixtures_published) rebuilt
from its provenance with no layer cache, on an engine of the module's own, is the same image. A
planted non-determinism (a test-only template that writes the build's time into a file) makes it
exit 1 and name that file.

Forgetting prunes BuildKit's layer records (`--filter type=regular`), so the module runs on an
engine of its own (private_engine: a second dockerd, its own data root and bridge, removed
afterwards) with the shared engine's bootstrapped base loaded into it: the shared build cache
stays whole under every other test, in any order. One build there warms that engine's cache
mounts first, as the shared engine's are (an image published from the first build on a
brand-new engine did not reproduce bit for bit); its layer records are what forgetting prunes.

The planted image is built and published on the shared engine (every step before the planted
one is the session image's, cached there), so the private engine never ran the planted step: its
rebuild takes the other steps from the first test's rebuild (or the warm build), runs the
planted one afresh, and that layer alone differs. Its smoke report and SBOM, which publish's gate
asks for (test_publish proves that gate) and `reproduce` never reads, are the session image's
made out to the planted image's id: the planted step adds one file the smoke suite and the SBOM
do not look at, and smoking a CPU torch again was most of this module's time. Needs the worktree committed, and unchanged
while the run lasts: the session's image is labelled dirty when built from a tree that differs
from its commit, and the rebuild checks out that commit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures_published import Publication, lend_evidence
from helpers import amd64_matrix, free_port, private_matrix, run_builder
from private_engine import private_engine

from builder.core import engine, registry

pytestmark = pytest.mark.docker

CPU = "2.13.0-py3.11-cpu-runtime"
ROOT = Path(__file__).resolve().parents[2]
PLANTED = "/home/user/built-at"  # the image user may write there


def base_tags() -> tuple[str, ...]:
    """The shared engine's bootstrapped bases (each suite's tag and its day's keyed tags), so the
    private engine builds on them rather than bootstrapping again; none on a fresh machine."""
    listed = engine.docker("images", "--format", "{{.Repository}}:{{.Tag}}",
                           "--filter", "reference=torch-images-base:*").stdout.split()
    return tuple(sorted(listed))


@pytest.fixture(scope="module")
def own_engine(shared_publication: Publication) -> Iterator[str]:
    """The module's own dockerd, with DOCKER_HOST pointing at it (the builder's commands, and
    engine.docker here); gone afterwards, on failure too. The session's publication is asked for
    first: made (and its environment taken) here, it would be made on this engine."""
    with private_engine(base_tags()) as private, pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", private.host)
        yield private.host


@pytest.fixture(scope="module")
def env(tmp_path_factory, own_engine):
    """The module's engine, its cache mounts warmed by one build of the CPU runtime (no smoke
    test or SBOM) under a matrix of a registry of the module's own."""
    tmp = tmp_path_factory.mktemp("reproduce")
    addr = f"127.0.0.1:{free_port()}"
    registry.start(addr, tmp / "registry")
    env = {"matrix": amd64_matrix(tmp, addr), "tmp": tmp, "engine": own_engine}
    builder(env, "build", "--select", f"id={CPU}", "--no-smoke", "--no-sbom")
    yield env
    registry.stop(tmp / "registry")


def builder(env, *args: str, extra_env: dict[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_builder(*args, matrix=env["matrix"], check=check,
                       env={**os.environ, **(extra_env or {})})


def shared_engine_env(**extra: str) -> dict[str, str]:
    """This process's environment without the module's DOCKER_HOST (the shared engine)."""
    return {**{k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}, **extra}


def forget(env) -> None:
    """What a fresh engine lacks: the warm build's image and every cached layer of every build
    (the cache mounts stay)."""
    plan = json.loads(builder(env, "plan", "--select", f"id={CPU}", "--json").stdout)
    assert engine.engine_address() == env["engine"]  # never the shared engine's cache
    engine.remove_image(plan["include"][0]["image"])
    engine.docker("builder", "prune", "-af", "--filter", "type=regular", timeout=600)


def test_a_published_image_is_rebuilt_bit_for_bit(env, shared_publication: Publication) -> None:
    shared = shared_publication
    forget(env)
    result = run_builder("reproduce", shared.reference, "--json", matrix=shared.matrix,
                         check=False)
    assert result.returncode in (0, 1), result.stdout[-3000:] + result.stderr[-3000:]
    doc = json.loads(result.stdout)
    differing = [{k: layer[k] for k in ("index", "paths", "step")}
                 for layer in doc["layers"] if not layer["same"]]
    assert result.returncode == 0, json.dumps(differing, indent=1)[-6000:]
    assert doc["identical"] and doc["rebuilt_id"] == doc["published_id"]
    assert doc["published_id"] == shared.built["image_id"]


def publish_planted(shared: Publication, folder: Path, templates: Path) -> tuple[str, Path]:
    """The CPU runtime from `templates`, built, given the session image's evidence
    (lend_evidence), staged and published (unsigned) on the shared engine under a repository of
    its own in the session's registry (its push mounts the session image's layers); returns its
    reference and matrix."""
    matrix = private_matrix(folder, source=shared.matrix, compression=["gzip"])
    environ = shared_engine_env(BUILDER_TEMPLATES=str(templates),
                                BUILDER_STATE=str(folder / "state"))
    [built] = json.loads(run_builder("build", "--select", f"id={CPU}", "--no-smoke", "--no-sbom",
                                     "--json", matrix=matrix, env=environ).stdout)
    lend_evidence(shared, folder / "state", built["image"], built["image_id"])
    [staged] = json.loads(run_builder("build", "--select", f"id={CPU}", "--stage", "--json",
                                      matrix=matrix, env=environ).stdout)
    assert staged["image_id"] == built["image_id"] and staged["smoke"].startswith("pass"), staged
    manifest = folder / "published.json"
    run_builder("publish", "--select", f"id={CPU}", "--manifest", str(manifest), "--unsigned",
                matrix=matrix, env=environ)
    pubs = json.loads(manifest.read_text())["variants"][CPU]["publications"]
    return pubs[-1]["reference"], matrix


def test_a_planted_build_time_is_named_and_exits_1(env, shared_publication: Publication,
                                                   tmp_path: Path) -> None:
    templates = tmp_path / "templates"
    shutil.copytree(ROOT / "templates", templates)
    dockerfile = templates / "Dockerfile.j2"
    text = dockerfile.read_text()
    dockerfile.write_text(text.replace("\nLABEL ", f"\nRUN date +%s%N > {PLANTED}\nLABEL ", 1))
    reference, matrix = publish_planted(shared_publication, tmp_path, templates)
    assert engine.engine_address() == env["engine"]  # rebuilt where the step never ran
    result = run_builder("reproduce", reference, matrix=matrix, check=False,
                         env={**os.environ, "BUILDER_TEMPLATES": str(templates)})
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "DIFFERENT" in result.stdout and PLANTED in result.stdout, result.stdout
    differing = [line for line in result.stdout.splitlines() if "DIFFERENT" in line]
    assert len(differing) == 1, result.stdout  # only the planted layer
