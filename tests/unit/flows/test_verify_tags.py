"""builder.flows.verify_tags: the tag a platform team asked by must be signed for the digest,
agree with the labels, and not be rolled back behind the latest dated publication."""

from __future__ import annotations

from builder.core import labels, oci, sign
from builder.flows import verify_tags

OLD, NEW = "sha256:" + "1" * 64, "sha256:" + "2" * 64
FLOATING = "2.13.0-py3.11-cpu-runtime"
LABELS = {labels.TORCH: "2.13.0+cpu", labels.PYTHON: "3.11", labels.ACCELERATOR: "cpu",
          labels.FLAVOR: "runtime", labels.CONTENT_HASH: "e" * 64}


class Tags:
    """The registry calls verify_tags makes: the tag list and HEAD."""

    def __init__(self, tags: dict[str, str]) -> None:
        self.by_tag = tags

    def tags(self, repository: str) -> list[str]:
        return list(self.by_tag)

    def head(self, repository: str, ref: str) -> oci.Descriptor | None:
        digest = self.by_tag.get(ref)
        return oci.Descriptor(digest, oci.OCI_MANIFEST, 1) if digest else None


def payload(*tags: str) -> dict:
    return {"optional": sign.tag_annotations("v", tags)}


def check(reg: Tags, tag: str, digest: str, *payloads: dict) -> list[tuple[str, bool, str]]:
    return verify_tags.findings(reg, "torch", tag, digest, [LABELS], list(payloads))  # type: ignore[arg-type]


def test_the_genuine_tags_pass_and_an_unsigned_tag_fails() -> None:
    reg = Tags({f"{FLOATING}-20260101": OLD, f"{FLOATING}-20260102": NEW, FLOATING: NEW,
                "latest": NEW, "build-" + "e" * 20: NEW})
    signed = payload(f"{FLOATING}-20260102", "build-" + "e" * 20, FLOATING, "latest")
    for tag in (FLOATING, f"{FLOATING}-20260102", "build-" + "e" * 20, "latest"):
        assert all(ok for _, ok, _ in check(reg, tag, NEW, signed)), tag
    [(what, ok, detail)] = check(reg, "latest-slim", NEW, signed)
    assert (what, ok) == ("tag signed", False)
    assert detail.startswith("`latest-slim` is not among the tags signed for sha256:2222")
    assert check(reg, "latest", NEW)[0][2].endswith("(signed: none)")  # a signature without tags


def test_a_floating_tag_or_alias_rolled_back_to_an_older_signed_publication_is_reported() -> None:
    reg = Tags({f"{FLOATING}-20260101": OLD, f"{FLOATING}-20260102": NEW, FLOATING: OLD,
                "latest": OLD, f"{FLOATING}-zstd-20260103": "sha256:" + "3" * 64})
    old = payload(f"{FLOATING}-20260101", FLOATING, "latest")
    for tag in (FLOATING, "latest"):
        [*_, (what, ok, detail)] = check(reg, tag, OLD, old)
        assert (what, ok) == ("tag rollback", False)
        assert detail == (f"`{tag}` is rolled back: it points at the publication of "
                          f"`{FLOATING}-20260101`, older than the latest dated publication "
                          f"`{FLOATING}-20260102` (sha256:222222222222)")
    # the dated tag of the old publication is what it always was
    assert all(ok for _, ok, _ in check(reg, f"{FLOATING}-20260101", OLD, old))
    # without keys: no signed tags to read, the grammar alone
    assert verify_tags.findings(reg, "torch", FLOATING, OLD, [LABELS], None) == [  # type: ignore[arg-type]
        ("tag", True, f"`{FLOATING}` agrees with the labels of every platform")]


def test_a_forged_dated_tag_does_not_hide_a_rollback(monkeypatch) -> None:
    """The floating tag moved back to OLD and a newer dated tag forged on OLD: with keys, only
    dated tags signed for their digest count, so the rollback is still reported."""
    forged, future = f"{FLOATING}-20260103", f"{FLOATING}-99991231"
    reg = Tags({f"{FLOATING}-20260101": OLD, f"{FLOATING}-20260102": NEW, forged: OLD,
                future: OLD, FLOATING: OLD})
    real = {(OLD, f"{FLOATING}-20260101"), (NEW, f"{FLOATING}-20260102"), (OLD, future)}
    monkeypatch.setattr(verify_tags.sign, "names_tag",
                        lambda _r, _repo, digest, tag, _k: (digest, tag) in real)
    old = payload(f"{FLOATING}-20260101", FLOATING)
    [*_, (what, ok, detail)] = verify_tags.findings(
        reg, "torch", FLOATING, OLD, [LABELS], [old], ("trusted",))  # type: ignore[arg-type]
    assert (what, ok) == ("tag rollback", False)
    assert detail.endswith(f"`{FLOATING}-20260102` (sha256:222222222222)")
    assert all(ok for _, ok, _ in check(reg, FLOATING, OLD, old))  # no keys: forged counts


def rollback_payload(to: str, since: str, *tags: str) -> dict:
    return {"optional": {**sign.tag_annotations("v", tags), sign.ROLLBACK_TO: to,
                         sign.ROLLBACK_FROM: since}}


def test_a_signed_rollback_from_the_newest_publication_is_ok() -> None:
    """`publish --rollback-to` signs the old digest naming the floating tag and the newest
    dated tag it rolls back from: verify reports the rollback as signed, not as tampering."""
    reg = Tags({f"{FLOATING}-20260101": OLD, f"{FLOATING}-20260102": NEW, FLOATING: OLD})
    old = payload(f"{FLOATING}-20260101", FLOATING)
    back = rollback_payload(f"{FLOATING}-20260101", f"{FLOATING}-20260102",
                            f"{FLOATING}-20260101", FLOATING)
    [*_, (what, ok, detail)] = check(reg, FLOATING, OLD, old, back)
    assert (what, ok) == ("signed rollback", True)
    assert detail == (f"`{FLOATING}` is a signed rollback to `{FLOATING}-20260101` from "
                      f"`{FLOATING}-20260102`, made by a trusted key")


def test_a_stale_or_unnamed_rollback_signature_does_not_excuse_a_rollback() -> None:
    """A newer publication since the rollback (its `rollback-from` is no longer the newest),
    or a rollback signature that does not name the tag: the tag is still rolled back."""
    reg = Tags({f"{FLOATING}-20260101": OLD, f"{FLOATING}-20260102": NEW,
                f"{FLOATING}-20260103": NEW, FLOATING: OLD, "latest": OLD})
    stale = rollback_payload(f"{FLOATING}-20260101", f"{FLOATING}-20260102", FLOATING, "latest")
    assert check(reg, FLOATING, OLD, stale)[-1][:2] == ("tag rollback", False)
    reg = Tags({f"{FLOATING}-20260101": OLD, f"{FLOATING}-20260102": NEW, FLOATING: OLD,
                "latest": OLD})
    other = rollback_payload(f"{FLOATING}-20260101", f"{FLOATING}-20260102", FLOATING)
    named = payload(f"{FLOATING}-20260101", FLOATING, "latest")
    assert check(reg, "latest", OLD, named, other)[-1][:2] == ("tag rollback", False)
