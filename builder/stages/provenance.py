"""An in-toto Statement v1 with a SLSA Provenance v1 predicate for one built image.

Everything in it is read off the image's own labels (written by `builder build`), so any
machine that holds the image can state the same provenance: which commit of which source, which
lock, which base digest, which builder.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from builder import __version__
from builder.core import labels

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
MEDIA_TYPE = "application/vnd.in-toto+json"
BUILD_TYPE = "https://github.com/torch-images/torch-images/buildtypes/buildkit-matrix@v1"


def statement(image_name: str, digest: str, image_labels: Mapping[str, str],
              normalisation: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The statement for the image `image_name@digest` with these labels; `normalisation` says
    how its config was made reproducible (builder.reproducible.record), when it was."""
    get = image_labels.get
    source = get(labels.OCI + "source") or ""
    revision = get(labels.OCI + "revision") or ""
    dependencies = [
        {"uri": f"git+{source}" if source else "git", "digest": {"gitCommit": revision}},
        {"uri": f"locks/{get(labels.VARIANT, '')}.txt",
         "digest": {"sha256": get(labels.LOCK_HASH, "")}},
    ]
    base_digest = get(labels.OCI + "base.digest") or ""
    if base_digest:
        dependencies.append({"uri": get(labels.OCI + "base.name") or "base",
                             "digest": {"sha256": base_digest.removeprefix("sha256:")}})
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": image_name, "digest": {"sha256": digest.removeprefix("sha256:")}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"variant": get(labels.VARIANT, ""),
                                       "source": source, "revision": revision},
                "internalParameters": {"content_hash": get(labels.CONTENT_HASH, ""),
                                       **({"reproducible": dict(normalisation)}
                                          if normalisation else {})},
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {"id": f"torch-images builder {__version__}"},
                "metadata": {"finishedOn": get(labels.OCI + "created")
                             or dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")},
            },
        },
    }


def problems(doc: Any, digest: str, image_labels: Mapping[str, str]) -> list[str]:
    """What makes `doc` not the provenance of this image (empty: it is)."""
    if not isinstance(doc, dict) or doc.get("_type") != STATEMENT_TYPE:
        return ["not an in-toto v1 statement"]
    found: list[str] = []
    subjects = [s.get("digest", {}).get("sha256") for s in doc.get("subject") or []]
    if digest.removeprefix("sha256:") not in subjects:
        found.append(f"its subject is not {digest}")
    if doc.get("predicateType") != PREDICATE_TYPE:
        found.append(f"its predicate is not {PREDICATE_TYPE}")
    params = (doc.get("predicate") or {}).get("buildDefinition", {}).get("externalParameters", {})
    if (params.get("revision") or "") != (image_labels.get(labels.OCI + "revision") or ""):
        found.append("its revision differs from the image's label")
    return found
