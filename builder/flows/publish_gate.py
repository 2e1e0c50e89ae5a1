"""Step `gate` of `builder publish`, for one platform image: where the image and its evidence
are read, and the checks of builder.stages.publish applied to them.

The staged image of the plan's content hash (`<repository>-staging:build-<hash20>`, found
through builder.stages.staging), else the local image with that content hash (staged later, by
the flow). Its smoke report and SBOM are read from the registry (attached to the staged digest),
else from this machine's .state/. The gate passes when the staged image's config is the plan's,
its evidence is signed by a trusted key (unless `trust.unsigned`), the smoke report passed on
this very image (CUDA: on a GPU unless --allow-cpu-smoke, which is recorded) and the SBOM
validates.
"""

from __future__ import annotations

import json
from typing import Any

from builder.core import engine, keypair, labels, limits, oci, state
from builder.model.matrix import Matrix
from builder.model.planned import PlannedVariant
from builder.stages import publish, staging
from builder.stages.publish import Candidate

EVIDENCE_NAMES = {"smoke": "smoke report", "sbom": "SBOM"}


def gate(matrix: Matrix, p: PlannedVariant, *, allow_cpu_smoke: bool,
         trust: keypair.Trust = keypair.UNSIGNED) -> Candidate:
    """The staged (else local) image of the plan's content hash, and its evidence, checked:
    its config is the plan's, its smoke report and SBOM are signed by a trusted key (unless
    `trust.unsigned`), the report passed every check on this very image, the SBOM is valid."""
    cand = Candidate(planned=p, image=p.local_image, trust=trust)
    cand.staged = staging.find_staged(matrix, p.hash_tag)
    cand.image_id = cand.staged.image_id if cand.staged else _local_image(cand)
    if cand.reason:
        return cand
    for kind in ("smoke", "sbom"):
        data = staging.fetch(cand.staged, kind) if cand.staged else _local_evidence(cand, kind)
        if data is not None:
            cand.evidence[kind] = data
    cand.reason = (_staged_config_gate(cand) or _signed_gate(cand)
                   or publish.smoke_gate(cand, allow_cpu_smoke) or publish.sbom_gate(cand))
    return cand


def _local_image(cand: Candidate) -> str:
    """The id of the local image with the plan's content hash (not staged yet), or a reason."""
    info = engine.inspect_image(cand.image)
    if info is None:
        cand.reason = (f"`{cand.planned.hash_tag}` is not staged and there is no local image "
                       f"`{cand.image}`: build it first (builder build)")
        return ""
    have = (info["Config"].get("Labels") or {}).get(labels.CONTENT_HASH, "")
    if have != cand.planned.content_hash:
        cand.reason = (f"stale image: its content hash {have[:12] or '(none)'} is not the plan's "
                       f"{cand.planned.content_hash[:12]}; rebuild it (builder build)")
    return info["Id"]


def _local_evidence(cand: Candidate, kind: str) -> bytes | None:
    path = state.evidence_path(kind, cand.image_id)
    return path.read_bytes() if path.is_file() else None


def _staged_config_gate(cand: Candidate) -> str:
    if cand.staged is None:
        return ""
    problem = publish.config_problem(cand.planned, staging.image_config(cand.staged))
    return f"the staged image {cand.staged.digest[:19]} is not the plan's: {problem}" if problem \
        else ""


def _signed_gate(cand: Candidate) -> str:
    """Staged evidence counts only as attested by a trusted key or identity (builder.core.vouch):
    the gate reads the attested documents, and a file attached beside them must be the same
    document."""
    if cand.staged is None or cand.trust.unsigned:
        return ""  # a local image's evidence was made here: signed when publish stages it
    files, problems = staging.signed(cand.staged, cand.trust.vouchers)
    reg = oci.Registry(cand.staged.registry)
    for kind, name in EVIDENCE_NAMES.items():
        if kind not in files:
            return (f"the staged {name} has no attestation by a trusted key or identity: "
                    f"{problems[kind]} (sign where it is made with --key or `builder attest`, "
                    "or publish --unsigned)")
        attached = reg.fetch_artifact(cand.staged.repository, cand.staged.digest, kind)
        if attached is not None and _parsed(attached) != json.loads(files[kind]):
            return f"the attached {name} differs from its signed attestation"
        cand.evidence[kind] = files[kind]
    return ""


def _parsed(data: bytes) -> Any:
    try:
        return limits.parse_json(data)
    except ValueError:
        return None
