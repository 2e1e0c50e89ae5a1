"""`verify` takes a bare tag of the matrix's own registry and repository, so that the README's
quick-start line holds for any `repository:` (test_help: every command takes `--matrix`)."""

from __future__ import annotations

import pytest
from matrix_files import CPU, shipped_with

from builder.commands.verify import reference_of
from builder.core.errors import BuilderError
from builder.flows.verify import Reference

DIGEST = "sha256:" + "a" * 64


def test_verify_takes_a_bare_tag_or_digest_of_the_matrix_repository(tmp_path):
    path = str(shipped_with(tmp_path, "repository: torch", "repository: ml/pytorch"))
    registry = "127.0.0.1:5000"
    assert reference_of(CPU, path) == Reference(registry, "ml/pytorch", CPU)
    assert reference_of(DIGEST, path) == Reference(registry, "ml/pytorch", DIGEST)
    full = f"r.example:443/other@{DIGEST}"
    assert reference_of(full, "/no/such/matrix.yaml") == Reference("r.example:443", "other",
                                                                   DIGEST)
    with pytest.raises(BuilderError, match="names no registry and repository"):
        reference_of(CPU, str(tmp_path / "none.yaml"))
    with pytest.raises(BuilderError, match="is not REGISTRY/REPOSITORY"):
        reference_of("ubuntu:22.04", path)  # a short name elsewhere is not taken for a tag
