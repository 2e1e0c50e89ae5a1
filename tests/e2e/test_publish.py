"""`builder publish` and `builder registry`: gates, dated tags, artifacts, published.json.

Docker tests push tiny `FROM scratch` images (one small file each, labelled like build.py does) to
a registry on a free loopback port with storage in tmp; smoke reports and SBOMs are fakes that
match their schemas, written into a temporary BUILDER_STATE.
"""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from helpers import free_port

from builder.core import clock, engine, labels, media, oci, proc, registry, state
from builder.core.oci import RegistryError
from builder.flows import publish as publish_flow
from builder.model import matrix, publication
from builder.model.planned import PlannedVariant
from builder.stages import build, plan, provenance, publish, render, smoketest, staging
from smoke.checks import CHECKS, GPU_CHECKS

ROOT = Path(__file__).resolve().parents[2]
CPU_ID = "2.13.0-py3.11-cpu-runtime"
CUDA_ID = "2.15.0-py3.11-cuda-runtime"
DATE = "20260102"
SCHEMA = json.loads(publication.SCHEMA_PATH.read_text())


# ---- helpers -----------------------------------------------------------------------------------


def tags(addr: str, repo: str) -> list[str]:
    try:
        with urllib.request.urlopen(f"http://{addr}/v2/{repo}/tags/list", timeout=5) as r:
            return sorted(json.load(r)["tags"] or [])
    except urllib.error.HTTPError:
        return []


def digest_at(addr: str, repo: str, tag: str) -> str | None:
    desc = oci.Registry(addr).head(repo, tag)
    return desc.digest if desc else None


def get_manifest(addr: str, repo: str, ref: str) -> dict[str, Any]:
    req = urllib.request.Request(f"http://{addr}/v2/{repo}/manifests/{ref}",
                                 headers={"Accept": ", ".join(oci.MANIFEST_TYPES)})
    with urllib.request.urlopen(req, timeout=5) as r:
        return json.load(r)


def smoke_report(image_id: str, accelerator: str, *, status: str = "pass",
                 require_gpu: bool = False) -> dict[str, Any]:
    gpu = "pass" if require_gpu else "substituted"
    # Every check of the suite (the gate requires them all), GPU ones as a CPU host runs them.
    checks = {name: (gpu if name in GPU_CHECKS else status) for name in CHECKS}
    checks["cuda"] = "pass" if require_gpu else "skip"
    return {
        "schema_version": 1, "image": {"ref": None, "id": image_id, "digest": None},
        "facts": {"accelerator": accelerator, "torch": "2.15.0", "python": "3.11"},
        "host": {"gpus": [], "driver": None}, "require_gpu": require_gpu,
        "started": "2026-01-02T00:00:00+00:00", "finished": "2026-01-02T00:01:00+00:00",
        "status": status,
        "checks": [{"name": n, "status": s, "duration_s": 0.1, "message": n, "metrics": {}}
                   for n, s in checks.items()],
    }


SBOM_DOC = {"bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1,
            "serialNumber": "urn:uuid:3e671687-395b-41f5-a30f-a58921a69b79"}


# ---- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def base_matrix() -> matrix.Matrix:
    return matrix.load(ROOT / "matrix.yaml")


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state_dir = tmp_path / "state"
    monkeypatch.setenv("BUILDER_STATE", str(state_dir))
    monkeypatch.setattr(oci, "BACKOFF_S", (0.05, 0.05, 0.05))
    monkeypatch.setenv(clock.ENV, f"{DATE[:4]}-{DATE[4:6]}-{DATE[6:]}T12:00:00Z")  # one clock
    clock.reset()
    return state_dir


