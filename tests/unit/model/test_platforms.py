"""Target platforms: matrix expansion and validation, per-platform locks, render and index
assembly (the registry is an in-memory fake; no engine, no network)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from builder.core import oci
from builder.core.errors import ConfigError
from builder.flows import publish as publish_flow
from builder.flows import publish_gate
from builder.model import lockfile, matrix, platforms
from builder.model.matrix_yaml import MatrixError
from builder.model.planned import PlannedVariant
from builder.model.staged import Staged
from builder.stages import locks, plan, publish, render, smoketest, twin, wheelhouse

ROOT = Path(__file__).resolve().parents[3]
ARM = platforms.get("linux/arm64")
AMD = platforms.get("linux/amd64")

HEAD = """\
registry: 127.0.0.1:5000
repository: torch
bases:
  "3.11": {image: "mmdebstrap:bookworm"}
"""


def load(tmp_path: Path, body: str) -> matrix.Matrix:
    path = tmp_path / "matrix.yaml"
    path.write_text(HEAD + body)
    return matrix.load(path)


def keys(m: matrix.Matrix) -> list[str]:
    return [v.key for v in m.variants]


# ---- expansion ------------------------------------------------------------------------------


def test_default_platform_is_amd64_and_keys_are_the_ids(tmp_path):
    m = load(tmp_path, "axes: {torch: ['2.15.0'], python: ['3.11'], accelerator: [cuda], "
                       "flavor: [slim]}\n")
    assert [(v.key, v.platform) for v in m.variants] == [
        ("2.15.0-py3.11-cuda-slim", "linux/amd64")]


def test_include_entry_sets_platforms_per_variant_and_default_takes_them_all(tmp_path):
    m = load(tmp_path, """\
axes: {torch: ['2.15.0', '2.9.1'], python: ['3.11'], accelerator: [cuda], flavor: [slim]}
include:
  - {torch: "2.15.0", platforms: [linux/amd64, linux/arm64]}
default:
  - {torch: "2.15.0"}
aliases:
  - {tag: latest-slim, torch: "2.15.0", flavor: slim}
""")
    assert keys(m) == ["2.15.0-py3.11-cuda-slim", "2.15.0-py3.11-cuda-slim.linux-arm64",
                       "2.9.1-py3.11-cuda-slim"]
    # `default` selects whole variants: one index holds every platform, so half of one could
    # never be published (`nox -s build` leaves the foreign platforms to their runners).
    assert [v.key for v in m.variants if v.default] == [
        "2.15.0-py3.11-cuda-slim", "2.15.0-py3.11-cuda-slim.linux-arm64"]
    assert [v.key for v in m.select(["platform=linux/arm64"])] == [
        "2.15.0-py3.11-cuda-slim.linux-arm64"]
    assert m.variant("2.15.0-py3.11-cuda-slim").platform == "linux/amd64"


def test_platform_axis_and_exclude_by_platform(tmp_path):
    m = load(tmp_path, """\
axes: {torch: ['2.15.0', '2.9.1'], python: ['3.11'], accelerator: [cuda], flavor: [slim],
       platform: [linux/amd64, linux/arm64]}
exclude:
  - {torch: "2.9.1", platform: linux/arm64}
""")
    assert keys(m) == ["2.15.0-py3.11-cuda-slim", "2.15.0-py3.11-cuda-slim.linux-arm64",
                       "2.9.1-py3.11-cuda-slim"]


def test_top_level_platforms_apply_to_every_variant_and_exclude_drops_one(tmp_path):
    m = load(tmp_path, """\
platforms: [linux/amd64, linux/arm64]
axes: {torch: ['2.15.0', '2.9.1'], python: ['3.11'], accelerator: [cuda], flavor: [slim]}
exclude:
  - {torch: "2.9.1", platform: linux/arm64}
