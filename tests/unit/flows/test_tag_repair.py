"""Tags only move forward: a checkout behind the registry is refused in one line, and an
already-published variant's moved floating tag, alias and twins are put back."""

from __future__ import annotations

from typing import Any

import pytest
from records import publication  # type: ignore[import-not-found]

from builder.core import oci
from builder.core.errors import GateRefused
from builder.core.keypair import Vouchers
from builder.flows import tag_repair

VID = "2.13.0-py3.11-cpu-runtime"
OLD, NEW, TWIN = ("sha256:" + c * 64 for c in "123")


class Tags:
    def __init__(self, tags: dict[str, str]) -> None:
        self.by_tag = tags

    def head(self, _repo: str, ref: str) -> oci.Descriptor | None:
        digest = self.by_tag.get(ref)
        return oci.Descriptor(digest, oci.OCI_MANIFEST, 1) if digest else None

    def tag(self, _repo: str, digest: str, tag: str) -> None:
        self.by_tag[tag] = digest


class Planned:
    def __init__(self, content_hash: str) -> None:
        self.content_hash = content_hash

        class Variant:
            id = VID

        self.variant = Variant()


def pub(digest: str, content: str, dated: str) -> Any:
    return publication(digest=digest, content_hash=content, dated_tag=dated,
                       date=f"{dated[-8:-4]}-{dated[-4:-2]}-{dated[-2:]}", repository="torch")


def test_a_checkout_behind_the_registry_is_refused_naming_both() -> None:
    pubs = [pub(NEW, "b" * 64, f"{VID}-20261205"), pub(OLD, "a" * 64, f"{VID}-20261201")]
    with pytest.raises(GateRefused) as caught:
        tag_repair.refuse_older(pubs, [Planned("a" * 64)])  # type: ignore[list-item]
    assert f"`{VID}-20261201`, older than the newest signed publication `{VID}-20261205`" \
        in str(caught.value)
    assert caught.value.hint.startswith("your lock is older than what the registry published "
                                        "on 2026-12-05: update the checkout")
    tag_repair.refuse_older(pubs, [Planned("c" * 64)])  # type: ignore[list-item]  # new content
    tag_repair.refuse_older(pubs, [Planned("b" * 64)])  # type: ignore[list-item]  # the newest


def test_repair_moves_the_floating_tag_alias_and_twins_back(
        capsys: pytest.CaptureFixture[str]) -> None:
    dated = f"{VID}-20261205"
    reg = Tags({dated: NEW, f"{dated}-zstd": TWIN, VID: OLD, "latest": NEW,
                f"{VID}-zstd": OLD})
    moved = tag_repair.repair(reg, pub(NEW, "b" * 64, dated), [VID, "latest"])  # type: ignore[arg-type]
    assert moved == [VID, f"{VID}-zstd", "latest-zstd"]
    assert reg.by_tag[VID] == NEW and reg.by_tag["latest-zstd"] == TWIN
    assert f"moved `{VID}` from {OLD[:19]} to {NEW[:19]}" in capsys.readouterr().err
    assert tag_repair.repair(reg, pub(NEW, "b" * 64, dated), [VID, "latest"]) == []  # type: ignore[arg-type]


def test_repair_keeps_a_signed_rollback_from_the_newest(monkeypatch, capsys) -> None:
    """A floating tag a trusted key rolled back from the newest publication (publish
    --rollback-to) is a deliberate act: publish's repair leaves it; a hand-moved one it puts
    back."""
    dated = f"{VID}-20261205"
    back = {"optional": {"tag:" + VID: "signed", tag_repair.sign.ROLLBACK_TO: f"{VID}-20261201",
                         tag_repair.sign.ROLLBACK_FROM: dated}}
    monkeypatch.setattr(tag_repair.vouch, "names_tag", lambda *a: True)
    monkeypatch.setattr(tag_repair.sign, "verified_payloads",
                        lambda _r, _repo, digest, _k: [back] if digest == OLD else [])
    reg = Tags({dated: NEW, VID: OLD, "latest": TWIN})
    moved = tag_repair.repair(reg, pub(NEW, "b" * 64, dated), [VID, "latest"], Vouchers(("key",)))  # type: ignore[arg-type]
    assert moved == ["latest"] and reg.by_tag[VID] == OLD
    assert f"kept `{VID}` on {OLD[:19]}: a signed rollback to `{VID}-20261201` from `{dated}`" \
        in capsys.readouterr().err