class Images:
    """Builds tiny labelled images for one test and removes them afterwards."""

    def __init__(self, tmp: Path, m: matrix.Matrix) -> None:
        self.tmp, self.matrix, self.ids = tmp, m, []
        self.smoke_hash = plan.smoke_files_hash()

    def planned(self, vid: str, content_hash: str) -> PlannedVariant:
        rendered = render.render_locked(self.matrix, self.matrix.variant(vid), ROOT / "locks")
        p = plan.plan_variant(self.matrix, rendered, None, self.smoke_hash)
        return dataclasses.replace(p, content_hash=content_hash)

    def build(self, vid: str, *, nonce: str = "", smoke_ok: bool = True,
              smoke_gpu: bool = False, sbom_ok: bool = True,
              extra_labels: dict[str, str] | None = None) -> tuple[PlannedVariant, str]:
        """Image for `vid` tagged as build.py tags it; returns (its plan, its id)."""
        content_hash = uuid.uuid4().hex * 2
        p = self.planned(vid, content_hash)
        ctx = self.tmp / f"ctx-{uuid.uuid4().hex[:8]}"
        ctx.mkdir()
        (ctx / "nonce").write_text(nonce or uuid.uuid4().hex)
        (ctx / "Dockerfile").write_text("FROM scratch\nCOPY nonce /nonce\n")
        ref = p.local_image
        engine.docker("build", "-q", "-t", ref, "--label", f"{labels.CONTENT_HASH}={content_hash}",
                      "--label", f"{labels.LOCK_HASH}={p.lock_hash}",
                      "--label", f"{labels.ACCELERATOR}={p.variant.accelerator}",
                      *[f"--label={k}={v}" for k, v in (extra_labels or {}).items()], str(ctx))
        image_id = engine.inspect_image(ref)["Id"]
        self.ids.append(image_id)
        if smoke_ok is not None:
            report = smoke_report(image_id, p.variant.accelerator,
                                  status="pass" if smoke_ok else "fail", require_gpu=smoke_gpu)
            smoketest.store_report(report, image_id, None)
        if sbom_ok:
            path = state.evidence_path("sbom", image_id)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(SBOM_DOC))
        return p, image_id

    def cleanup(self) -> None:
        for image_id in self.ids:
            engine.remove_image(image_id)


@pytest.fixture
def images(tmp_path: Path, env: Path, registry_addr: str,
           base_matrix: matrix.Matrix) -> Iterator[Images]:
    # One repository per test: tests do not see each other's tags.
    # linux/amd64 only: single-image publishing (test_multiarch.py covers the index).
    m = dataclasses.replace(base_matrix, registry=registry_addr,
                            repository=f"publish-test-{uuid.uuid4().hex[:8]}",
                            variants=tuple(v for v in base_matrix.variants
                                           if v.platform == "linux/amd64"))
    made = Images(tmp_path, m)
    yield made
    made.cleanup()


def run(images: Images, planned: list[PlannedVariant], tmp_path: Path, **kw: Any
        ) -> list[dict[str, Any]]:
    kw.setdefault("allow_cpu_smoke", False)
    return publish_flow.publish_variants(images.matrix, planned, manifest=tmp_path / "published.json",
                                    **kw)


# ---- the gate ----------------------------------------------------------------------------------


@pytest.mark.docker
def test_refused_on_failed_smoke(images: Images, tmp_path: Path) -> None:
    p, _ = images.build(CPU_ID, smoke_ok=False)
    [result] = run(images, [p], tmp_path)
    assert result["status"] == "refused" and "smoke failed" in result["reason"]
    assert tags(images.matrix.registry, images.matrix.repository) == []
    assert not (tmp_path / "published.json").exists()


@pytest.mark.docker
def test_refused_on_missing_smoke_report(images: Images, tmp_path: Path) -> None:
    p, image_id = images.build(CPU_ID)
    state.evidence_path("smoke", image_id).unlink()
    [result] = run(images, [p], tmp_path)
    assert result["status"] == "refused" and "no smoke report" in result["reason"]
    assert tags(images.matrix.registry, images.matrix.repository) == []


