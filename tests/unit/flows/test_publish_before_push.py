"""What publish checks before its first push (colliding tags, an unreadable or invalid
published.json), and that each variant is recorded as soon as it is published."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from matrix_files import CPU, LOCKS, ROOT, SLIM_TAG

from builder.core import engine
from builder.core.errors import BuilderError, ConfigError
from builder.flows import publish as publish_flow
from builder.model import matrix, publication
from builder.model.planned import PlannedVariant
from builder.stages import plan, publish, render


def test_an_alias_equal_to_another_variants_floating_tag_stops_publish_before_any_push(
        monkeypatch):
    m = matrix.load(ROOT / "matrix.yaml")
    hostile = dataclasses.replace(m, aliases=(
        *m.aliases, matrix.Alias(SLIM_TAG, {"torch": "2.15.0", "python": "3.12",
                                            "flavor": "slim"})))
    problems = plan.tag_problems(hostile, LOCKS)
    assert any(f"tag `{SLIM_TAG}` would be written by 2.15.0-py3.11-cuda-slim (floating)" in p
               for p in problems)

    def no_engine() -> None:
        pytest.fail("publish reached the engine before checking the tags")

    monkeypatch.setattr(engine, "ensure_engine", no_engine)
    with pytest.raises(ConfigError, match="tags collide"):
        publish_flow.publish_variants(hostile, [], allow_cpu_smoke=True, dry_run=True,
                                 manifest=Path("unused.json"), locks_dir=LOCKS)


SLIM = "2.13.0-py3.11-cpu-slim"


@pytest.fixture(scope="module")
def shipped_plan() -> tuple[matrix.Matrix, list[PlannedVariant]]:
    m = matrix.load(ROOT / "matrix.yaml")
    rendered = [render.render_locked(m, m.variant(vid), LOCKS) for vid in (CPU, SLIM)]
    return m, plan.make_plan(m, rendered, {}, check_registry=False)


@pytest.fixture
def pushes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Stand-ins for the engine and the per-variant publication: what would have been pushed."""
    pushed: list[str] = []

    def publish_group(_m, group, **_kw):
        [p] = group
        pushed.append(p.variant.id)
        if p.variant.id == SLIM:
            raise publish.RegistryError("the registry went away")
        return [{"id": p.variant.id, "status": "published", **RECORD}]

    monkeypatch.setattr(publish_flow.engine, "ensure_engine", lambda: None)
    monkeypatch.setattr(publish_flow, "publish_group", publish_group)
    monkeypatch.setattr(publish_flow.record, "history", lambda *_a: {})  # nothing published yet
    return pushed


RECORD = {"date": "2026-12-04", "published_at": "2026-12-04T00:00:00Z",
          "registry": "127.0.0.1:5000", "repository": "torch", "digest": "sha256:" + "a" * 64,
          "reference": "127.0.0.1:5000/torch@sha256:" + "a" * 64, "image_id": "sha256:" + "b" * 64,
          "content_hash": "c" * 64, "tags": ["t-20261204", "build-" + "d" * 20, "t"],
          "dated_tag": "t-20261204", "hash_tag": "build-" + "d" * 20, "floating_tag": "t", "aliases": [],
          "torch": "2.13.0+cpu", "python": "3.11", "accelerator": "cpu", "cuda": None,
          "cudnn": None, "nccl": None, "min_driver": None, "flavor": "runtime",
          **{kind: {"tag": f"sha256-{'a' * 64}.{kind}", "digest": "sha256:" + "e" * 64,
                    "media_type": "application/json",
                    "reference": "127.0.0.1:5000/torch@sha256:" + "e" * 64}
             for kind in ("sbom", "smoke_report", "provenance")},
          "smoke_gpu": False,
          "allow_cpu_smoke": False}


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "is not JSON"),
    ('{"schema_version": 1}', "'variants' is a required property"),
    (None, "is a folder"),
])
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_bad_record_stops_publish_before_any_push(tmp_path, shipped_plan, pushes, content,
                                                    message, dry_run):
    m, planned = shipped_plan
    manifest = tmp_path / "published.json"
    if content is None:
        manifest.mkdir()
    else:
        manifest.write_text(content)
    with pytest.raises(BuilderError, match=message):
        publish_flow.publish_variants(m, planned, allow_cpu_smoke=True, dry_run=dry_run,
                                   manifest=manifest, locks_dir=LOCKS)
    assert pushes == []


def test_a_variant_is_recorded_as_soon_as_it_is_published(tmp_path, shipped_plan, pushes):
    """The first variant's record is on disk although the second fails (and stays there when
    the run is stopped later)."""
    m, planned = shipped_plan
    manifest = tmp_path / "published.json"
    with pytest.raises(publish.RegistryError, match="went away"):
        publish_flow.publish_variants(m, planned, allow_cpu_smoke=True, manifest=manifest,
                                   locks_dir=LOCKS)
    assert pushes == [CPU, SLIM]
    assert list(publication.load_document(manifest)["variants"]) == [CPU]


def test_an_already_published_variant_is_in_the_report_too(tmp_path, shipped_plan, pushes,
                                                           monkeypatch):
    """The report lists each selected variant's publication: the CPU runtime, already in the
    registry with this content, is reported as found there and not pushed again."""
    m, planned = shipped_plan
    [cpu] = [p for p in planned if p.variant.id == CPU]
    held = publication.Publication.from_json({**RECORD, "content_hash": cpu.content_hash})
    monkeypatch.setattr(publish_flow.record, "history", lambda *_a: {CPU: [held]})
    monkeypatch.setattr(publish_flow.tag_repair, "repair", lambda *_a: [])
    manifest = tmp_path / "published.json"
    with pytest.raises(publish.RegistryError, match="went away"):
        publish_flow.publish_variants(m, planned, allow_cpu_smoke=True, manifest=manifest,
                                      locks_dir=LOCKS)
    assert pushes == [SLIM]
    [entry] = publication.load_document(manifest)["variants"][CPU]["publications"]
    assert entry["digest"] == RECORD["digest"]
