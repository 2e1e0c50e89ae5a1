"""The matrix's default selection, published as a user types it: `builder publish --key
cosign.key` with no `--select`. The default names the CPU runtime (linux/amd64) and the CUDA
3.11 slim (linux/amd64 and linux/arm64). Each platform is staged by content hash with signed
evidence, as the build runners leave it, using tiny `FROM scratch` images (no emulation: nothing
runs); the publish machine has none of them locally.

With every platform staged, both variants are published and the slim's tags hold one index of
both platforms; with the arm64 half missing, publish exits 1 and names that platform once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from helpers import private_matrix, run_builder
from test_multiarch import scratch_image
from test_publish import SBOM_DOC, smoke_report

from builder.core import engine, keypair, labels, oci
from builder.flows import bases
from builder.model import matrix
from builder.model.planned import PlannedVariant
from builder.stages import plan, render, staging

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "default-publish-e2e"
SLIM = "2.15.0-py3.11-cuda-slim"


@pytest.fixture
def setup(tmp_path: Path, registry_addr: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Keys, a private matrix on the registry; the build runners' state (in this process)
    apart from the publish machine's (the CLI's)."""
    monkeypatch.setenv("COSIGN_PASSWORD", PASSWORD)
    monkeypatch.setenv("BUILDER_STATE", str(tmp_path / "runners"))
    env = {**os.environ, "BUILDER_STATE": str(tmp_path / "publisher")}
    env.pop("COSIGN_PRIVATE_KEY", None)
    (tmp_path / "keys").mkdir()
    run_builder("keygen", "--out", str(tmp_path / "keys"), env=env)
    return {"env": env, "keys": tmp_path / "keys",
            "matrix": private_matrix(tmp_path, registry=registry_addr)}


def default_plan(setup: dict[str, Any]) -> tuple[matrix.Matrix, list[PlannedVariant]]:
    """The plan `builder publish` makes of the default selection (same locks, same bases)."""
    m = matrix.load(setup["matrix"])
    variants = m.select(["default=true"])
    trusted = (keypair.load_public(setup["keys"] / "cosign.pub"),)
    rendered = [render.render_locked(m, v, ROOT / "locks") for v in variants]
    return m, plan.make_plan(m, rendered, bases.known_digests(m, variants, trusted),
                             check_registry=False)


def stage_scratch(tmp: Path, m: matrix.Matrix, p: PlannedVariant, key: keypair.SigningKey,
                  made: list[str]) -> None:
    """One platform of a variant staged as its build runner leaves it: the image under
    `build-<hash>` with its smoke report and SBOM attached and attested with our key."""
    image_id = scratch_image(tmp, f"{m.image_name}:{p.local_tag}", p.variant.platform, made,
                             {labels.CONTENT_HASH: p.content_hash, labels.LOCK_HASH: p.lock_hash})
    staged = staging.stage(m, image_id, p.hash_tag)
    report = smoke_report(image_id, p.variant.accelerator)
    staging.attach_all(staged, {"smoke": json.dumps(report).encode(),
                                "sbom": json.dumps(SBOM_DOC).encode()}, key)
    engine.remove_image(f"{m.image_name}:{p.local_tag}")  # the publish machine has none


def publish_default(setup: dict[str, Any]) -> Any:
    return run_builder("publish", "--key", str(setup["keys"] / "cosign.key"),
                       "--allow-cpu-smoke", "--json", matrix=setup["matrix"], env=setup["env"],
                       check=False)


def test_the_default_selection_publishes_once_every_platform_is_staged(
        setup: dict[str, Any], tmp_path: Path, made: list[str]) -> None:
    m, planned = default_plan(setup)
    assert sorted((p.variant.id, p.variant.platform) for p in planned) == [
        ("2.13.0-py3.11-cpu-runtime", "linux/amd64"),
        (SLIM, "linux/amd64"), (SLIM, "linux/arm64")]
    key = keypair.signing_key(setup["keys"] / "cosign.key")
    for p in planned:
        stage_scratch(tmp_path, m, p, key, made)

    result = publish_default(setup)
    assert result.returncode == 0, result.stderr[-3000:]
    by_id = {r["id"]: r for r in json.loads(result.stdout)}
    print("\n".join(f"{i}: {r['status']} {', '.join(r.get('tags', []))}" for i, r in by_id.items()))
    assert {i: r["status"] for i, r in by_id.items()} == {
        "2.13.0-py3.11-cpu-runtime": "published", SLIM: "published"}
    slim = next(p for p in planned if p.variant.id == SLIM)
    reg = oci.Registry(m.registry)
    body, desc = reg.manifest(m.repository, slim.floating_tag)
    assert desc.media_type == oci.OCI_INDEX
    assert [c["platform"]["architecture"] for c in json.loads(body)["manifests"]] == [
        "amd64", "arm64"]


def test_with_only_amd64_staged_the_missing_platform_is_named_once(
        setup: dict[str, Any], tmp_path: Path, made: list[str]) -> None:
    m, planned = default_plan(setup)
    key = keypair.signing_key(setup["keys"] / "cosign.key")
    for p in planned:
        if p.variant.platform == "linux/amd64":
            stage_scratch(tmp_path, m, p, key, made)

    result = publish_default(setup)
    assert result.returncode == 1, result.stderr[-3000:]
    error = next(line for line in result.stderr.splitlines() if line.startswith("error:"))
    print(error)
    assert error.startswith("error: 1 of 2 variants refused:"), error
    assert error.count("linux/arm64") == 1, error
    assert "platform=" not in result.stderr  # the user typed no --select