""")
    assert keys(m) == ["2.15.0-py3.11-cuda-slim", "2.15.0-py3.11-cuda-slim.linux-arm64",
                       "2.9.1-py3.11-cuda-slim"]


def test_unknown_platform_is_refused_with_the_choices(tmp_path):
    with pytest.raises(MatrixError) as exc:
        load(tmp_path, "platforms: [linux/riscv64]\naxes: {torch: ['2.15.0'], python: ['3.11'], "
                       "accelerator: [cuda], flavor: [slim]}\n")
    assert "platforms[0]" in str(exc.value) and "linux/arm64" in str(exc.value)


def test_shipped_matrix_declares_arm64_only_for_2_15_0_cuda():
    m = matrix.load(ROOT / "matrix.yaml")
    arm = [v for v in m.variants if v.platform == "linux/arm64"]
    assert arm and all(v.torch == "2.15.0" and v.accelerator == "cuda" for v in arm)
    default_ids = {v.id for v in m.variants if v.default}
    assert {v.key for v in m.variants if v.default} == {
        v.key for v in m.variants if v.id in default_ids}  # every platform of each
    for v in arm:  # committed, current locks for every declared platform
        assert lockfile.is_current(ROOT / "locks", v), v.key


# ---- wheels per platform --------------------------------------------------------------------

CPU_ONLY_METADATA = """\
Name: torch
Version: 2.9.1
Requires-Dist: filelock
Requires-Dist: nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux" and platform_machine == "x86_64"
Requires-Dist: nvidia-cudnn-cu12==9.10.2.21; platform_system == "Linux" and platform_machine == "x86_64"
"""
CUDA_METADATA = """\
Name: torch
Version: 2.15.0
Requires-Dist: nvidia-cuda-runtime==13.2.86; platform_system == "Linux"
"""
WHEELS = ["torch-2.9.1-cp311-cp311-manylinux_2_28_x86_64.whl",
          "torch-2.9.1-cp311-cp311-manylinux_2_28_aarch64.whl"]


def test_cuda_requirement_markers_are_evaluated_for_the_platform():
    assert platforms.requires_cuda(CPU_ONLY_METADATA, AMD, "3.11")
    assert not platforms.requires_cuda(CPU_ONLY_METADATA, ARM, "3.11")
    assert platforms.requires_cuda(CUDA_METADATA, ARM, "3.11")


def test_wheel_problem_names_the_platform_and_the_reason():
    assert platforms.wheel_problem("2.9.1", "3.11", "cuda", AMD, WHEELS, lambda n: True) is None
    cpu_only = platforms.wheel_problem("2.9.1", "3.11", "cuda", ARM, WHEELS, lambda n: False)
    assert cpu_only and "CPU-only" in cpu_only and "linux/arm64" in cpu_only
    # A CPU variant does not care; an unknown answer leaves the check to the lock.
    assert platforms.wheel_problem("2.9.1", "3.11", "cpu", ARM, WHEELS, lambda n: False) is None
    assert platforms.wheel_problem("2.9.1", "3.11", "cuda", ARM, WHEELS, lambda n: None) is None
    none = platforms.wheel_problem("2.9.1", "3.11", "cuda", ARM, WHEELS[:1], lambda n: True)
    assert none and "no wheel" in none and "aarch64" in none


def test_wheel_tags_and_downloads_follow_the_platform(tmp_path):
    assert platforms.wheel_matches(WHEELS[1], ARM) and not platforms.wheel_matches(WHEELS[0], ARM)
    assert platforms.wheel_matches("numpy-2.0-py3-none-any.whl", ARM)
    m = matrix.load(ROOT / "matrix.yaml")
    arm = m.select(["id=2.15.0-py3.11-cuda-slim", "platform=linux/arm64"])[0]
    argv = wheelhouse.download_command(arm, tmp_path / "r.txt", tmp_path / "d")
    tags = [argv[i + 1] for i, a in enumerate(argv) if a == "--platform"]
    assert "manylinux_2_28_aarch64" in tags and not any("x86_64" in t for t in tags)


# ---- locks ----------------------------------------------------------------------------------


def test_lock_names_keep_amd64_paths_and_suffix_other_platforms():
    m = matrix.load(ROOT / "matrix.yaml")
    amd, arm = m.select(["id=2.15.0-py3.11-cuda-devel"])
    assert lockfile.lock_paths(Path("locks"), amd) == (
        Path("locks/2.15.0-py3.11-cuda-devel.txt"), Path("locks/2.15.0-py3.11-cuda-devel.json"))
    assert lockfile.lock_paths(Path("locks"), arm) == (
        Path("locks/2.15.0-py3.11-cuda-devel.linux-arm64.txt"),
        Path("locks/2.15.0-py3.11-cuda-devel.linux-arm64.json"))
    assert lockfile.base_lock_path(Path("locks"), arm).name == \
        "2.15.0-py3.11-cuda-devel.linux-arm64.base.txt"
    reqs = lockfile.requirements(amd)
    assert lockfile.inputs_hash(amd, reqs) != lockfile.inputs_hash(arm, reqs)


def test_arm64_facts_are_its_own():
    m = matrix.load(ROOT / "matrix.yaml")
    arm = m.select(["id=2.15.0-py3.11-cuda-slim", "platform=linux/arm64"])[0]
    lock = lockfile.require_lock(ROOT / "locks", arm)
    assert lock.facts["platform"] == "linux/arm64"
    assert (lock.facts["cuda"], lock.facts["cudnn"], lock.facts["nccl"]) == ("13.2", "9.26.0",
                                                                             "2.30.7")
    assert lock.facts["min_driver"]


# ---- render ---------------------------------------------------------------------------------


def test_arm64_renders_a_registry_base_and_its_own_wheel_sets():
    m = matrix.load(ROOT / "matrix.yaml")
    amd, arm = m.select(["id=2.15.0-py3.11-cuda-slim"])
    r_amd = render.render(m, amd, lockfile.require_lock(ROOT / "locks", amd))
    r_arm = render.render(m, arm, lockfile.require_lock(ROOT / "locks", arm))
    assert "FROM torch-images-base:bookworm-slim AS os" in r_amd.dockerfile
    # by the digest the build verified (BASE_IMAGE), the floating tag only as its default
    assert "ARG BASE_IMAGE=127.0.0.1:5000/torch-base:bookworm-slim-arm64\n" in r_arm.dockerfile
    assert "FROM ${BASE_IMAGE} AS os" in r_arm.dockerfile
    assert "BASE_IMAGE" not in r_amd.dockerfile
    assert "locks/2.15.0-py3.11-cuda-slim.linux-arm64.txt" in r_arm.dockerfile
    assert r_arm.facts["platform"] == "linux/arm64" and "platform" not in r_amd.facts
    # Same lock text (hashes cover every platform) but different wheels: different sets.
    assert not {s.set_id for s in r_amd.steps} & {s.set_id for s in r_arm.steps}
    assert 'NVIDIA_REQUIRE_CUDA="cuda>=13.0"' in r_arm.dockerfile
    # One build context serves both platforms: each has its own folder for its uv wheel.
    assert f"source={render.uv_source()}," in r_amd.dockerfile
    assert f"source={render.uv_source(ARM.name)}," in r_arm.dockerfile
    assert f"source={render.uv_source()}," not in r_arm.dockerfile


def test_smoke_runs_a_foreign_image_with_its_platform():
    args = smoketest.docker_run_args("img", "sha256:1", name="n", digest=None, require_gpu=False,
                                 gpu_flags=[], timeout_scale=15.0, platform="linux/arm64")
    assert args[args.index("--platform") + 1] == "linux/arm64"
    assert args.index("--platform") < args.index("img")
    assert platforms.of_image({"Architecture": "arm64"}) == ARM


# ---- the image index ------------------------------------------------------------------------


def desc(n: int) -> oci.Descriptor:
    return oci.Descriptor(f"sha256:{n:064x}", oci.OCI_MANIFEST, 100 + n)


def test_index_lists_each_platform_once_in_a_fixed_order():
    doc = platforms.index_document([platforms.PlatformManifest(ARM, desc(2)),
                                    platforms.PlatformManifest(AMD, desc(1))])
    assert doc["mediaType"] == oci.OCI_INDEX
    assert [e["platform"] for e in doc["manifests"]] == [
        {"architecture": "amd64", "os": "linux"},
        {"architecture": "arm64", "os": "linux", "variant": "v8"}]
    assert [e["digest"] for e in doc["manifests"]] == [desc(1).digest, desc(2).digest]
    with pytest.raises(ConfigError):
        platforms.index_document([platforms.PlatformManifest(AMD, desc(1))] * 2)


class FakeRegistry:
    """Manifests by repository and reference, as far as assemble() uses them."""

    registry = "fake:5000"

    def __init__(self, present: list[str]) -> None:
        self.manifests: dict[str, tuple[bytes, str]] = {d: (b"{}", oci.OCI_MANIFEST)
                                                        for d in present}
        self.tags: dict[str, str] = {}

    def head(self, repository: str, ref: str) -> oci.Descriptor | None:
        digest = self.tags.get(ref, ref)
        return oci.Descriptor(digest, oci.OCI_MANIFEST, 1) if digest in self.manifests else None

    def put_manifest(self, repository: str, ref: str, body: bytes, media_type: str) -> str:
        self.manifests[oci.sha256(body)] = (body, media_type)
        return oci.sha256(body)

    push_index = oci.Registry.push_index

    def tag(self, repository: str, digest: str, tag: str) -> None:
        self.tags[tag] = digest


ARTIFACT = {"tag": "t", "digest": f"sha256:{9:064x}", "media_type": "x",
            "reference": f"r@sha256:{9:064x}"}


def planned_pair(m: matrix.Matrix, name: str = "2.15.0-py3.11-cuda-slim"
                 ) -> list[PlannedVariant]:
    return [plan.plan_variant(m, render.render_locked(m, v, ROOT / "locks"), None, "s")
            for v in m.select([f"id={name}"])]


@pytest.fixture
def promoted(monkeypatch):
    """publish_group against the fake registry: gate passes (unless a key is in `refuse`),
    promotion records the platform's digest; returns (registry, refuse, promoted keys)."""
    reg, refuse, done = FakeRegistry([]), {}, []
    monkeypatch.setattr(oci, "Registry", lambda addr: reg)

    def gate(matrix, p, *, allow_cpu_smoke, trust):
        emulated = json.dumps({"runner": {"emulated": p.variant.platform == "linux/arm64"}})
        return publish.Candidate(planned=p, image=p.local_tag, image_id="sha256:id" + p.variant.key,
                                 reason=refuse.get(p.variant.key, ""),
                                 evidence={"smoke": emulated.encode(), "sbom": b"{}"})

    def promote_with_evidence(matrix, cand):
        n = 1 if cand.planned.variant.platform == "linux/amd64" else 2
        reg.manifests[desc(n).digest] = (b"{}", oci.OCI_MANIFEST)
        done.append(cand.planned.variant.key)
        staged = Staged(matrix.registry, matrix.repository, desc(n), cand.image_id)
        return staged, {"sbom": ARTIFACT, "smoke_report": ARTIFACT, "provenance": ARTIFACT}

    def twin_promote(matrix, top, platforms, floating, platform_tags=None, audits=None):  # desc(10+n)
        if not matrix.zstd_twins:
            return None
        mine = {v.digest: dataclasses.replace(v, descriptor=desc(10 + n))
                for n, (v, _) in enumerate(platforms, 1)}
        for t in mine.values():
            reg.manifests[t.digest] = (b"{}", oci.OCI_MANIFEST)
        reg.manifests[desc(20).digest] = (b"{}", oci.OCI_INDEX)
        top_twin = mine.get(top.digest) or dataclasses.replace(top, descriptor=desc(20))
        return publish_flow.Twins(top_twin, mine, twin.Report())

    monkeypatch.setattr(publish_gate, "gate", gate)
    monkeypatch.setattr(publish_flow, "promote_with_evidence", promote_with_evidence)
    monkeypatch.setattr(publish_flow, "promote_twins", twin_promote)
    reg.audited = []  # type: ignore[attr-defined]
    monkeypatch.setattr(publish_flow.vuln_audit, "audit_published",
                        lambda staged, *_a: reg.audited.append(staged.digest))  # type: ignore[attr-defined]
    return reg, refuse, done


