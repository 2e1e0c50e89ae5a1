"""cosign's older keyless format end to end: a `.sig` and an `.att` layer made with cosign's
steps against the mock sigstore (tests/e2e/legacy_cosign.py: Fulcio certificate, Rekor SET in
the annotations), pushed beside a tiny image in a real registry, checked by `builder verify
--certificate-identity …` against the mock's trusted root. Builds nothing."""

from __future__ import annotations

from pathlib import Path

import legacy_cosign
import pytest
from helpers import fake_image
from keyless_mock import MAIN, PULL, by, token
from test_keyless_e2e import REPOSITORY, reg, verify

from builder.core import keyless_sig, oci, sign

pytestmark = pytest.mark.docker
__all__ = ["reg"]  # the module fixture this file shares (`mock` is conftest's)


def signed(reg: oci.Registry, mock: Path, subject: str, title: str) -> tuple[str, sign.Layer]:
    """A new tiny image whose `.sig` holds one keyless layer by `subject`: its digest, the layer."""
    digest = fake_image(reg, REPOSITORY, {"org.opencontainers.image.title": title})
    layer = legacy_cosign.layer((mock / "url").read_text(), token(subject),
                                f"{reg.registry}/{REPOSITORY}", digest)
    sign.write_layers(reg, REPOSITORY, sign.sig_tag(digest), [layer])
    return digest, layer


def test_cosign_keyless_sig_and_att_verify_by_identity_and_forgeries_are_refused(
        reg: oci.Registry, mock: Path) -> None:
    root = mock / "trusted_root.json"
    digest, layer = signed(reg, mock, MAIN, "legacy")
    rows, _ = verify(reg, digest, *by(), root=root)
    assert rows["signature"]["status"] == "ok", rows["signature"]
    assert rows["signature"]["detail"].startswith("cosign keyless signature (.sig) over ")
    assert MAIN in rows["signature"]["detail"]
    sbom = legacy_cosign.attestation((mock / "url").read_text(), token(MAIN),
                                     f"{reg.registry}/{REPOSITORY}", digest,
                                     sign.PREDICATES["sbom"], {"bomFormat": "CycloneDX"})
    sign.write_layers(reg, REPOSITORY, sign.att_tag(digest), [sbom])
    rows, _ = verify(reg, digest, *by(), root=root)
    assert rows["attestation sbom"]["status"] == "ok", rows["attestation sbom"]
    assert "cosign keyless .att by " + MAIN in rows["attestation sbom"]["detail"]

    pulled, _ = signed(reg, mock, PULL, "legacy-pull")
    rows, _ = verify(reg, pulled, *by(), root=root)
    assert "a pull-request ref identity: signed by " + PULL in rows["signature"]["detail"]

    _, other_layer = signed(reg, mock, MAIN, "legacy-other")  # its SET, spliced into ours
    spliced = sign.Layer(layer.media_type, layer.data, {
        **layer.annotations,
        keyless_sig.BUNDLE_ANNOTATION: other_layer.annotations[keyless_sig.BUNDLE_ANNOTATION]})
    sign.write_layers(reg, REPOSITORY, sign.sig_tag(digest), [spliced])
    rows, stderr = verify(reg, digest, *by(), root=root)
    assert rows["signature"]["status"] == "fail"
    assert "a log entry that does not include the signature" in rows["signature"]["detail"]
    assert [x for x in stderr.splitlines() if x.startswith("error:")], stderr
