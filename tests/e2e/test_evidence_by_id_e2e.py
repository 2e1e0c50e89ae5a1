"""Evidence by image id, for real: the CPU runtime built (smoke test and SBOM made), its image
removed with `docker image rm`, built again from the build cache: the reproducible build gives
the same image id, and the second build reuses that id's smoke report and SBOM instead of
smoking the image again."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers import private_matrix, remove_images_of, run_builder

from builder.core import engine

pytestmark = pytest.mark.docker

CPU = "2.13.0-py3.11-cpu-runtime"


@pytest.fixture
def private(tmp_path: Path):
    """A repository name and a state folder of this test's own, its images removed after."""
    matrix = private_matrix(tmp_path)
    yield {"matrix": matrix, "env": {**os.environ, "BUILDER_STATE": str(tmp_path / "state")},
           "state": tmp_path / "state"}
    remove_images_of(matrix)


def build(private: dict) -> tuple[dict, str]:
    """`builder build --json` of the CPU runtime: its outcome and the progress it printed."""
    result = run_builder("build", "--select", f"id={CPU}", "--json",
                         matrix=private["matrix"], env=private["env"])
    [outcome] = json.loads(result.stdout)
    return outcome, result.stderr


def test_a_rebuild_with_the_same_image_id_reuses_its_smoke_report_and_sbom(private):
    first, _ = build(private)
    assert first["state"] == "built" and first["smoke"].startswith("pass"), first
    assert first["reused"] == []
    image_id = first["image_id"]
    report = private["state"] / "reports" / f"{image_id.split(':')[1]}.json"
    sbom = Path(first["sbom_path"])
    stamps = (report.stat().st_mtime_ns, sbom.stat().st_mtime_ns)

    engine.docker("image", "rm", first["image"])
    assert engine.inspect_image(first["image"]) is None
    second, progress = build(private)
    assert second["state"] == "built"  # built again: the plan found no image
    assert second["image_id"] == image_id  # reproducible: the same bytes, the same id
    assert second["reused"] == ["smoke", "sbom"]
    assert f"[{CPU}] reused the smoke report and SBOM" in progress
    assert f"[{CPU}] smoke\n" not in progress and f"[{CPU}] sbom\n" not in progress, progress
    assert (report.stat().st_mtime_ns, sbom.stat().st_mtime_ns) == stamps  # not made again
    assert (second["smoke"], second["sbom_components"]) == (first["smoke"],
                                                            first["sbom_components"])
