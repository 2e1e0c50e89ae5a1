"""The matrix's `trust_keys`: the cosign public keys publish (and rebuild) trust by default."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec

from builder.core import keypair
from builder.core.errors import BuilderError
from builder.model import matrix

ROOT = Path(__file__).resolve().parents[3]


def test_trust_keys_are_read_relative_to_the_matrix(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "keys" / "cosign.pub").write_bytes(keypair.public_pem(key.public_key()))
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text())
    data["trust_keys"] = ["keys/cosign.pub"]
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(data))
    m = matrix.load(tmp_path / "matrix.yaml")
    assert m.trust_keys == (tmp_path / "keys" / "cosign.pub",)
    trust = keypair.trust(None, m.trust_keys, unsigned=True)
    assert [keypair.key_id(k) for k in trust.keys] == [keypair.key_id(key.public_key())]
    assert matrix.load(ROOT / "matrix.yaml").trust_keys == ()


def test_publishing_without_a_key_needs_unsigned(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COSIGN_PRIVATE_KEY", raising=False)
    with pytest.raises(BuilderError, match="no signing key") as exc:
        keypair.trust(None, (), unsigned=False)
    assert exc.value.exit_code == 2 and "--unsigned" in (exc.value.hint or "")
    assert keypair.trust(None, (), unsigned=True) == keypair.UNSIGNED
