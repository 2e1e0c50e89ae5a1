"""The publication record from the registry alone: the newest dated tag of each variant, its
content hash, evidence and platforms; a publication whose signature does not verify against
the trusted keys is not part of it; `publish` calls a held content hash already published."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from builder.core import clock, labels, oci, sign
from builder.core.keypair import Vouchers
from builder.flows import publish as publish_flow
from builder.flows import record
from builder.model import matrix

ROOT = Path(__file__).resolve().parents[3]
VID = "2.13.0-py3.11-cpu-runtime"


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class FakeRegistry:
    """Tags → manifests and blobs, as much of the distribution API as the record reads."""

    def __init__(self) -> None:
        self.manifests: dict[str, bytes] = {}
        self.blobs: dict[str, bytes] = {}
        self.tagged: dict[str, str] = {}

    def image(self, content_hash: str, variant: str = VID) -> str:
        config = json.dumps({"config": {"Labels": {labels.CONTENT_HASH: content_hash,
                                                   labels.VARIANT: variant,
                                                   labels.FLAVOR: "runtime"}}}).encode()
        self.blobs[digest_of(config)] = config
        body = json.dumps({"schemaVersion": 2, "config": {"digest": digest_of(config)},
                           "layers": []}).encode()
        digest = digest_of(body)
        self.manifests[digest] = body
        for kind in ("sbom", "smoke", "provenance"):
            artifact = json.dumps({"kind": kind, "of": digest}).encode()
            self.manifests[digest_of(artifact)] = artifact
            self.tagged[oci.artifact_tag(digest, kind)] = digest_of(artifact)
        return digest

    def tag(self, name: str, digest: str) -> None:
        self.tagged[name] = digest

    def tags(self, _repository: str) -> list[str]:
        return sorted(self.tagged)

    def manifest(self, _repository: str, ref: str) -> tuple[bytes, oci.Descriptor] | None:
        digest = ref if ref.startswith("sha256:") else self.tagged.get(ref)
        if digest is None or digest not in self.manifests:
            return None
        body = self.manifests[digest]
        return body, oci.Descriptor(digest, oci.OCI_MANIFEST, len(body))

    def head(self, repository: str, ref: str) -> oci.Descriptor | None:
        found = self.manifest(repository, ref)
        return found[1] if found else None

    def blob(self, _repository: str, digest: str, cap: int = 0) -> bytes:
        return self.blobs[digest]


@pytest.fixture
def reg(monkeypatch: pytest.MonkeyPatch) -> FakeRegistry:
    fake = FakeRegistry()
    monkeypatch.setattr(record.oci, "Registry", lambda *_a, **_k: fake)
    return fake


def shipped() -> matrix.Matrix:
    return matrix.load(ROOT / "matrix.yaml")


def test_the_newest_dated_tag_of_a_variant_is_its_publication(reg: FakeRegistry) -> None:
    old, new = reg.image("a" * 64), reg.image("b" * 64)
    reg.tag(f"{VID}-20261201", old)
    reg.tag(f"{VID}-20261204", old)
    reg.tag(f"{VID}-20261204.1", new)
    reg.tag(VID, new)
    pub = record.latest(shipped())[VID]
    assert pub.dated_tag == f"{VID}-20261204.1" and pub.digest == new
    assert pub.content_hash == "b" * 64 and pub.date == "2026-12-04"
    assert pub.sbom.tag == oci.artifact_tag(new, "sbom") and not pub.signed


def signed(monkeypatch: pytest.MonkeyPatch, by_digest: dict[str, tuple[str, list[str]]]
           ) -> None:
    """Trusted signatures: digest → (variant, tags) its payload names; other digests carry a
    signature by another key."""
    def payloads(_reg: Any, _repo: str, digest: str, _keys: list[Any]) -> list[dict[str, Any]]:
        if digest not in by_digest:
            raise sign.SignatureError("a signature by another key")
        return [{"optional": sign.tag_annotations(*by_digest[digest])}]

    monkeypatch.setattr(record.sign, "verified_payloads", payloads)


def test_a_publication_whose_signature_does_not_verify_is_not_part_of_the_record(
        reg: FakeRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    good, forged = reg.image("a" * 64), reg.image("b" * 64)
    reg.tag(f"{VID}-20261201", good)
    reg.tag(f"{VID}-20261204", forged)
    signed(monkeypatch, {good: (VID, [f"{VID}-20261201", VID])})
    assert record.latest(shipped(), vouchers=Vouchers(("trusted",)))[VID].digest == good
    assert record.latest(shipped())[VID].digest == forged  # no keys: every publication


def test_a_dated_tag_its_digest_signature_does_not_name_is_no_publication(
        reg: FakeRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    """A forged newer dated tag on an older signed digest (the floating tag moved back)."""
    old, new = reg.image("a" * 64), reg.image("b" * 64)
    reg.tag(f"{VID}-20261201", old)
    reg.tag(f"{VID}-20261203", new)
    reg.tag(f"{VID}-20261204", old)  # forged: the signature of `old` names only -20261201
    signed(monkeypatch, {old: (VID, [f"{VID}-20261201"]), new: (VID, [f"{VID}-20261203"])})
    pub = record.latest(shipped(), vouchers=Vouchers(("trusted",)))[VID]
    assert (pub.dated_tag, pub.digest) == (f"{VID}-20261203", new)


def test_a_tag_on_another_variants_signed_digest_counts_for_no_variant(
        reg: FakeRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    slim = VID.replace("runtime", "slim")
    mine, theirs = reg.image("a" * 64), reg.image("c" * 64, variant=slim)
    reg.tag(f"{VID}-20261201", mine)
    reg.tag(f"{slim}-20261202", theirs)
    reg.tag(f"{VID}-20261205", theirs)  # forged on the slim's signed digest
    signed(monkeypatch, {mine: (VID, [f"{VID}-20261201"]),
                         theirs: (slim, [f"{slim}-20261202"])})
    found = record.latest(shipped(), vouchers=Vouchers(("trusted",)))
    assert found[VID].digest == mine and found[slim].dated_tag == f"{slim}-20261202"


def test_a_signature_naming_the_tag_for_another_variant_does_not_count(
        reg: FakeRegistry, monkeypatch: pytest.MonkeyPatch) -> None:
    old, other = reg.image("a" * 64), reg.image("b" * 64)
    reg.tag(f"{VID}-20261201", old)
    reg.tag(f"{VID}-20261204", other)
    signed(monkeypatch, {old: (VID, [f"{VID}-20261201"]),
                         other: ("someone-else", [f"{VID}-20261204"])})
    assert record.latest(shipped(), vouchers=Vouchers(("trusted",)))[VID].digest == old


def test_dates_after_today_are_ignored_with_a_warning(
        reg: FakeRegistry, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    now, later = reg.image("a" * 64), reg.image("b" * 64)
    reg.tag(f"{VID}-20261201", now)
    reg.tag(f"{VID}-99991231", later)
    signed(monkeypatch, {now: (VID, [f"{VID}-20261201"]), later: (VID, [f"{VID}-99991231"])})
    monkeypatch.setenv(clock.ENV, "2026-12-06T12:00:00Z")  # the one clock
    assert record.latest(shipped(), vouchers=Vouchers(("trusted",)))[VID].digest == now
    assert record.latest(shipped())[VID].digest == now
    assert f"`{VID}-99991231` is dated after today (20261206, UTC): ignored" in \
        capsys.readouterr().err


def test_publish_calls_a_held_content_hash_already_published(reg: FakeRegistry) -> None:
    digest = reg.image("c" * 64)
    reg.tag(f"{VID}-20261204", digest)
    known = record.latest(shipped())

    class Planned:
        content_hash = "c" * 64
        variant = shipped().variant(VID)

    result = publish_flow.already_published(known, [Planned()])  # type: ignore[list-item]
    assert result is not None and result["status"] == "already-published"
    assert result["reason"].startswith("already published as ")
    assert result["reason"].endswith(f"(dated {VID}-20261204)")
    Planned.content_hash = "d" * 64
    assert publish_flow.already_published(known, [Planned()]) is None  # type: ignore[list-item]