@pytest.mark.docker
def test_refused_on_missing_or_invalid_sbom(images: Images, tmp_path: Path) -> None:
    p, image_id = images.build(CPU_ID, sbom_ok=False)
    [result] = run(images, [p], tmp_path)
    assert result["status"] == "refused" and "no SBOM" in result["reason"]
    state.evidence_path("sbom", image_id).parent.mkdir(parents=True, exist_ok=True)
    state.evidence_path("sbom", image_id).write_text(json.dumps({**SBOM_DOC, "bomFormat": "SPDX"}))
    [result] = run(images, [p], tmp_path)
    assert result["status"] == "refused" and "not valid CycloneDX" in result["reason"]
    assert tags(images.matrix.registry, images.matrix.repository) == []


@pytest.mark.docker
def test_stale_image_refused(images: Images, tmp_path: Path) -> None:
    p, _ = images.build(CPU_ID)
    stale = dataclasses.replace(p, content_hash="0" * 64)
    [result] = run(images, [stale], tmp_path)
    assert result["status"] == "refused" and "stale image" in result["reason"]


@pytest.mark.docker
def test_cuda_image_with_cpu_smoke(images: Images, tmp_path: Path) -> None:
    p, _ = images.build(CUDA_ID, smoke_gpu=False)
    [result] = run(images, [p], tmp_path)
    assert result["status"] == "refused" and "--require-gpu" in result["reason"]
    assert tags(images.matrix.registry, images.matrix.repository) == []

    [result] = run(images, [p], tmp_path, allow_cpu_smoke=True)
    assert result["status"] == "published"
    assert (result["smoke_gpu"], result["allow_cpu_smoke"]) == (False, True)
    # Aliases move with the floating tag.
    repo = images.matrix.repository
    assert digest_at(images.matrix.registry, repo, "latest-runtime") == result["digest"]
    doc = json.loads((tmp_path / "published.json").read_text())
    assert doc["variants"][CUDA_ID]["publications"][0]["allow_cpu_smoke"] is True


# ---- publishing --------------------------------------------------------------------------------


def published_tags(addr: str, repo: str, p: Any, digest: str) -> list[str]:
    """What one publication of `p` today leaves in the repository: its dated, build and floating
    tags, each with a `-zstd` twin (same config, zstd layers), the evidence of both digests and
    the vulnerability audit of both (publish's default; a node pulling the twin asks about
    its digest)."""
    twin = digest_at(addr, repo, f"{p.floating_tag}-zstd")
    gzip_tags = [f"{p.floating_tag}-{DATE}", p.hash_tag, p.floating_tag]
    evidence = [f"sha256-{d.removeprefix('sha256:')}.{kind}" for d in (digest, twin)
                for kind in ("sbom", "smoke", "provenance")]
    evidence += [f"sha256-{d.removeprefix('sha256:')}.audit" for d in (digest, twin)]
    return sorted([*gzip_tags, *(f"{t}-zstd" for t in gzip_tags), *evidence])


