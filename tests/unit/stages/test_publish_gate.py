"""Publishing logic that needs no registry: dated tags, retries, published.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.core import oci
from builder.core.errors import BuilderError
from builder.core.keypair import Vouchers
from builder.core.oci import RegistryError
from builder.model import publication
from builder.stages import publish

DATE = "20260102"


class FakeRegistry:
    def __init__(self, taken: dict[str, str]) -> None:
        self.taken = taken

    def head(self, repository: str, ref: str) -> oci.Descriptor | None:
        digest = self.taken.get(ref)
        return oci.Descriptor(digest, oci.OCI_MANIFEST, 1) if digest else None


def test_dated_tag_skips_other_digests_and_reuses_its_own() -> None:
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    reg = FakeRegistry({"t-20260102": a, "t-20260102.1": b})
    assert publish.dated_tag(reg, "torch", "t", DATE, "sha256:" + "c" * 64) == (  # type: ignore[arg-type]
        "t-20260102.2", False)
    assert publish.dated_tag(reg, "torch", "t", DATE, b) == ("t-20260102.1", True)  # type: ignore[arg-type]


def test_dated_tag_with_keys_takes_no_suffix_for_unsigned_tags(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """99 unsigned dated tags for today leave the first slot free: only a tag a trusted key
    signed for its digest is a publication (and is never overwritten)."""
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    taken = {f"t-{DATE}" + (f".{n}" if n else ""): b for n in range(100)}
    taken[f"t-{DATE}"] = a  # signed: taken
    monkeypatch.setattr(publish.vouch, "names_tag",
                        lambda _r, _repo, digest, tag, _k: digest == a and tag == f"t-{DATE}")
    reg = FakeRegistry(taken)
    assert publish.dated_tag(reg, "torch", "t", DATE, "sha256:" + "c" * 64,  # type: ignore[arg-type]
                             Vouchers(("trusted",))) == (f"t-{DATE}.1", False)
    with pytest.raises(RegistryError, match="signed suffixes"):
        publish.dated_tag(reg, "torch", "t", DATE, "sha256:" + "c" * 64)  # type: ignore[arg-type]


def test_retry_names_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(oci, "BACKOFF_S", (0, 0, 0))
    calls = []

    def fail() -> None:
        calls.append(1)
        raise OSError("connection refused")

    with pytest.raises(RegistryError, match=r"registry `r\.example:5000`"):
        oci.retry("reading x", "r.example:5000", fail)
    assert len(calls) == 4


def test_registry_url_is_plain_http_only_on_loopback() -> None:
    assert oci.registry_url("127.0.0.1:5000") == "http://127.0.0.1:5000"
    assert oci.registry_url("localhost:5000") == "http://localhost:5000"
    assert oci.registry_url("ghcr.io") == "https://ghcr.io"
    assert oci.artifact_tag("sha256:" + "a" * 64, "sbom") == "sha256-" + "a" * 64 + ".sbom"


def test_manifest_rejects_invalid(tmp_path: Path) -> None:
    path = tmp_path / "published.json"
    path.write_text(json.dumps({"schema_version": 1, "variants": {"x": {"publications": []}}}))
    with pytest.raises(BuilderError, match=r"published\.json"):
        publication.load(path)
    assert publication.load(tmp_path / "none.json") == {}
