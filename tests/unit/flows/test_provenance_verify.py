"""Provenance statements from labels, and the parts of `builder verify` that need no registry."""

from __future__ import annotations

import pytest

from builder.core import labels
from builder.core.errors import BuilderError
from builder.flows import verify
from builder.model import provenance_doc
from builder.stages import provenance
from smoke.checks import CHECKS, GPU_CHECKS

DIGEST = "sha256:" + "d" * 64
LABELS = {
    labels.OCI + "revision": "0123456789abcdef", labels.OCI + "source": "https://example.org/r",
    labels.OCI + "base.digest": "sha256:" + "b" * 64, labels.OCI + "base.name": "debian",
    labels.VARIANT: "2.13.0-py3.11-cpu-runtime", labels.LOCK_HASH: "c" * 64,
    labels.CONTENT_HASH: "e" * 64, labels.TORCH: "2.13.0+cpu", labels.PYTHON: "3.11",
    labels.ACCELERATOR: "cpu", labels.FLAVOR: "runtime",
}


def test_statement_names_commit_lock_and_base_by_uri() -> None:
    doc = provenance.statement("r.example/torch", DIGEST, LABELS, environ={})
    assert doc["subject"] == [{"name": "r.example/torch", "digest": {"sha256": "d" * 64}}]
    deps = doc["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert [(d["uri"], d["digest"]) for d in deps] == [
        ("git+https://example.org/r@0123456789abcdef", {"gitCommit": "0123456789abcdef"}),
        ("git+https://example.org/r@0123456789abcdef#locks/2.13.0-py3.11-cpu-runtime.txt",
         {"sha256": "c" * 64}),
        ("pkg:docker/debian", {"sha256": "b" * 64})]
    roles = provenance_doc.dependencies_by_role(doc)
    assert roles["lock"]["name"] == "locks/2.13.0-py3.11-cpu-runtime.txt"
    assert roles["base"]["name"] == "debian"
    assert doc["predicate"]["runDetails"]["builder"]["id"] == "pkg:pypi/torch-images@0.1.0"
    assert provenance.problems(doc, DIGEST, LABELS) == []


