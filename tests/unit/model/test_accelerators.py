"""The accelerator table: every gate reads its row, and an accelerator not in the table (a third
value added to a test matrix) needs GPU evidence at publish and in verify."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from matrix_files import CPU, LOCKS, ROOT

from builder.core import labels
from builder.flows import verify
from builder.model import accelerators, catalog_page, matrix
from builder.stages import plan, publish, render
from smoke.checks import CHECKS, GPU_CHECKS

IMAGE_ID = "sha256:" + "c0ffee" * 10 + "abcd"
THIRD = "rocm"  # not in the table


def smoke_report(accelerator: str, gpu_status: str) -> dict[str, Any]:
    """A passing report made on a host without GPUs: the GPU checks stood in on the CPU."""
    return {
        "schema_version": 1, "image": {"ref": None, "id": IMAGE_ID, "digest": None},
        "facts": {"accelerator": accelerator, "torch": "2.13.0+cpu", "python": "3.11",
                  "flavor": "runtime"},
        "host": {"gpus": [], "driver": None}, "require_gpu": False,
        "started": "2026-01-02T00:00:00+00:00", "finished": "2026-01-02T00:01:00+00:00",
        "status": "pass",
        "checks": [{"name": n, "status": gpu_status if n in GPU_CHECKS else "pass",
                    "duration_s": 0.1, "message": n, "metrics": {}} for n in CHECKS]}


@pytest.fixture(scope="module")
def third_accelerator() -> publish.Candidate:
    """The shipped CPU variant, its matrix row's accelerator replaced by one the table lacks."""
    m = matrix.load(ROOT / "matrix.yaml")
    [planned] = plan.make_plan(m, [render.render_locked(m, m.variant(CPU), LOCKS)], {},
                               check_registry=False)
    odd = dataclasses.replace(planned, variant=dataclasses.replace(planned.variant,
                                                                   accelerator=THIRD))
    return publish.Candidate(planned=odd, image="local/torch:x", image_id=IMAGE_ID)


def test_the_table_covers_the_matrix_schema_and_an_unknown_name_fails_closed() -> None:
    schema = json.loads((ROOT / "builder" / "schema" / "matrix.schema.json").read_text())
    assert set(schema["$defs"]["accelerator"]["enum"]) == set(accelerators.KNOWN)
    assert not accelerators.needs_gpu_evidence("cpu")
    assert accelerators.needs_gpu_evidence("cuda")
    assert accelerators.needs_gpu_evidence(THIRD)
    assert accelerators.needs_gpu_evidence(None)


def test_publish_refuses_a_third_accelerator_smoked_without_a_gpu(third_accelerator) -> None:
    cand = dataclasses.replace(third_accelerator, evidence={
        "smoke": json.dumps(smoke_report(THIRD, "substituted")).encode()})
    why = publish.smoke_gate(cand, allow_cpu_smoke=False)
    assert why == (f"the smoke report of this {THIRD} image was made without --require-gpu: "
                   "run `builder smoke IMAGE --require-gpu` on a host with NVIDIA GPUs")
    # the waiver lets it through, and is recorded
    assert publish.smoke_gate(cand, allow_cpu_smoke=True) == ""
    assert cand.allow_cpu_smoke and not cand.smoke_gpu


def test_the_cpu_row_needs_no_gpu_evidence_at_publish(third_accelerator) -> None:
    cpu = dataclasses.replace(third_accelerator, planned=dataclasses.replace(
        third_accelerator.planned, variant=dataclasses.replace(
            third_accelerator.planned.variant, accelerator="cpu")),
        evidence={"smoke": json.dumps(smoke_report("cpu", "skip")).encode()})
    assert publish.smoke_gate(cpu, allow_cpu_smoke=False) == ""
    assert not cpu.allow_cpu_smoke


def test_verify_wants_gpu_evidence_for_a_third_accelerator() -> None:
    image_labels = {labels.TORCH: "2.13.0+cpu", labels.ACCELERATOR: THIRD,
                    labels.FLAVOR: "runtime"}
    doc = smoke_report(THIRD, "substituted")
    [row, *_] = verify.smoke_rows(doc, IMAGE_ID, image_labels)
    assert row.status == verify.CPU_ONLY and row.detail.startswith("GPU checks not run on a GPU")
    [strict, *_] = verify.smoke_rows(doc, IMAGE_ID, image_labels,
                                     verify.Policy(require_gpu=True))
    assert strict.status == verify.BAD


def test_the_catalog_calls_a_third_accelerator_smoked_without_a_gpu_a_stand_in() -> None:
    smoke = {"present": True, "status": "pass", "host": {"gpus": []}, "checks": []}
    assert catalog_page.smoke_verdict(smoke, THIRD)["state"] == "stand-in"
    assert catalog_page.smoke_verdict(smoke, "cpu")["state"] == "not-applicable"
    assert catalog_page.check_status({"name": sorted(GPU_CHECKS)[0], "status": "skip"}, THIRD)[1] == \
        "standin"


def test_the_smoke_report_schema_leaves_the_accelerator_to_the_table() -> None:
    path = ROOT / "smoke" / "report.schema.json"
    facts = json.loads(path.read_text())["properties"]["facts"]["properties"]
    assert "enum" not in facts["accelerator"]