def test_publish_group_promotes_each_platform_then_points_every_tag_at_the_index(promoted):
    reg, _, done = promoted
    m = matrix.load(ROOT / "matrix.yaml")
    group = planned_pair(m)[::-1]  # arm64 first: the index still lists amd64 first
    [pub] = publish_flow.publish_group(m, group, allow_cpu_smoke=True, dry_run=False)
    index = json.loads(reg.manifests[pub["digest"]][0])
    assert index["mediaType"] == oci.OCI_INDEX
    assert [e["digest"] for e in index["manifests"]] == [desc(1).digest, desc(2).digest]
    assert done == [group[1].variant.key, group[0].variant.key]
    floating, alias = group[0].tags
    assert {reg.tags[t] for t in (floating, alias, pub["dated_tag"])} == {pub["digest"]}
    # each platform's content tag names its own manifest (what `builder plan` reads)
    assert reg.tags[group[1].hash_tag] == desc(1).digest
    assert reg.tags[group[0].hash_tag] == desc(2).digest
    assert [p["platform"] for p in pub["platforms"]] == ["linux/amd64", "linux/arm64"]
    assert [p["smoke_emulated"] for p in pub["platforms"]] == [False, True]
    assert pub["platforms"][1]["digest"] == desc(2).digest
    assert pub["hash_tag"] == group[1].hash_tag and group[0].hash_tag in pub["tags"]
    assert reg.audited == [desc(1).digest, desc(2).digest]  # audited by default, each platform


