"""Provenance statements from labels, and the parts of `builder verify` that need no registry."""

from __future__ import annotations

import pytest

from builder.core import labels
from builder.core.errors import BuilderError
from builder.flows import verify
from builder.stages import provenance

DIGEST = "sha256:" + "d" * 64
LABELS = {
    labels.OCI + "revision": "0123456789abcdef", labels.OCI + "source": "https://example.org/r",
    labels.OCI + "base.digest": "sha256:" + "b" * 64, labels.OCI + "base.name": "debian",
    labels.VARIANT: "2.13.0-py3.11-cpu-runtime", labels.LOCK_HASH: "c" * 64,
    labels.CONTENT_HASH: "e" * 64, labels.TORCH: "2.13.0+cpu", labels.PYTHON: "3.11",
    labels.ACCELERATOR: "cpu", labels.FLAVOR: "runtime",
}


def test_statement_names_commit_lock_and_base() -> None:
    doc = provenance.statement("r.example/torch", DIGEST, LABELS)
    assert doc["subject"] == [{"name": "r.example/torch", "digest": {"sha256": "d" * 64}}]
    deps = doc["predicate"]["buildDefinition"]["resolvedDependencies"]
    assert deps[0] == {"uri": "git+https://example.org/r",
                       "digest": {"gitCommit": "0123456789abcdef"}}
    assert deps[1]["digest"] == {"sha256": "c" * 64}
    assert deps[2] == {"uri": "debian", "digest": {"sha256": "b" * 64}}
    assert provenance.problems(doc, DIGEST, LABELS) == []


def test_statement_of_another_image_or_commit_is_refused() -> None:
    doc = provenance.statement("r/torch", DIGEST, LABELS)
    other = "sha256:" + "f" * 64
    assert provenance.problems(doc, other, LABELS) == [f"its subject is not {other}"]
    moved = {**LABELS, labels.OCI + "revision": "fedcba"}
    assert provenance.problems(doc, DIGEST, moved) == ["its revision differs from the image's label"]
    assert provenance.problems({"x": 1}, DIGEST, LABELS) == ["not an in-toto v1 statement"]


def test_reference_parsing() -> None:
    ref = verify.Reference.parse(f"127.0.0.1:5000/torch@{DIGEST}")
    assert (ref.registry, ref.repository, ref.ref) == ("127.0.0.1:5000", "torch", DIGEST)
    tagged = verify.Reference.parse("r.example/team/torch:2.13.0-py3.11-cpu-runtime")
    assert (tagged.repository, tagged.ref) == ("team/torch", "2.13.0-py3.11-cpu-runtime")
    for bad in ("torch", "127.0.0.1:5000/torch"):
        with pytest.raises(BuilderError, match="is not REGISTRY/REPOSITORY@sha256:DIGEST"):
            verify.Reference.parse(bad)


def test_labels_row_lists_versions_or_what_is_missing() -> None:
    assert verify.label_row(LABELS).status == verify.OK
    row = verify.label_row({k: v for k, v in LABELS.items() if k != labels.LOCK_HASH})
    assert row.status == verify.BAD and labels.LOCK_HASH in row.detail
