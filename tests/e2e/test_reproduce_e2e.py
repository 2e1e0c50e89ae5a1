"""`builder reproduce` for real: build, stage and publish the CPU runtime; forget the image and
BuildKit's layer cache; rebuild from the provenance and get the same image. A planted
non-determinism (a test-only template that writes the build's time into a file) makes it exit 1
and name that file.

Forgetting prunes BuildKit's layer records (`--filter type=regular`), so the module runs on an
engine of its own (private_engine: a second dockerd, its own data root and bridge, removed
afterwards) with the shared engine's bootstrapped base loaded into it: the shared build cache
stays whole under every other test, in any order. Needs the worktree to be committed: the
rebuild checks out the commit the image names.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers import free_port, run_builder
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
def own_engine() -> Iterator[str]:
    """The module's own dockerd, with DOCKER_HOST pointing at it (the builder's commands, and
    engine.docker here); gone afterwards, on failure too."""
    with private_engine(base_tags()) as private, pytest.MonkeyPatch.context() as patch:
        patch.setenv("DOCKER_HOST", private.host)
        yield private.host


@pytest.fixture(scope="module")
def env(tmp_path_factory, own_engine):
    """A matrix with a fresh registry on a free port, built on the module's own engine."""
    tmp = tmp_path_factory.mktemp("reproduce")
    addr = f"127.0.0.1:{free_port()}"
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["registry"] = addr
    data.setdefault("exclude", []).append({"platform": "linux/arm64"})
    (tmp / "matrix.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    registry.start(addr, tmp / "registry")
    env = {"matrix": tmp / "matrix.yaml", "addr": addr, "tmp": tmp, "engine": own_engine}
    # What the shared engine had: warm caches (an image published from the first build on a
    # brand-new engine did not reproduce bit for bit). Only the build warms them: no smoke test
    # or SBOM, which each published build below makes (--force) for its own image.
    builder(env, "build", "--select", f"id={CPU}", "--no-smoke", "--no-sbom")
    yield env
    registry.stop(tmp / "registry")


def builder(env, *args: str, extra_env: dict[str, str] | None = None,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_builder(*args, matrix=env["matrix"], check=check,
                       env={**os.environ, **(extra_env or {})})


def publish(env, extra_env: dict[str, str] | None = None) -> str:
    """Build (smoke, SBOM), stage and publish the CPU runtime; returns its reference."""
    builder(env, "build", "--select", f"id={CPU}", "--stage", "--force", extra_env=extra_env)
    manifest = env["tmp"] / "published.json"
    builder(env, "publish", "--select", f"id={CPU}", "--manifest", str(manifest), "--unsigned",
            extra_env=extra_env)
    pubs = json.loads(manifest.read_text())["variants"][CPU]["publications"]
    return pubs[-1]["reference"]


def forget(env) -> None:
    """What a fresh engine lacks: the image and every cached layer of every build."""
    plan = json.loads(builder(env, "plan", "--select", f"id={CPU}", "--json").stdout)
    assert engine.engine_address() == env["engine"]  # never the shared engine's cache
    engine.remove_image(plan["include"][0]["image"])
    engine.docker("builder", "prune", "-af", "--filter", "type=regular", timeout=600)


def test_a_published_image_is_rebuilt_bit_for_bit(env):
    reference = publish(env)
    forget(env)
    result = builder(env, "reproduce", reference, "--json", check=False)
    assert result.returncode in (0, 1), result.stdout[-3000:] + result.stderr[-3000:]
    doc = json.loads(result.stdout)
    differing = [{k: layer[k] for k in ("index", "paths", "step")}
                 for layer in doc["layers"] if not layer["same"]]
    assert result.returncode == 0, json.dumps(differing, indent=1)[-6000:]
    assert doc["identical"] and doc["rebuilt_id"] == doc["published_id"]


def test_a_planted_build_time_is_named_and_exits_1(env):
    templates = env["tmp"] / "templates"
    shutil.copytree(ROOT / "templates", templates)
    dockerfile = templates / "Dockerfile.j2"
    text = dockerfile.read_text()
    dockerfile.write_text(text.replace("\nLABEL ", f"\nRUN date +%s%N > {PLANTED}\nLABEL ", 1))
    planted = {"BUILDER_TEMPLATES": str(templates)}
    reference = publish(env, planted)
    forget(env)
    result = builder(env, "reproduce", reference, extra_env=planted, check=False)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "DIFFERENT" in result.stdout and PLANTED in result.stdout, result.stdout
    differing = [line for line in result.stdout.splitlines() if "DIFFERENT" in line]
    assert len(differing) == 1, result.stdout  # only the planted layer