def test_publish_group_gives_every_tag_a_zstd_twin_unless_compression_is_gzip(promoted):
    reg, _, _ = promoted
    m = matrix.load(ROOT / "matrix.yaml")
    group = planned_pair(m)
    [pub] = publish_flow.publish_group(m, group, allow_cpu_smoke=True, dry_run=False)
    twins = {t: reg.tags[t] for t in reg.tags if t.endswith("-zstd")}
    floating, alias = group[0].tags
    assert pub["zstd"]["digest"] == desc(20).digest
    assert pub["zstd"]["tags"] == [f"{t}-zstd" for t in (pub["dated_tag"], floating, alias,
                                                          group[0].hash_tag, group[1].hash_tag)]
    assert {twins[f"{t}-zstd"] for t in (pub["dated_tag"], floating, alias)} == {desc(20).digest}
    assert twins[f"{group[0].hash_tag}-zstd"] == desc(11).digest  # each platform's own twin
    reg.tags.clear()
    gzip_only = dataclasses.replace(m, compression=("gzip",))
    [pub] = publish_flow.publish_group(gzip_only, group, allow_cpu_smoke=True, dry_run=False)
    assert "zstd" not in pub and not [t for t in reg.tags if t.endswith("-zstd")]


def test_a_new_promotion_step_is_one_line_in_steps(promoted, monkeypatch):
    """The next promotion artifact is one function and one line: a step added to STEPS (here
    one that records what it saw) runs between the twin and the signature, and the variant is
    published as before, tags last."""
    reg, _, _ = promoted
    m = matrix.load(ROOT / "matrix.yaml")
    seen = []

    def attest_more(run, g):
        seen.append((g.top.digest, dict(reg.tags)))
        return g

    steps = list(publish_flow.STEPS)
    assert [s.__name__ for s in steps] == ["same_tags", "gate", "promote", "audit_step", "index",
                                           "twin_step", "sign_step", "tags_step", "record_step"]
    steps.insert(steps.index(publish_flow.sign_step), attest_more)
    monkeypatch.setattr(publish_flow, "STEPS", tuple(steps))
    group = planned_pair(m)
    [pub] = publish_flow.publish_group(m, group, allow_cpu_smoke=True, dry_run=False)
    assert pub["status"] == "published"
    [(digest, tags_then)] = seen
    assert digest == pub["digest"]
    assert not set(tags_then) & set(pub["tags"][:1] + list(group[0].tags))  # none written yet
    assert {reg.tags[t] for t in group[0].tags} == {pub["digest"]}