def test_in_ci_the_builder_is_the_workflow() -> None:
    environ = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "o/r",
               "GITHUB_WORKFLOW_REF": "o/r/.github/workflows/build.yml@refs/heads/main",
               "GITHUB_RUN_ID": "7", "GITHUB_RUN_ATTEMPT": "2"}
    bootstrapped = {**LABELS, labels.OCI + "base.name": "mmdebstrap:bookworm"}
    doc = provenance.statement("r/torch", DIGEST, bootstrapped, environ=environ)
    run = doc["predicate"]["runDetails"]
    assert run["builder"]["id"] == ("https://github.com/o/r/.github/workflows/build.yml"
                                    "@refs/heads/main")
    assert run["metadata"]["invocationId"] == "https://github.com/o/r/actions/runs/7/attempts/2"
    deps = doc["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert deps[2]["uri"] == "pkg:generic/mmdebstrap@bookworm"
    assert provenance.base_uri("docker.io/library/debian:bookworm-slim") == (
        "pkg:docker/docker.io/library/debian@bookworm-slim")


def test_without_a_source_url_every_uri_is_still_a_uri() -> None:
    local = {k: v for k, v in LABELS.items() if k != labels.OCI + "source"}
    doc = provenance.statement("r/torch", DIGEST, local, environ={})
    deps = doc["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert deps[0]["uri"] == "urn:torch-images:lock:2.13.0-py3.11-cpu-runtime"
    assert provenance.problems(doc, DIGEST, local) == []
    doc["predicate"]["buildDefinition"]["resolvedDependencies"][0]["uri"] = "git"
    doc["predicate"]["runDetails"]["builder"]["id"] = "torch-images builder 0.1.0"
    assert provenance.problems(doc, DIGEST, local) == [
        "not URIs: git, torch-images builder 0.1.0"]


def test_statement_of_another_image_or_commit_is_refused() -> None:
    doc = provenance.statement("r/torch", DIGEST, LABELS)
    other = "sha256:" + "f" * 64
    assert provenance.problems(doc, other, LABELS) == [f"its subject is not {other}"]
    moved = {**LABELS, labels.OCI + "revision": "fedcba"}
    assert provenance.problems(doc, DIGEST, moved) == ["its revision differs from the image's label"]
    assert provenance.problems({"x": 1}, DIGEST, LABELS) == ["not an in-toto v1 statement"]


def test_reference_parsing() -> None:
    ref = verify.Reference.parse(f"127.0.0.1:5000/torch@{DIGEST}")
    assert (ref.registry, ref.repository, ref.ref) == ("127.0.0.1:5000", "torch", DIGEST)
    tagged = verify.Reference.parse("r.example/team/torch:2.13.0-py3.11-cpu-runtime")
    assert (tagged.repository, tagged.ref) == ("team/torch", "2.13.0-py3.11-cpu-runtime")
    for bad in ("torch", "127.0.0.1:5000/torch"):
        with pytest.raises(BuilderError, match="is not REGISTRY/REPOSITORY@sha256:DIGEST"):
            verify.Reference.parse(bad)


def test_labels_row_lists_versions_or_what_is_missing() -> None:
    assert verify.label_row(LABELS).status == verify.OK
    row = verify.label_row({k: v for k, v in LABELS.items() if k != labels.LOCK_HASH})
    assert row.status == verify.BAD and labels.LOCK_HASH in row.detail


def report(image_id: str | None, accelerator: str, checks: dict[str, str]) -> dict:
    return {
        "schema_version": 1, "image": {"ref": None, "id": image_id, "digest": None},
        "facts": {"accelerator": accelerator, "torch": "2.13.0+cpu", "python": "3.11",
                  "flavor": "runtime"},
        "host": {"gpus": [], "driver": None}, "require_gpu": False,
        "started": "2026-01-02T00:00:00+00:00", "finished": "2026-01-02T00:01:00+00:00",
        "status": "pass",
        "checks": [{"name": n, "status": s, "duration_s": 0.1, "message": n, "metrics": {}}
                   for n, s in checks.items()]}


def every_check(gpu_status: str) -> dict[str, str]:
    return {name: gpu_status if name in GPU_CHECKS else "pass" for name in CHECKS}


def test_a_cuda_smoke_with_cpu_stand_ins_says_so_in_its_status() -> None:
    cuda = {**LABELS, labels.ACCELERATOR: "cuda"}
    doc = report(DIGEST, "cuda", every_check("substituted"))
    [row, *_] = verify.smoke_rows(doc, DIGEST, cuda)
    assert row.status == verify.CPU_ONLY and row.status in verify.PASSING
    assert row.detail.startswith("GPU checks not run on a GPU (")
    [strict, *_] = verify.smoke_rows(doc, DIGEST, cuda, verify.Policy(require_gpu=True))
    assert strict.status == verify.BAD


def test_a_smoke_report_must_name_this_image_and_list_every_check() -> None:
    [row, *_] = verify.smoke_rows(report(DIGEST, "cpu", every_check("pass")), DIGEST, LABELS)
    assert row.status == verify.OK
    [empty, *_] = verify.smoke_rows(report(DIGEST, "cpu", {}), DIGEST, LABELS)
    assert empty.status == verify.BAD and "lacks required checks: env, cuda" in empty.detail
    [nameless, *_] = verify.smoke_rows(report(None, "cpu", every_check("pass")), DIGEST, LABELS)
    assert nameless.status == verify.BAD and "it ran on image None" in nameless.detail


def test_a_versioned_tag_must_name_the_image_it_points_at() -> None:
    from builder.flows import verify_tags

    assert verify_tags.label_problems("2.13.0-py3.11-cpu-runtime", [LABELS]) == ""
    assert verify_tags.label_problems("2.13.0-py3.11-cpu-runtime-20260102.1", [LABELS]) == ""
    moved = verify_tags.label_problems("2.15.0-py3.11-cuda13.2-cudnn9-slim", [LABELS])
    assert "torch 2.15.0 ≠ label '2.13.0'" in moved and "accelerator cuda ≠ label 'cpu'" in moved
    assert "cuda 13.2 ≠ label ''" in moved and "flavor slim ≠ label 'runtime'" in moved
    # the CUDA parts alone: a CUDA-named tag on the CPU image of the same torch/python/flavor
    cuda_named = verify_tags.label_problems("2.13.0-py3.11-cuda12.8-cudnn9-runtime", [LABELS])
    assert cuda_named == ("accelerator cuda ≠ label 'cpu'; cuda 12.8 ≠ label ''; "
                          "cudnn 9 ≠ label ''")
    gpu = {**LABELS, labels.ACCELERATOR: "cuda", labels.CUDA: "12.8", labels.CUDNN: "9.10.2.21"}
    assert verify_tags.label_problems("2.13.0-py3.11-cuda12.8-cudnn9-runtime", [gpu]) == ""
    assert "no cuda in the tag" in verify_tags.label_problems("2.13.0-py3.11-cpu-runtime", [gpu])
    # every platform of an index must agree
    assert "python 3.11 ≠ label '3.12'" in verify_tags.label_problems(
        "2.13.0-py3.11-cpu-runtime", [LABELS, {**LABELS, labels.PYTHON: "3.12"}])
    assert verify_tags.label_problems("build-" + "e" * 20, [LABELS]) == ""
    assert "content hash" in verify_tags.label_problems("build-" + "f" * 20, [LABELS])
    # a zstd twin's hash tag names the same content hash (it failed verify before)
    assert verify_tags.label_problems("build-" + "e" * 20 + "-zstd", [LABELS]) == ""
    assert "content hash" in verify_tags.label_problems("build-" + "f" * 20 + "-zstd", [LABELS])
    assert verify_tags.label_problems("latest-runtime", [LABELS]) == ""  # an alias: no grammar


def test_verify_shows_a_publication_made_with_unsigned() -> None:
    doc = provenance.statement("r/torch", DIGEST, LABELS, environ={})
    assert "--unsigned" not in verify.provenance_row(doc, DIGEST, LABELS).detail
    doc["predicate"]["buildDefinition"]["internalParameters"]["unsigned_staging"] = True
    row = verify.provenance_row(doc, DIGEST, LABELS)
    assert row.status == verify.OK and "published with --unsigned" in row.detail


def test_a_dirty_tree_build_says_so_with_its_diff_and_the_build_times_are_real() -> None:
    dirty = {**LABELS, labels.SOURCE_DIRTY: "true", labels.SOURCE_DIFF: "sha256:" + "f" * 64,
             labels.OCI + "created": "2026-01-01T00:00:00Z"}
    times = {"startedOn": "2026-12-06T01:00:00Z", "finishedOn": "2026-12-06T01:03:00Z"}
    doc = provenance.statement("r/torch", DIGEST, dirty, environ={}, times=times)
    params = doc["predicate"]["buildDefinition"]["externalParameters"]
    assert (params["dirty"], params["diff"]) == (True, "sha256:" + "f" * 64)
    assert doc["predicate"]["runDetails"]["metadata"] == times  # not the lock's commit time
    clean = provenance.statement("r/torch", DIGEST, {**LABELS, labels.SOURCE_DIRTY: "false"},
                                 environ={})
    assert clean["predicate"]["buildDefinition"]["externalParameters"]["dirty"] is False
    assert "finishedOn" not in clean["predicate"]["runDetails"]["metadata"]  # built elsewhere
    older = provenance.statement("r/torch", DIGEST, LABELS, environ={})
    assert older["predicate"]["buildDefinition"]["externalParameters"]["dirty"] is None
