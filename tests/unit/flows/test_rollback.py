"""builder.flows.rollback: `publish --rollback-to` moves the floating tag, aliases and twins back
to an older signed publication, signing the rollback; only such a publication qualifies."""

from __future__ import annotations

from typing import Any

import pytest
from records import publication  # type: ignore[import-not-found]

from builder.core import keyless, keypair, sign
from builder.core.errors import UsageError
from builder.flows import rollback

VID = "2.13.0-py3.11-cpu-runtime"
OLD, NEW, OLD_TWIN = ("sha256:" + c * 64 for c in "123")
DATED_OLD, DATED_NEW = f"{VID}-20261201", f"{VID}-20261205"
IDENTITY = keypair.Identity(keyless.GITHUB_ISSUER, "https://github.com/o/r/.github/workflows/"
                            "build.yml@refs/heads/main")


class Registry:
    """The registry calls a rollback makes: HEAD and tag."""

    def __init__(self, tags: dict[str, str]) -> None:
        self.by_tag = tags

    def head(self, _repo: str, ref: str) -> Any:
        return type("D", (), {"digest": self.by_tag[ref]})() if ref in self.by_tag else None

    def tag(self, _repo: str, digest: str, tag: str) -> None:
        self.by_tag[tag] = digest


class Matrix:
    registry, repository, image_name = "reg.example", "torch", "reg.example/torch"


def pub(digest: str, dated: str) -> Any:
    return publication(digest=digest, dated_tag=dated, repository="torch")


@pytest.fixture
def world(monkeypatch) -> dict[str, Any]:
    reg = Registry({DATED_OLD: OLD, f"{DATED_OLD}-zstd": OLD_TWIN, DATED_NEW: NEW, VID: NEW,
                    "latest": NEW, "pinned": NEW})
    signed = {OLD: {DATED_OLD, VID, "latest", "build-" + "a" * 20},
              NEW: {DATED_NEW, VID, "latest", "pinned"}}
    made: list[tuple[str, dict[str, str]]] = []
    monkeypatch.setattr(rollback.oci, "Registry", lambda _addr: reg)
    monkeypatch.setattr(rollback.record, "history",
                        lambda *_a: {VID: [pub(NEW, DATED_NEW), pub(OLD, DATED_OLD)]})
    monkeypatch.setattr(rollback.vouch, "tags_signed_by", lambda _r, _repo, d, _k: signed[d])
    monkeypatch.setattr(rollback.sign, "sign_image",
                        lambda _r, _repo, digest, _key, optional: made.append((digest, optional)))
    return {"reg": reg, "made": made}


def trust() -> keypair.Trust:
    return keypair.Trust(key="KEY", vouchers=keypair.Vouchers(("pub",)))  # type: ignore[arg-type]


def test_rollback_signs_then_moves_the_tags_both_were_signed_for(world) -> None:
    row = rollback.rollback_to(Matrix(), DATED_OLD, trust())  # type: ignore[arg-type]
    assert row["status"] == "rolled-back" and row["rollback_from"] == DATED_NEW
    by_tag = world["reg"].by_tag
    assert by_tag[VID] == by_tag["latest"] == OLD and by_tag["pinned"] == NEW  # only both's
    assert by_tag[f"{VID}-zstd"] == by_tag["latest-zstd"] == OLD_TWIN
    [(digest, optional), (twin_digest, twin_optional)] = world["made"]
    assert digest == OLD and twin_digest == OLD_TWIN
    assert sign.signed_tags(optional) == {DATED_OLD, VID, "latest"}
    assert optional[sign.ROLLBACK_TO] == DATED_OLD and optional[sign.ROLLBACK_FROM] == DATED_NEW
    assert twin_optional[sign.ROLLBACK_FROM] == f"{DATED_NEW}-zstd"


@pytest.mark.parametrize(("dated", "why"), [
    (DATED_NEW, "it is the newest publication"), (f"{VID}-20200101", "no publication signed"),
    ("latest", "not a dated tag")])
def test_only_an_older_signed_publication_can_be_rolled_back_to(world, dated, why) -> None:
    with pytest.raises(UsageError, match=why):
        rollback.rollback_to(Matrix(), dated, trust())  # type: ignore[arg-type]
    assert world["made"] == []


def test_a_rollback_needs_a_key(world) -> None:
    with pytest.raises(UsageError, match="needs a signing key or an OIDC token"):
        rollback.rollback_to(Matrix(), DATED_OLD, keypair.UNSIGNED)  # type: ignore[arg-type]


def test_an_oidc_token_signs_the_rollback_keylessly(world, monkeypatch) -> None:
    """With a token and no key the rollback signature is a sigstore bundle of the image whose
    statement names the same tags and the rollback (vouch reads it as it reads a `.sig`)."""
    bundles = []
    monkeypatch.setattr(keyless, "sign_and_attach", lambda _r, _repo, digest, token, _config,
                        statements, optional: bundles.append((digest, token, statements,
                                                              optional)))
    trust = keypair.Trust(keyless=keypair.KeylessSigner("TOKEN"),
                          vouchers=keypair.Vouchers(identities=(IDENTITY,)))
    row = rollback.rollback_to(Matrix(), DATED_OLD, trust)  # type: ignore[arg-type]
    assert row["status"] == "rolled-back" and world["made"] == []  # no `.sig`
    [(digest, token, statements, optional), (twin_digest, *_)] = bundles
    assert (digest, token, statements, twin_digest) == (OLD, "TOKEN", [], OLD_TWIN)
    assert sign.signed_tags(optional) == {DATED_OLD, VID, "latest"}
    assert optional[sign.ROLLBACK_TO] == DATED_OLD and optional[sign.ROLLBACK_FROM] == DATED_NEW
    assert world["reg"].by_tag[VID] == OLD
