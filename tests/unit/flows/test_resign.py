"""A lost `.sig` is signed again by publish only from verified evidence: no valid signature,
attested evidence, the same content, newer than the newest signed publication."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from records import publication  # type: ignore[import-not-found]

from builder.core import keyless, keypair, oci, sign
from builder.flows import resign

VID = "2.13.0-py3.11-cpu-runtime"
GOOD, OLD, DECOY, TWIN = ("sha256:" + c * 64 for c in "1234")
CONTENT = "b" * 64
TODAY = f"{VID}-20261206"
TAGS = ["build-" + CONTENT[:20], VID, "latest"]
IDENTITY = keypair.Identity(keyless.GITHUB_ISSUER, "https://github.com/o/r/.github/workflows/"
                            "build.yml@refs/heads/main")


class Reg:
    registry = "127.0.0.1:5000"

    def __init__(self, tags: dict[str, str]) -> None:
        self.by_tag = tags

    def tags(self, _repo: str) -> list[str]:
        return list(self.by_tag)

    def head(self, _repo: str, ref: str) -> oci.Descriptor | None:
        digest = self.by_tag.get(ref)
        return oci.Descriptor(digest, oci.OCI_MANIFEST, 1) if digest else None


def pub(digest: str, dated: str, content: str = CONTENT) -> Any:
    return publication(digest=digest, content_hash=content, dated_tag=dated)


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A registry where GOOD (today, this content) lost its signature and is attested, OLD (an
    older dated tag) and DECOY (a forged newer tag, same labels, no evidence) are beside it."""
    reg = Reg({TODAY: GOOD, f"{TODAY}-zstd": TWIN, f"{VID}-20261201": OLD,
               f"{TODAY}.3": DECOY, f"{VID}-99991231": GOOD})
    digests = {TODAY: GOOD, f"{VID}-20261201": OLD, f"{TODAY}.3": DECOY}
    w: dict[str, Any] = {"reg": reg, "signed": [], "unsigned": {GOOD, DECOY, TWIN},
                         "attested": {GOOD}}
    monkeypatch.setattr(resign.oci, "Registry", lambda _addr: reg)
    monkeypatch.setattr(resign.clock, "stamp", lambda: "20261206")
    monkeypatch.setattr(resign.record, "read_publication", lambda _r, _m, dated, _t: (
        VID, pub(digests[dated.tag], dated.tag)))
    monkeypatch.setattr(resign.record, "signed_for", lambda _r, _repo, digest, _k: (
        set(), set(), "no signature" if digest in w["unsigned"] else ""))
    monkeypatch.setattr(resign.vouch, "attestations", lambda _r, _repo, digest, _k: (
        dict.fromkeys(("sbom", "smoke", "provenance"), 1) if digest in w["attested"] else {},
        {}))
    monkeypatch.setattr(resign.sign, "sign_image", lambda _r, _repo, digest, _key, optional:
                        w["signed"].append((digest, resign.sign.signed_tags(optional))))
    monkeypatch.setattr(resign.twin, "make", lambda _r, _repo, _d: oci.Descriptor(
        TWIN, oci.OCI_MANIFEST, 1))
    return w


def restore(newest: Any = None, content: str = CONTENT) -> Any:
    group = [SimpleNamespace(variant=SimpleNamespace(id=VID), floating_tag=VID,
                             content_hash=content)]
    matrix = SimpleNamespace(registry="127.0.0.1:5000", repository="torch")
    trust = keypair.Trust(key=object(), vouchers=keypair.Vouchers((object(),)))  # type: ignore[arg-type]
    return resign.restore(matrix, group, newest, TAGS, trust)  # type: ignore[arg-type]


def test_a_lost_signature_is_signed_again_with_its_twin(world, capsys) -> None:
    again = restore(pub(OLD, f"{VID}-20261201"))
    assert again.digest == GOOD and again.signed is True
    assert world["signed"] == [(GOOD, {TODAY, *TAGS}),
                               (TWIN, {f"{t}-zstd" for t in (TODAY, *TAGS)})]
    assert f"signed {GOOD[:19]} again as `{TODAY}`" in capsys.readouterr().err


def test_nothing_unverified_is_signed(world) -> None:
    world["attested"] = set()  # no attested evidence
    assert restore() is None
    world["attested"] = {GOOD}
    assert restore(content="c" * 64) is None  # other content than this checkout's
    assert restore(pub(GOOD, f"{TODAY}.4")) is None  # not newer than the newest signed
    world["unsigned"] = {DECOY}  # GOOD's signature verifies: its other tags are forgeries
    assert restore() is None
    assert world["signed"] == []


def test_no_key_no_signature(world) -> None:
    group = [SimpleNamespace(variant=SimpleNamespace(id=VID), floating_tag=VID,
                             content_hash=CONTENT)]
    assert resign.restore(None, group, None, TAGS, keypair.Trust()) is None  # type: ignore[arg-type]
    assert world["signed"] == []


def test_an_oidc_token_signs_a_lost_signature_again_keylessly(world, monkeypatch) -> None:
    """With a token and no key, the lost signature and its twin's come back as sigstore
    bundles of the image (no evidence statements: that is attested already), naming the same
    tags; no `.sig` is written."""
    bundles = []
    monkeypatch.setattr(keyless, "sign_and_attach", lambda _r, _repo, digest, token, config,
                        statements, optional: bundles.append(
                            (digest, token, config, statements, sign.signed_tags(optional))))
    group = [SimpleNamespace(variant=SimpleNamespace(id=VID), floating_tag=VID,
                             content_hash=CONTENT)]
    matrix = SimpleNamespace(registry="127.0.0.1:5000", repository="torch")
    trust = keypair.Trust(keyless=keypair.KeylessSigner("TOKEN", Path("mock.json")),
                          vouchers=keypair.Vouchers(identities=(IDENTITY,)))
    again = resign.restore(matrix, group, pub(OLD, f"{VID}-20261201"), TAGS,  # type: ignore[arg-type]
                           trust)
    assert again.digest == GOOD and again.signed is True
    assert bundles == [(GOOD, "TOKEN", Path("mock.json"), [], {TODAY, *TAGS}),
                       (TWIN, "TOKEN", Path("mock.json"), [],
                        {f"{t}-zstd" for t in (TODAY, *TAGS)})]
    assert world["signed"] == []
