"""Multi-arch publishing on a real engine and registry: tiny `FROM scratch` images for
linux/amd64 and linux/arm64 (no emulation needed: nothing runs), joined into one OCI image index
under one tag; `docker pull --platform` of that tag gives each its own image.

The full arm64 path (emulated build of a CUDA image, smoke under qemu) is `python -m bench arm64`.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

import pytest
from test_publish import SBOM_DOC, smoke_report, tags

from builder.core import clock, engine, labels, oci, state
from builder.flows import publish as publish_flow
from builder.flows import verify
from builder.model import matrix, platforms
from builder.model.planned import PlannedVariant
from builder.stages import plan, render, smoketest, staging

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
VARIANT = "2.15.0-py3.11-cuda-runtime"  # declared for linux/amd64 and linux/arm64


def scratch_image(tmp: Path, ref: str, platform: str, made: list[str],
                  extra_labels: dict[str, str] | None = None) -> str:
    """A one-file image of `platform` (BuildKit needs no emulator for FROM scratch + COPY)."""
    ctx = tmp / f"ctx-{uuid.uuid4().hex[:8]}"
    ctx.mkdir()
    (ctx / "arch").write_text(platform)
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY arch /arch\n")
    argv = ["build", "-q", "--platform", platform, "-t", ref]
    for key, value in (extra_labels or {}).items():
        argv += ["--label", f"{key}={value}"]
    engine.docker(*argv, str(ctx))
    made.append(ref)
    return engine.inspect_image(ref)["Id"]


def pulled_arch(ref: str, platform: str, made: list[str]) -> str:
    engine.docker("pull", "--platform", platform, ref, timeout=300)
    made.append(ref)
    return engine.inspect_image(ref)["Architecture"]


def test_index_of_two_scratch_images_pulls_per_platform(tmp_path: Path, registry_addr: str,
                                                        made: list[str]) -> None:
    repo = f"index-{uuid.uuid4().hex[:8]}"
    reg = oci.Registry(registry_addr)
    entries = []
    for name in ("linux/amd64", "linux/arm64"):
        ref = f"{registry_addr}/{repo}:{platforms.get(name).arch}"
        scratch_image(tmp_path, ref, name, made)
        engine.docker("push", ref)
        desc = reg.head(repo, platforms.get(name).arch)
        assert desc is not None
        entries.append(platforms.PlatformManifest(platforms.get(name), desc))
    index = reg.push_index(repo, platforms.index_document(entries))
    reg.tag(repo, index.digest, "both")
    assert reg.head(repo, "both").media_type == oci.OCI_INDEX
    for name in ("linux/amd64", "linux/arm64"):
        engine.docker("image", "rm", f"{registry_addr}/{repo}:both", check=False)
        assert pulled_arch(f"{registry_addr}/{repo}:both", name, made) == platforms.get(name).arch
    # An index may only list manifests the repository holds.
    missing = platforms.PlatformManifest(platforms.get("linux/arm64"),
                                         oci.Descriptor("sha256:" + "0" * 64, oci.OCI_MANIFEST, 1))
    with pytest.raises(oci.RegistryError, match="no manifest"):
        reg.push_index(repo, platforms.index_document([entries[0], missing]))


def scratch_variant(tmp_path: Path, m: matrix.Matrix, variant: matrix.Variant,
                    made: list[str]) -> tuple[PlannedVariant, str]:
    """The variant's plan (with a unique content hash) and a scratch image of its platform
    carrying that hash, as `builder build` would leave it."""
    p = plan.plan_variant(m, render.render_locked(m, variant, ROOT / "locks"), None, "smoke")
    p = dataclasses.replace(p, content_hash=uuid.uuid4().hex * 2)
    image_id = scratch_image(tmp_path, f"{m.image_name}:{p.local_tag}", variant.platform,
                             made, {labels.CONTENT_HASH: p.content_hash,
                                    labels.LOCK_HASH: p.lock_hash})
    return p, image_id


def test_publish_joins_a_variants_platforms_under_its_tags(tmp_path: Path, registry_addr: str, made,
                                                           monkeypatch) -> None:
    monkeypatch.setenv("BUILDER_STATE", str(tmp_path / "state"))
    monkeypatch.setenv(clock.ENV, "2026-01-02T12:00:00Z")  # the one clock, read as commands do
    clock.reset()
    base = matrix.load(ROOT / "matrix.yaml")
    m = dataclasses.replace(base, registry=registry_addr, repository=f"multi-{uuid.uuid4().hex[:8]}")
    planned = []
    for variant in m.select([f"id={VARIANT}"]):
        p, image_id = scratch_variant(tmp_path, m, variant, made)
        smoketest.store_report(smoke_report(image_id, "cuda"), image_id, None)
        state.evidence_path("sbom", image_id).parent.mkdir(parents=True, exist_ok=True)
        state.evidence_path("sbom", image_id).write_text(json.dumps(SBOM_DOC))
        planned.append(p)
    assert [p.variant.platform for p in planned] == ["linux/amd64", "linux/arm64"]

    # One platform alone is refused: its tag must not lose the other.
    [refused, *_] = publish_flow.publish_variants(m, planned[1:], allow_cpu_smoke=True,
                                             manifest=tmp_path / "published.json")
    assert refused["status"] == "refused" and "linux/amd64" in refused["reason"]
    assert tags(registry_addr, m.repository) == []

    [result] = publish_flow.publish_variants(m, planned, allow_cpu_smoke=True,
                                        manifest=tmp_path / "published.json")
    assert result["status"] == "published"
    reg = oci.Registry(registry_addr)
    floating = planned[0].floating_tag
    assert reg.head(m.repository, floating).digest == result["digest"]
    assert reg.head(m.repository, "latest-runtime").digest == result["digest"]
    body, desc = reg.manifest(m.repository, result["digest"])
    assert desc.media_type == oci.OCI_INDEX
    children = json.loads(body)["manifests"]
    assert [c["platform"]["architecture"] for c in children] == ["amd64", "arm64"]
    for child, p in zip(children, planned, strict=True):
        # Each platform manifest has its own evidence and content tag.
        for kind in ("sbom", "smoke", "provenance"):
            assert reg.fetch_artifact(m.repository, child["digest"], kind) is not None, kind
        assert reg.head(m.repository, p.hash_tag).digest == child["digest"]
    # `builder verify` of the index checks each platform's manifest and its evidence.
    _, rows = verify.verify(verify.Reference(registry_addr, m.repository, result["digest"]),
                            verify.Policy(contents_only=True))
    assert rows[0].what == "signature" and rows[0].status == verify.UNSIGNED
    assert {r.what.split()[0] for r in rows[1:]} == {"linux/amd64", "linux/arm64"}
    doc = json.loads((tmp_path / "published.json").read_text())
    [pub] = doc["variants"][VARIANT]["publications"]
    assert [x["platform"] for x in pub["platforms"]] == ["linux/amd64", "linux/arm64"]
    engine.docker("image", "rm", f"{m.image_name}:{floating}", check=False)
    assert pulled_arch(f"{m.image_name}:{floating}", "linux/arm64", made) == "arm64"


def test_platforms_staged_apart_are_promoted_into_one_index(tmp_path: Path, registry_addr: str, made,
                                                            monkeypatch) -> None:
    """The CI pattern: each platform is built and staged by digest, with its evidence attached
    to its own manifest, on its own runner; the publish job (no local images, an empty state)
    promotes them all and writes the index."""
    base = matrix.load(ROOT / "matrix.yaml")
    m = dataclasses.replace(base, registry=registry_addr, repository=f"staged-{uuid.uuid4().hex[:8]}")
    planned = []
    for variant in m.select([f"id={VARIANT}"]):
        monkeypatch.setenv("BUILDER_STATE", str(tmp_path / f"runner-{variant.platform[6:]}"))
        p, image_id = scratch_variant(tmp_path, m, variant, made)
        staged = staging.stage(m, image_id, p.hash_tag)
        staging.attach(staged, "smoke", json.dumps(smoke_report(image_id, "cuda")).encode())
        staging.attach(staged, "sbom", json.dumps(SBOM_DOC).encode())
        engine.remove_image(f"{m.image_name}:{p.local_tag}")
        assert p.floating_tag not in tags(registry_addr, m.repository)  # nothing a user reads, yet
        planned.append(p)
    monkeypatch.setenv("BUILDER_STATE", str(tmp_path / "publisher"))
    [result] = publish_flow.publish_variants(m, planned, allow_cpu_smoke=True,
                                        manifest=tmp_path / "published.json")
    assert result["status"] == "published", result.get("reason")
    reg = oci.Registry(registry_addr)
    assert reg.head(m.repository, planned[0].floating_tag).digest == result["digest"]
    assert [e["digest"] for e in result["platforms"]] == [
        reg.head(m.repository, p.hash_tag).digest for p in planned]
