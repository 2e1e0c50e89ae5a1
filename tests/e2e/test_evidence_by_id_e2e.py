"""Evidence by image id, for real: the CPU runtime built (smoke test and SBOM made: the session's
build, fixtures_published), then built again from the build cache by a runner whose state folder
holds what that build left and whose engine has no image under the name it builds (as after
`docker image rm`): the reproducible build gives the same image id, and the second build reuses
that id's smoke report and SBOM instead of smoking the image again.

The name is the session's matrix moved to another registry (one of this module's own): the
image id is a function of the content and the labels, which name the repository, not the
registry. Nothing is pushed; the state folder is this test's own copy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures_published import CPU, Publication, evidence_state, moved_matrix, own_registry
from helpers import run_builder

from builder.core import engine

pytestmark = pytest.mark.docker


def test_a_rebuild_with_the_same_image_id_reuses_its_smoke_report_and_sbom(
        shared_publication: Publication, tmp_path: Path) -> None:
    first = shared_publication.built
    assert first["state"] == "built" and first["smoke"].startswith("pass"), first
    assert first["reused"] == []  # the session's build made them
    image_id = first["image_id"]
    state = evidence_state(shared_publication, tmp_path / "state")
    report = state / "reports" / f"{image_id.split(':')[1]}.json"
    sbom = state / "sbom" / Path(first["sbom_path"]).name
    stamps = (report.stat().st_mtime_ns, sbom.stat().st_mtime_ns)

    with own_registry(tmp_path) as addr:
        matrix = moved_matrix(shared_publication, tmp_path, addr)
        image = first["image"].replace(shared_publication.addr, addr, 1)
        assert engine.inspect_image(image) is None
        result = run_builder("build", "--select", f"id={CPU}", "--json", matrix=matrix,
                             env={**shared_publication.env, "BUILDER_STATE": str(state)})
    [second] = json.loads(result.stdout)
    progress = result.stderr
    assert second["image"] == image and second["state"] == "built"  # the plan found no image
    assert second["image_id"] == image_id  # reproducible: the same bytes, the same id
    assert second["reused"] == ["smoke", "sbom"]
    assert f"[{CPU}] reused the smoke report and SBOM" in progress
    assert f"[{CPU}] smoke\n" not in progress and f"[{CPU}] sbom\n" not in progress, progress
    assert (report.stat().st_mtime_ns, sbom.stat().st_mtime_ns) == stamps  # not made again
    assert (second["smoke"], second["sbom_components"]) == (first["smoke"],
                                                            first["sbom_components"])