@pytest.mark.docker
def test_publish_tags_artifacts_and_manifest(images: Images, tmp_path: Path) -> None:
    p, image_id = images.build(CPU_ID)
    [result] = run(images, [p], tmp_path)
    assert result["status"] == "published", result
    addr, repo, digest = images.matrix.registry, images.matrix.repository, result["digest"]
    hexd = digest.removeprefix("sha256:")
    dated = f"{p.floating_tag}-{DATE}"
    assert tags(addr, repo) == published_tags(addr, repo, p, digest)
    for tag in (dated, p.hash_tag, p.floating_tag):
        assert digest_at(addr, repo, tag) == digest
    # Each artifact names the image as its subject and carries the file it stands for.
    for kind, media_type in (("sbom", media.SBOM), ("smoke", media.SMOKE_REPORT)):
        art = get_manifest(addr, repo, f"sha256-{hexd}.{kind}")
        assert art["artifactType"] == media_type
        assert art["subject"]["digest"] == digest
        assert art["annotations"][oci.REF_NAME] == f"sha256-{hexd}.{kind}"
        assert art["layers"][0]["mediaType"] == media_type
    doc = json.loads((tmp_path / "published.json").read_text())
    jsonschema.validate(doc, SCHEMA)
    [pub] = doc["variants"][CPU_ID]["publications"]
    assert pub["reference"] == f"{addr}/{repo}@{digest}"
    assert pub["dated_tag"] == dated and pub["image_id"] == image_id
    assert pub["sbom"]["tag"] == f"sha256-{hexd}.sbom"
    assert (pub["smoke_gpu"], pub["allow_cpu_smoke"]) == (False, False)
    assert "password" not in json.dumps(doc).lower()
    # `builder plan` now sees the variant as up to date in the registry.
    assert plan.registry_has(addr, repo, p.hash_tag)
    # Only the floating tag stays on the local image.
    assert engine.inspect_image(f"{images.matrix.image_name}:{dated}") is None


@pytest.mark.docker
def test_same_day_republish(images: Images, tmp_path: Path) -> None:
    addr, repo = images.matrix.registry, images.matrix.repository
    p1, _ = images.build(CPU_ID, nonce="one")
    [first] = run(images, [p1], tmp_path)
    p2, _ = images.build(CPU_ID, nonce="two")
    [second] = run(images, [p2], tmp_path)
    assert second["status"] == "published" and second["digest"] != first["digest"]
    base = f"{p1.floating_tag}-{DATE}"
    assert second["dated_tag"] == base + ".1"
    assert digest_at(addr, repo, base) == first["digest"]  # never overwritten
    assert digest_at(addr, repo, base + ".1") == second["digest"]
    assert digest_at(addr, repo, p1.floating_tag) == second["digest"]

    # The same digest again: the same dated tag, no new tag, no new history entry.
    before = tags(addr, repo)
    [again] = run(images, [p2], tmp_path)
    assert again["dated_tag"] == base + ".1" and again["digest"] == second["digest"]
    assert tags(addr, repo) == before
    history = json.loads((tmp_path / "published.json").read_text())["variants"][CPU_ID]
    assert [h["dated_tag"] for h in history["publications"]] == [base, base + ".1"]