def test_one_refused_or_unselected_platform_refuses_the_variant(promoted):
    reg, refuse, done = promoted
    m = matrix.load(ROOT / "matrix.yaml")
    amd, arm = planned_pair(m)
    refuse[arm.variant.key] = "the smoke report failed"
    results = publish_flow.publish_group(m, [amd, arm], allow_cpu_smoke=True, dry_run=False)
    assert [(r["id"], r["status"]) for r in results] == [(arm.variant.id, "refused")]
    assert results[0]["reason"] == "linux/arm64: the smoke report failed"
    [alone] = publish_flow.publish_group(m, [amd], allow_cpu_smoke=True, dry_run=False)
    assert alone["status"] == "refused" and alone["missing_platforms"] == ["linux/arm64"]
    assert "platform=" not in alone["reason"]  # a hint names only what the user typed
    assert reg.tags == {} and done == []


def test_platforms_that_disagree_on_the_tag_are_refused(promoted):
    m = matrix.load(ROOT / "matrix.yaml")
    amd, arm = planned_pair(m)
    other = dataclasses.replace(arm, tags=("2.15.0-py3.11-cuda13.0-cudnn9-slim",))
    with pytest.raises(ConfigError, match="different tags"):
        publish_flow.publish_group(m, [amd, other], allow_cpu_smoke=True, dry_run=False)


