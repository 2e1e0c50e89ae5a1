"""An in-toto Statement v1 with a SLSA Provenance v1 predicate for one built image.

Everything in it is read off the image's own labels (written by `builder build`), so any
machine that holds the image can state the same provenance: which commit of which source, which
lock, which base digest, which builder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, urlsplit

from builder import __version__
from builder.core import labels

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://slsa.dev/provenance/v1"
BUILD_TYPE = "https://github.com/torch-images/torch-images/buildtypes/buildkit-matrix@v1"
# The source of a checkout without a public remote URL (`oci.image.source` unset): said so,
# never "".
NO_SOURCE = "urn:torch-images:source:no-public-remote"


def statement(image_name: str, digest: str, image_labels: Mapping[str, str],
              normalisation: Mapping[str, Any] | None = None,
              environ: Mapping[str, str] | None = None,
              times: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The statement for the image `image_name@digest` with these labels; `normalisation` says
    how its config was made reproducible (builder.core.reproducible.record), when it was. Every
    dependency and the builder are named by URI: the source as `git+<repository URL>@<commit>`,
    the lock inside it by sha256, the base by package URL and digest, the builder as the CI
    workflow (`environ`: GitHub Actions' variables) or the tool's package URL. `times`: the
    build's real `startedOn`/`finishedOn` where this machine ran it; without them the statement
    names no time (the image's `created` is the lock's commit time, not when it was built)."""
    get = image_labels.get
    source = get(labels.OCI + "source") or NO_SOURCE
    revision = get(labels.OCI + "revision") or ""
    variant = get(labels.VARIANT, "")
    repo = f"git+{source}@{revision}" if source.startswith(("https://", "http://")) else ""
    dependencies = [{"uri": repo, "name": "source", "digest": {"gitCommit": revision},
                     "annotations": {"role": "source"}}] if repo else []
    dependencies.append({"uri": f"{repo}#locks/{variant}.txt" if repo
                         else f"urn:torch-images:lock:{variant}",
                         "name": f"locks/{variant}.txt", "annotations": {"role": "lock"},
                         "digest": {"sha256": get(labels.LOCK_HASH, "")}})
    base_digest = get(labels.OCI + "base.digest") or ""
    if base_digest:
        base_name = get(labels.OCI + "base.name") or ""
        dependencies.append({"uri": base_uri(base_name), "name": base_name,
                             "annotations": {"role": "base"},
                             "digest": {"sha256": base_digest.removeprefix("sha256:")}})
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": image_name, "digest": {"sha256": digest.removeprefix("sha256:")}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {"variant": variant, "source": source,
                                       "revision": revision, **tree_state(image_labels)},
                "internalParameters": {"content_hash": get(labels.CONTENT_HASH, ""),
                                       **({"reproducible": dict(normalisation)}
                                          if normalisation else {})},
                "resolvedDependencies": dependencies,
            },
            "runDetails": {
                "builder": {"id": builder_id(os.environ if environ is None else environ)},
                "metadata": {**{k: v for k, v in (times or {}).items()
                                if k in ("startedOn", "finishedOn")},
                             **invocation(os.environ if environ is None else environ)},
            },
        },
    }


def tree_state(image_labels: Mapping[str, str]) -> dict[str, Any]:
    """`dirty` (and the difference's `diff` hash) as the build recorded them; an image built
    before builds recorded it says `dirty: null` (not known), never a clean tree."""
    dirty = image_labels.get(labels.SOURCE_DIRTY)
    if dirty is None:
        return {"dirty": None}
    if dirty != "true":
        return {"dirty": False}
    return {"dirty": True, "diff": image_labels.get(labels.SOURCE_DIFF) or ""}


def base_uri(name: str) -> str:
    """A package URL for the base: `pkg:docker/<name>@<tag>`, or an mmdebstrap bootstrap's
    `pkg:generic/mmdebstrap@<suite>`."""
    if name.startswith("mmdebstrap:"):
        return f"pkg:generic/mmdebstrap@{quote(name.partition(':')[2], safe='')}"
    repository, _, tag = name.rpartition(":") if ":" in name.split("/")[-1] else (name, "", "")
    return f"pkg:docker/{quote(repository or 'unknown', safe='/')}" + (
        f"@{quote(tag, safe='')}" if tag else "")


def builder_id(environ: Mapping[str, str]) -> str:
    """GitHub Actions: the workflow file at its ref (who built and published); elsewhere the
    tool itself."""
    if environ.get("GITHUB_WORKFLOW_REF"):
        server = environ.get("GITHUB_SERVER_URL", "https://github.com")
        return f"{server}/{environ['GITHUB_WORKFLOW_REF']}"
    return f"pkg:pypi/torch-images@{__version__}"


def invocation(environ: Mapping[str, str]) -> dict[str, str]:
    if not (environ.get("GITHUB_REPOSITORY") and environ.get("GITHUB_RUN_ID")):
        return {}
    server = environ.get("GITHUB_SERVER_URL", "https://github.com")
    return {"invocationId": f"{server}/{environ['GITHUB_REPOSITORY']}/actions/runs/"
                            f"{environ['GITHUB_RUN_ID']}/attempts/"
                            f"{environ.get('GITHUB_RUN_ATTEMPT', '1')}"}


def is_uri(text: Any) -> bool:
    """An absolute URI: a scheme, then something (`git+https://…`, `pkg:…`, `urn:…`)."""
    parts = urlsplit(text) if isinstance(text, str) else None
    return bool(parts and parts.scheme and (parts.netloc or parts.path))


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
    definition = (doc.get("predicate") or {}).get("buildDefinition", {})
    params = definition.get("externalParameters", {})
    uris = [d.get("uri") for d in definition.get("resolvedDependencies") or []]
    uris.append(((doc.get("predicate") or {}).get("runDetails", {}).get("builder") or {})
                .get("id"))
    if bad := [str(u) for u in uris if not is_uri(u)]:
        found.append(f"not URIs: {', '.join(bad)}")
    if (params.get("revision") or "") != (image_labels.get(labels.OCI + "revision") or ""):
        found.append("its revision differs from the image's label")
    return found