@pytest.mark.docker
def test_registry_down_leaves_floating_tag(images: Images, tmp_path: Path,
                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    # Its own registry, so stopping it does not disturb the session's.
    folder = tmp_path_factory.mktemp("down-registry")
    addr = f"127.0.0.1:{free_port()}"
    registry.start(addr, folder)
    try:
        images.matrix = dataclasses.replace(images.matrix, registry=addr)
        p1, _ = images.build(CPU_ID, nonce="before")
        [first] = run(images, [p1], tmp_path)
        p2, _ = images.build(CPU_ID, nonce="after")
        registry.stop(folder)
        assert not registry.is_up(addr)
        with pytest.raises(RegistryError, match=addr) as exc:
            run(images, [p2], tmp_path)
        assert "run `builder publish` again" in (exc.value.hint or "")
        registry.start(addr, folder)
        assert digest_at(addr, images.matrix.repository, p1.floating_tag) == first["digest"]
        history = json.loads((tmp_path / "published.json").read_text())["variants"][CPU_ID]
        assert len(history["publications"]) == 1
    finally:
        registry.stop(folder)


@pytest.mark.docker
def test_dry_run_pushes_nothing(images: Images, tmp_path: Path) -> None:
    p, _ = images.build(CPU_ID)
    [result] = run(images, [p], tmp_path, dry_run=True)
    assert result["status"] == "would-publish"
    assert p.floating_tag in result["tags"] and p.hash_tag in result["tags"]
    assert tags(images.matrix.registry, images.matrix.repository) == []
    assert not (tmp_path / "published.json").exists()


@pytest.mark.docker
def test_registry_start_is_idempotent(registry_addr: str, tmp_path: Path) -> None:
    assert registry.is_up(registry_addr)
    registry.start(registry_addr, tmp_path / "unused")  # already up: starts nothing
    assert not (tmp_path / "unused" / "registry.pid").exists()


# ---- interrupted publications ------------------------------------------------------------------

# (the flow's own steps: `stage`, `attach`, `provenance_of`; the rest are stages.publish's)
STEPS = [("stage", 1), ("promote", 1), ("attach", 1), ("attach", 2), ("provenance_of", 1),
         ("attach", 3), ("tag_image", 1), ("tag_image", 2), ("tag_image", 3)]


@pytest.mark.docker
@pytest.mark.parametrize(("function", "nth"), STEPS)
def test_a_crash_at_any_step_leaves_nothing_half_done(
        images: Images, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        function: str, nth: int) -> None:
    """Fail the nth call of one publish step: no tag a user or `plan` reads may point at an
    image without its SBOM and smoke report; the next `publish` completes the publication."""
    addr, repo = images.matrix.registry, images.matrix.repository
    p, _ = images.build(CPU_ID)
    owner = publish_flow if function in ("stage", "attach", "provenance_of") else publish
    real = getattr(owner, function)
    calls = []

    def crash(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == nth:
            raise RuntimeError(f"injected crash in {function} #{nth}")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, function, crash)
    with pytest.raises(RuntimeError, match="injected crash"):
        run(images, [p], tmp_path)
    user_tags = [t for t in tags(addr, repo) if not t.startswith("sha256-")]
    for tag in user_tags:
        hexd = digest_at(addr, repo, tag).removeprefix("sha256:")
        evidence = {f"sha256-{hexd}.{kind}" for kind in ("sbom", "smoke", "provenance")}
        assert evidence <= set(tags(addr, repo)), tag
    assert not (tmp_path / "published.json").exists()

    monkeypatch.setattr(owner, function, real)
    [result] = run(images, [p], tmp_path)
    assert result["status"] == "published"
    assert tags(addr, repo) == published_tags(addr, repo, p, result["digest"])
    doc = json.loads((tmp_path / "published.json").read_text())
    assert len(doc["variants"][CPU_ID]["publications"]) == 1


# ---- builder verify ----------------------------------------------------------------------------


@pytest.mark.docker
def test_verify_reads_the_evidence_attached_to_a_digest(images: Images, tmp_path: Path) -> None:
    from builder.flows import verify

    p, _ = images.build(CPU_ID)
    [result] = run(images, [p], tmp_path)
    digest, rows = verify.verify(verify.Reference.parse(result["reference"]))
    by_name = {r.what: r for r in rows}
    assert digest == result["digest"]
    assert by_name["sbom"].status == verify.OK, by_name["sbom"]
    assert by_name["provenance"].status == verify.OK, by_name["provenance"]
    # The test image lacks the facts labels a real build writes: verify says so.
    assert by_name["labels"].status == verify.BAD and "io.torch-images.torch" in by_name[
        "labels"].detail
    assert by_name["smoke"].status == verify.BAD and "≠ label" in by_name["smoke"].detail

    # A staged image nobody smoked or described: each piece is reported missing.
    _, image_id = images.build(CPU_ID, nonce="bare")
    bare = staging.stage(images.matrix, image_id, "build-bare")
    _, rows = verify.verify(verify.Reference.parse(bare.reference))
    assert {r.what: r.status for r in rows if r.what in ("sbom", "smoke", "provenance")} == {
        "sbom": verify.MISSING, "smoke": verify.MISSING, "provenance": verify.MISSING}


@pytest.mark.docker
def test_a_staged_image_is_published_from_an_empty_workspace(
        images: Images, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Built and smoked on one machine, published from another: the registry carries the image
    and its evidence; the second machine has neither the image nor a .state/."""
    p, image_id = images.build(CPU_ID)
    staged = staging.stage(images.matrix, image_id, p.hash_tag)
    for kind in ("smoke", "sbom"):
        staging.attach(staged, kind, state.evidence_path(kind, image_id).read_bytes())
    monkeypatch.setenv("BUILDER_STATE", str(tmp_path / "another-machine"))
    engine.remove_image(image_id)
    assert engine.inspect_image(image_id) is None
    [result] = run(images, [p], tmp_path)
    assert result["status"] == "published", result
    assert result["image_id"] == image_id and result["digest"] == staged.digest


@pytest.mark.docker
def test_staging_on_another_registry_is_promoted_across(
        images: Images, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CI stages in its own registry (`staging: registry/repository`); `builder publish`
    promotes into the matrix's registry by digest, blobs streamed across, and the evidence
    attached in staging travels with the digest."""
    folder, addr = tmp_path / "ci-registry", f"127.0.0.1:{free_port()}"
    registry.start(addr, folder)
    try:
        images.matrix = dataclasses.replace(images.matrix, staging=f"{addr}/ci/torch-staging")
        p, image_id = images.build(CPU_ID)
        staged = staging.stage(images.matrix, image_id, p.hash_tag)
        assert (staged.registry, staged.repository) == (addr, "ci/torch-staging")
        for kind in ("smoke", "sbom"):
            staging.attach(staged, kind, state.evidence_path(kind, image_id).read_bytes())
        monkeypatch.setenv("BUILDER_STATE", str(tmp_path / "another-machine"))
        [result] = run(images, [p], tmp_path)
        assert result["status"] == "published", result
        assert result["digest"] == staged.digest
        assert result["registry"] == images.matrix.registry != addr
        vetted = oci.Registry(images.matrix.registry)
        assert vetted.head(images.matrix.repository, staged.digest) is not None
        smoke = vetted.fetch_artifact(images.matrix.repository, staged.digest, "smoke")
        assert smoke is not None and json.loads(smoke)["image"]["id"] == image_id
    finally:
        registry.stop(folder)


@pytest.mark.docker
def test_a_dirty_tree_build_publishes_provenance_saying_dirty_with_its_real_times(
        images: Images, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The labels build.py writes in a checkout with an uncommitted lock, then publish: the
    provenance says `dirty: true` with the diff's hash and when the build really ran."""
    checkout = tmp_path / "checkout"
    (checkout / "locks").mkdir(parents=True)
    (checkout / "locks" / "x.txt").write_text("numpy==2.4.5\n")
    for argv in (["init", "-q"], ["add", "."], ["-c", "user.name=t", "-c", "user.email=t@t",
                                                "commit", "-qm", "lock"]):
        proc.run(["git", "-C", str(checkout), *argv])
    (checkout / "locks" / "x.txt").write_text("numpy==2.4.6\n")  # the uncommitted relock
    monkeypatch.chdir(checkout)
    tree = build.tree_labels()
    assert tree[labels.SOURCE_DIRTY] == "true"
    p, image_id = images.build(CPU_ID, extra_labels=tree)
    build.record_times(image_id, "2026-12-06T00:00:00Z")
    [result] = run(images, [p], tmp_path)
    assert result["status"] == "published", result
    doc = json.loads(oci.Registry(images.matrix.registry).fetch_artifact(
        images.matrix.repository, result["digest"], "provenance") or b"{}")
    params = doc["predicate"]["buildDefinition"]["externalParameters"]
    assert (params["dirty"], params["diff"]) == (True, tree[labels.SOURCE_DIFF])
    assert params["source"] == provenance.NO_SOURCE  # no public remote: said so, never ""
    when = doc["predicate"]["runDetails"]["metadata"]
    assert when["startedOn"] == "2026-12-06T00:00:00Z" and when["finishedOn"] > when["startedOn"]
