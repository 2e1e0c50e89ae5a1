"""`builder rebuild --relock-report`: what the relock pull-request job sends back to git."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from matrix_files import CPU, LOCKS, ROOT

from builder.flows import relock_report
from builder.flows.rebuild import Action
from builder.model import matrix


def actions() -> list[Action]:
    relocked = Action(variant_id=CPU, reasons=["python-vuln"], upgrade=["numpy"], state="published",
                      new_publication=f"{CPU}-20261206 @ sha256:{'a' * 64}",
                      old_publication=f"{CPU}-20261205 @ sha256:{'b' * 64}",
                      changelog={"old": "a", "new": "b", "added": [], "removed": [],
                                 "changed": [{"type": "pypi", "name": "numpy", "old": "2.4.5",
                                              "new": "2.4.6"}], "unchanged": 3})
    rebuilt_only = Action(variant_id="2.13.0-py3.11-cpu-slim", reasons=["debian-security"], state="published")
    return [relocked, rebuilt_only]


def test_the_report_carries_the_relocked_lock_files_and_the_sbom_diff(tmp_path: Path) -> None:
    locks = tmp_path / "locks"
    shutil.copytree(LOCKS, locks)
    variants = matrix.load(ROOT / "matrix.yaml").variants
    out = tmp_path / "relock.json"
    relock_report.write(out, actions(), variants, locks)
    doc = json.loads(out.read_text())
    assert doc["relocked"] == [CPU]  # a Debian-only rebuild changes no lock
    assert sorted(doc["files"]) == [f"locks/{CPU}.json", f"locks/{CPU}.txt"]
    assert doc["files"][f"locks/{CPU}.txt"] == (locks / f"{CPU}.txt").read_text()
    assert doc["title"] == "Relock from the security rebuild: numpy"
    assert f"### `{CPU}`" in doc["body"] and "numpy" in doc["body"]
    assert "(was 2.13.0-py3.11-cpu-runtime-20261205" in doc["body"]
    merged = relock_report.merge([doc, {"relocked": [], "files": {}, "title": "", "body": ""}])
    assert merged["relocked"] == [CPU] and merged["files"] == doc["files"]


def test_nothing_relocked_is_an_empty_report(tmp_path: Path) -> None:
    out = tmp_path / "relock.json"
    relock_report.write(out, actions()[1:], [], tmp_path)
    doc = json.loads(out.read_text())
    assert (doc["relocked"], doc["files"]) == ([], {})
    assert relock_report.merge([doc])["relocked"] == []
