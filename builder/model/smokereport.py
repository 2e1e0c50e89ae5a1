"""A smoke report judged: schema-valid, passed (the publish gate's rule), summarized.

Pure functions of the report document (the suite's own check names and statuses come from
`smoke/`), read by the step that runs the suite, the build flow, the publish gate and verify.
"""

from __future__ import annotations

import json
import textwrap
from functools import cache
from pathlib import Path
from typing import Any

from builder.model import accelerators
from smoke import OK_STATUSES, STATUSES
from smoke.checks import CHECKS, gpu_checks_not_run

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "smoke" / "report.schema.json"


@cache
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def validation_error(report: Any) -> str | None:
    """The first schema violation, as `path: message`, or None."""
    import jsonschema  # slow import; only when validating

    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(report), key=lambda e: list(e.absolute_path))
    if not errors:
        return None
    first = errors[0]
    where = "/".join(str(p) for p in first.absolute_path) or "(root)"
    return f"{where}: {first.message}"



def _describe_failures(report: dict[str, Any]) -> str:
    bad = [c for c in report.get("checks", []) if c.get("status") not in OK_STATUSES]
    return "; ".join(
        f"{c.get('name')} {c.get('status')}: {(c.get('message') or '').splitlines()[0][:200]}"
        if c.get("message") else f"{c.get('name')} {c.get('status')}" for c in bad
    )


def _only_gpu_demand_failed(report: dict[str, Any], require_gpu: bool) -> bool:
    """A --require-gpu run on a host without GPUs fails checks that otherwise stood in honestly
    (skip/substituted). When the gate does not demand a GPU, those count as what they were."""
    if require_gpu or not report.get("require_gpu"):
        return False
    return all(c.get("status") in OK_STATUSES or c.get("original_status") in OK_STATUSES
               for c in report.get("checks", []))


def summary(report: dict[str, Any] | None) -> str:
    """One cell for `builder build`'s table: `pass`, `pass (3 CPU stand-ins, cuda skipped: no
    GPU visible)`, `FAIL: cudnn_conv`, or `-` (not run)."""
    if report is None:
        return "-"
    checks = report.get("checks") or []
    if report.get("status") != "pass":
        bad = [c.get("name", "?") for c in checks if c.get("status") not in OK_STATUSES]
        return "FAIL: " + (", ".join(bad) or str(report.get("status")))
    stand_ins = sum(c.get("status") == "substituted" for c in checks)
    parts = [f"{stand_ins} CPU stand-in{'s' * (stand_ins != 1)}"] if stand_ins else []
    skipped: dict[str, list[str]] = {}
    for c in checks:
        if c.get("status") == "skip":
            why = (c.get("message") or "").split(":", 1)[0].split(" (", 1)[0].strip()
            skipped.setdefault(textwrap.shorten(why, 40, placeholder="…"), []).append(
                c.get("name", "?"))
    parts += [f"{', '.join(names)} skipped" + (f": {why}" if why else "")
              for why, names in skipped.items()]
    degraded = [c.get("name", "?") for c in checks if c.get("status") == "degraded"]
    parts += [f"{', '.join(degraded)} degraded"] if degraded else []
    return "pass" + (f" ({', '.join(parts)})" if parts else "")


def required_checks_missing(report: dict[str, Any]) -> list[str]:
    """The suite's checks that the report does not list with a status: every one is required
    (one that does not apply to a flavor reports `skip`, saying why)."""
    have = {c.get("name") for c in report.get("checks") or [] if c.get("status") in STATUSES}
    return [name for name in CHECKS if name not in have]


def report_passed(report: dict[str, Any] | None, *, require_gpu: bool) -> tuple[bool, str]:
    """The publish gate. With `require_gpu`, a CUDA image's report must come from a GPU run."""
    if report is None:
        return False, "no smoke report for this image: run `builder smoke IMAGE` first"
    problem = validation_error(report)
    if problem:
        return False, f"the smoke report does not match its schema ({problem})"
    if report["status"] != "pass" and not _only_gpu_demand_failed(report, require_gpu):
        return False, f"smoke failed: {_describe_failures(report) or 'overall status fail'}"
    if report.get("facts") is None:
        return False, "the smoke report has no image facts: the image's versions were not checked"
    accelerator = (report["facts"] or {}).get("accelerator")
    if require_gpu and accelerators.needs_gpu_evidence(accelerator):
        if not report.get("require_gpu"):
            return False, (
                f"the smoke report of this {accelerator} image was made without --require-gpu: run "
                "`builder smoke IMAGE --require-gpu` on a host with NVIDIA GPUs"
            )
        not_on_gpu = gpu_checks_not_run(report["checks"])
        if not_on_gpu:
            return False, f"GPU checks did not pass on a GPU: {', '.join(not_on_gpu)}"
    checks = len(report["checks"])
    where = "with --require-gpu" if report.get("require_gpu") else "without --require-gpu"
    return True, f"smoke passed ({checks} checks, {where})"
