"""`builder rebuild --relock-report FILE`: what the workflow's relock pull-request job needs to
send a relock back to git. A rebuild that re-locked (a python-vuln upgrade) published from a lock
that only its runner holds; without this every later run would work from an older lock than the
registry's. The report carries the new lock files (path → text), the variants, and the pull
request's body with each variant's SBOM diff; the job writes the files, re-renders the
Dockerfiles (`builder render`, offline) and opens or updates one pull request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from builder.core import state
from builder.flows.rebuild import Action
from builder.model import lockfile
from builder.model.matrix import Variant

SCHEMA_VERSION = 1
LOCKS_FOLDER = "locks"  # the lock files' folder in the repository


def relocked(actions: list[Action]) -> list[Action]:
    """The published actions whose lock was re-locked (a Python upgrade)."""
    return [a for a in actions if a.upgrade and a.state == "published"]


def lock_files(actions: list[Action], variants: list[Variant],
               locks_dir: Path) -> dict[str, str]:
    """`locks/<stem>.txt|json` → the new text, for every platform of every relocked variant."""
    ids = {a.variant_id for a in relocked(actions)}
    files = {}
    for variant in (v for v in variants if v.id in ids):
        for path in lockfile.lock_paths(locks_dir, variant):
            files[f"{LOCKS_FOLDER}/{path.name}"] = path.read_text()
    return dict(sorted(files.items()))


def body(actions: list[Action]) -> str:
    """The pull request's description: why, what was upgraded, what was published, the SBOM
    diff of each relocked variant."""
    from sbom.diff import format_diff

    lines = ["The security rebuild re-locked and published these variants; this pull request",
             "brings their new locks (and the Dockerfiles rendered from them) back to git, so",
             "the next run does not build from a lock older than the registry's.", ""]
    for a in relocked(actions):
        lines += [f"### `{a.variant_id}`", "",
                  f"- reasons: {', '.join(a.reasons)}",
                  f"- upgraded: {', '.join(a.upgrade)}",
                  f"- published: {a.new_publication}"
                  + (f" (was {a.old_publication})" if a.old_publication else ""), "",
                  "```diff", format_diff(a.changelog) if a.changelog
                  else "(the old SBOM was not available: no diff)", "```", ""]
    return "\n".join(lines)


def write(path: Path, actions: list[Action], variants: list[Variant], locks_dir: Path) -> None:
    """The report (written even when nothing was relocked: `relocked` is then empty and the
    job has nothing to send)."""
    doc = {"schema_version": SCHEMA_VERSION,
           "relocked": [a.variant_id for a in relocked(actions)],
           "files": lock_files(actions, variants, locks_dir),
           "title": "Relock from the security rebuild: "
                    + ", ".join(sorted({p for a in relocked(actions) for p in a.upgrade})),
           "body": body(actions)}
    state.atomic_write(path, json.dumps(doc, indent=1, sort_keys=True) + "\n")


def merge(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One pull request from several legs' reports (one per rebuilt variant)."""
    done = [r for r in reports if r.get("relocked")]
    files: dict[str, str] = {}
    for r in done:
        files |= r.get("files") or {}
    packages = sorted({p for r in done for p in r["title"].partition(": ")[2].split(", ") if p})
    return {"relocked": sorted(v for r in done for v in r["relocked"]), "files": files,
            "title": "Relock from the security rebuild: " + ", ".join(packages),
            "body": "\n".join(r["body"] for r in done)}
