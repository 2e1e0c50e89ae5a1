"""`builder verify --certificate-identity …`: the keyless half of the signature and attestation
rows, and how it combines with the key half (either is enough unless --require-all)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from builder.core import keyless, keyless_sig, oci, sign

Found = tuple[Any, str]  # (the verified document, or None; the row's detail)
# keyless.verified_statements of one digest, read and verified once for every row that needs
# it: predicate type → (statement, signer), the refusals, and the predicate types that came from
# cosign's older format (builder.core.keyless_sig) rather than a bundle
Statements = tuple[dict[str, tuple[dict[str, Any], keyless.Signer]], list[str], frozenset[str]]


def statements(reg: oci.Registry, repository: str, digest: str,
               policy: keyless.KeylessPolicy) -> Statements | None:
    """The digest's bundles verified by the trusted identities (None when none are given);
    what no verified bundle says, keyless `.sig`/`.att` layers in cosign's older format
    (builder.core.keyless_sig) may."""
    if not policy.identities:
        return None
    good, refused = keyless.verified_statements(reg, repository, digest, policy)
    older, older_refused = keyless_sig.verified_statements(reg, repository, digest, policy,
                                                           set(good))
    return good | older, refused + older_refused, frozenset(older)


def image_signature(verified: Statements, digest: str) -> Found:
    """(the signer, or None; the detail) of the image's keyless signature: a bundle of
    cosign's image predicate by a trusted identity."""
    good, refused, older = verified
    if keyless.IMAGE_PREDICATE in good:
        signer = good[keyless.IMAGE_PREDICATE][1]
        what = ("cosign keyless signature (.sig)" if keyless.IMAGE_PREDICATE in older
                else "sigstore bundle")
        return signer, f"{what} over {digest[:19]} by {signer.describe()}"
    return None, _why_not(refused)


def attestations(verified: Statements, digest: str) -> dict[str, Found]:
    """kind → (the verified statement or None, the detail) for each evidence kind."""
    good, refused, older = verified
    found: dict[str, Found] = {}
    for kind, predicate_type in sign.PREDICATES.items():
        if predicate_type in good:
            statement, signer = good[predicate_type]
            what = "cosign keyless .att" if predicate_type in older else "sigstore bundle"
            found[kind] = statement, (f"{predicate_type}, {what} by {signer.describe()}, "
                                      f"subject {digest[:19]}")
        else:
            found[kind] = None, _why_not(refused, f"no keyless {kind} attestation")
    return found


def _why_not(refused: list[str], missing: str = "no sigstore bundle attached") -> str:
    """The reason a platform team needs: the first refusal (one line), or that none is there."""
    if not refused:
        return missing
    more = f" (and {len(refused) - 1} more refused)" if len(refused) > 1 else ""
    return f"keyless: {refused[0]}{more}"


def pick(found: Sequence[Found], require_all: bool) -> Found:
    """One verdict from the key's and the identity's: the first verified document when either
    is enough, else (with --require-all) only when every one verified; the detail joins them."""
    failed = [detail for doc, detail in found if doc is None]
    passed = [(doc, detail) for doc, detail in found if doc is not None]
    if passed and not (require_all and failed):
        return passed[0][0], "; ".join(detail for _, detail in passed)
    return None, "; ".join(failed)
