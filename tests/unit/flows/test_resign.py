"""A lost `.sig` is put back by publish only from its signed copy (sign.keep_copy): no valid
signature, a copy naming the dated tag, the same content, newer than the newest signed
publication; a dated tag planted on the digest is never signed."""

from __future__ import annotations

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
TRUSTED = keypair.Vouchers((object(),))  # type: ignore[arg-type]
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


def layer(digest: str, tags: list[str]) -> sign.Layer:
    """A `.sig` layer whose payload signs `digest` naming `tags` (its signature is checked by
    sign.copied_layers, tested in tests/unit/core/test_sign_copy.py)."""
    payload = sign.simple_signing_payload("127.0.0.1:5000/torch", digest,
                                          sign.tag_annotations(VID, tags))
    return sign.Layer(sign.SIMPLE_SIGNING, payload, {})


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A registry where GOOD (today, this content) lost its signature and has a signed copy of
    it naming `TODAY`, and so does its twin; OLD (an older dated tag) is beside it, and
    `TODAY.3` (newer) and a future date are planted on GOOD, DECOY (no copy) under `TODAY.4`."""
    reg = Reg({TODAY: GOOD, f"{TODAY}-zstd": TWIN, f"{VID}-20261201": OLD,
               f"{TODAY}.3": GOOD, f"{TODAY}.4": DECOY, f"{VID}-99991231": GOOD})
    copies = {GOOD: [layer(GOOD, [TODAY, *TAGS])],
              TWIN: [layer(TWIN, [f"{t}-zstd" for t in (TODAY, *TAGS)])]}
    w: dict[str, Any] = {"reg": reg, "put_back": [], "unsigned": {GOOD, DECOY, TWIN},
                         "copies": copies}
    monkeypatch.setattr(resign.oci, "Registry", lambda _addr: reg)
    monkeypatch.setattr(resign.clock, "stamp", lambda: "20261206")
    monkeypatch.setattr(resign.record, "read_publication", lambda _r, _m, dated, _t: (
        VID, pub(reg.by_tag[dated.tag], dated.tag)))
    monkeypatch.setattr(resign.record, "signed_for", lambda _r, _repo, digest, _k: (
        set(), set(), "no signature" if digest in w["unsigned"] else ""))
    monkeypatch.setattr(resign, "copied", lambda _r, _repo, digest, _v: w["copies"].get(
        digest, []))
    monkeypatch.setattr(resign.sign, "reattach", lambda _r, _repo, digest, layers:
                        w["put_back"].append((digest, resign.named(layers))))
    return w


def restore(newest: Any = None, content: str = CONTENT,
            vouchers: keypair.Vouchers = TRUSTED) -> Any:
    group = [SimpleNamespace(variant=SimpleNamespace(id=VID), floating_tag=VID,
                             content_hash=content)]
    matrix = SimpleNamespace(registry="127.0.0.1:5000", repository="torch")
    return resign.restore(matrix, group, newest, vouchers)  # type: ignore[arg-type]


def test_a_lost_signature_is_put_back_from_its_signed_copy_with_its_twin(world, capsys) -> None:
    again = restore(pub(OLD, f"{VID}-20261201"))
    assert again.digest == GOOD and again.dated_tag == TODAY and again.signed is True
    assert world["put_back"] == [(GOOD, {TODAY, *TAGS}),
                                 (TWIN, {f"{t}-zstd" for t in (TODAY, *TAGS)})]
    assert f"re-attached the signature of {GOOD[:19]} as `{TODAY}`" in capsys.readouterr().err


def test_a_dated_tag_planted_on_the_digest_is_never_signed(world, capsys) -> None:
    """`TODAY.3` on GOOD is newer than `TODAY` and GOOD's `.sig` is gone: signing the newest
    dated tag found would sign the attacker's; only the tag the copy names is put back."""
    again = restore()
    assert again.dated_tag == TODAY
    assert all(f"{TODAY}.3" not in tags for _, tags in world["put_back"])
    err = capsys.readouterr().err
    assert f"`{TODAY}.3` ({GOOD[:19]}): the signed copy of its digest's signature does not " \
           "name it: not signed" in err, err
    assert f"`{TODAY}.4`" not in err  # DECOY has no copy at all: nothing to say


def test_nothing_is_put_back_without_a_copy_naming_it(world) -> None:
    world["copies"] = {GOOD: [layer(GOOD, [f"{VID}-20261205", *TAGS])]}  # names another date
    assert restore() is None
    world["copies"] = {}
    assert restore() is None
    assert world["put_back"] == []


def test_nothing_else_is_put_back(world) -> None:
    assert restore(content="c" * 64) is None  # other content than this checkout's
    assert restore(pub(GOOD, f"{TODAY}.4")) is None  # not newer than the newest signed
    world["unsigned"] = {DECOY}  # GOOD's signature verifies: its other tags are forgeries
    assert restore() is None
    assert restore(vouchers=keypair.NOBODY) is None  # no trusted key to check a copy with
    assert world["put_back"] == []


def test_a_twin_without_a_copy_naming_its_tag_stays_unsigned(world, capsys) -> None:
    world["copies"][TWIN] = [layer(TWIN, ["other-zstd"])]
    assert restore().digest == GOOD
    assert world["put_back"] == [(GOOD, {TODAY, *TAGS})]
    assert f"`{TODAY}-zstd` ({TWIN[:19]}): the signed copy of its digest's signature does " \
           "not name it" in capsys.readouterr().err


def test_rebuild_check_names_the_lost_signature(world) -> None:
    found = resign.lost(SimpleNamespace(registry="127.0.0.1:5000", repository="torch"),  # type: ignore[arg-type]
                        VID, VID, pub(OLD, f"{VID}-20261201"), TRUSTED)
    assert found is not None
    line = resign.lost_line(found[0])
    assert line.startswith(f"`{TODAY}` ({GOOD[:19]}) lost its signature") and \
        "`builder publish` re-attaches it" in line, line
    assert resign.lost_data(found[0]) == {"tag": sign.sig_tag(GOOD), "old": "", "new": GOOD}


def test_a_lost_keyless_signature_is_never_signed_again(world, monkeypatch, capsys) -> None:
    """Identities alone (no key, no `.sig` copy: resign.say_lost_keyless): the dated tag is
    all that names the publication, read off the registry where a planted one cannot be told
    apart, so nothing is signed (not even with a token); one line says so, and publish then
    publishes the content anew under a dated tag it assigns."""
    for planted in (f"{TODAY}.3", f"{TODAY}.4"):
        del world["reg"].by_tag[planted]
    monkeypatch.setattr(resign.vouch, "attestations", lambda _r, _repo, digest, _k: (
        dict.fromkeys(("sbom", "smoke", "provenance"), 1) if digest == GOOD else {}, {}))
    signed: list[str] = []
    monkeypatch.setattr(keyless, "sign_and_attach", lambda *a, **k: signed.append("bundle"))
    group = [SimpleNamespace(variant=SimpleNamespace(id=VID), floating_tag=VID,
                             content_hash=CONTENT)]
    matrix = SimpleNamespace(registry="127.0.0.1:5000", repository="torch")
    vouchers = keypair.Vouchers(identities=(IDENTITY,))
    assert resign.restore(matrix, group, pub(OLD, f"{VID}-20261201"),  # type: ignore[arg-type]
                          vouchers) is None
    assert signed == [] and world["put_back"] == []
    assert f"`{TODAY}` ({GOOD[:19]}) lost its keyless signature: not signed again" in \
        capsys.readouterr().err