def test_an_index_lists_only_manifests_already_in_the_repository():
    m = matrix.load(ROOT / "matrix.yaml")
    reg = FakeRegistry([desc(1).digest])
    doc = platforms.index_document([platforms.PlatformManifest(AMD, desc(1)),
                                    platforms.PlatformManifest(ARM, desc(2))])
    with pytest.raises(oci.RegistryError, match="no manifest"):
        reg.push_index(m.repository, doc)


def test_wheelhouse_takes_the_wheel_of_the_platform(tmp_path):
    """A lock line carries the hashes of every platform's wheels; the x86_64 wheel already in
    the wheelhouse must not end up in an arm64 image."""
    wh = wheelhouse.Wheelhouse(tmp_path)
    for n, name in enumerate(WHEELS):
        (tmp_path / name).write_bytes(b"w")
        wh.index[f"{n:064x}"] = name
    hashes = [f"{0:064x}", f"{1:064x}"]
    assert wh.find(hashes, "3.11", AMD.name).name == WHEELS[0]
    assert wh.find(hashes, "3.11", ARM.name).name == WHEELS[1]
    assert wh.find(hashes[:1], "3.11", ARM.name) is None
    assert wh.find(hashes, None, ARM.name).name == WHEELS[1]


def test_a_linux_amd64_only_variant_keeps_a_plain_manifest():
    m = matrix.load(ROOT / "matrix.yaml")
    assert not publish_flow.is_multi(m, m.variant("2.13.0-py3.11-cpu-runtime"))
    assert publish_flow.is_multi(m, m.variant("2.15.0-py3.11-cuda-slim"))


def test_lock_refuses_a_cpu_only_resolution_for_a_cuda_platform():
    m = matrix.load(ROOT / "matrix.yaml")
    arm = m.select(["id=2.15.0-py3.11-cuda-slim", "platform=linux/arm64"])[0]
    facts = locks.derive_facts(arm, "torch==2.9.1 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    [problem] = locks.check_facts(arm, facts, m)
    assert "linux/arm64" in problem and "CPU-only" in problem


def test_plan_names_each_platform_and_tags_it_apart_locally():
    m = matrix.load(ROOT / "matrix.yaml")
    amd, arm = m.select(["id=2.15.0-py3.11-cuda-slim"])
    p_amd = plan.plan_variant(m, render.render_locked(m, amd, ROOT / "locks"), None, "s")
    p_arm = plan.plan_variant(m, render.render_locked(m, arm, ROOT / "locks"), None, "s")
    assert p_amd.tags == p_arm.tags  # one tag for both: the index
    assert (p_amd.local_tag, p_arm.local_tag) == (p_amd.floating_tag,
                                                  p_amd.floating_tag + ".linux-arm64")
    assert p_amd.content_hash != p_arm.content_hash
    entry = p_arm.as_json(m)
    assert (entry["platform"], entry["key"]) == ("linux/arm64", arm.key)
