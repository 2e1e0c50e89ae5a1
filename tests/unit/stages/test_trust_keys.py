"""The matrix's `trust:` (keys and workflow identities; `trust_keys:` its deprecated spelling of
`trust.keys`): who publish, rebuild, plan and build trust by default, each half overridden on
its own by the command line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec

from builder import cli
from builder.commands import options
from builder.core import keyless, keypair
from builder.core.errors import BuilderError
from builder.model import matrix
from builder.model.matrix_yaml import MatrixError

ROOT = Path(__file__).resolve().parents[3]
WORKFLOW = "https://github.com/o/r/.github/workflows/build.yml@refs/heads/main"


def write(tmp_path: Path, **fields: Any) -> Path:
    (tmp_path / "keys").mkdir(exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "keys" / "cosign.pub").write_bytes(keypair.public_pem(key.public_key()))
    data = yaml.safe_load((ROOT / "matrix.yaml").read_text()) | fields
    (tmp_path / "matrix.yaml").write_text(yaml.safe_dump(data))
    return tmp_path / "matrix.yaml"


def test_trust_keys_are_read_relative_to_the_matrix(tmp_path: Path) -> None:
    m = matrix.load(write(tmp_path, trust_keys=["keys/cosign.pub"]))  # the deprecated spelling
    assert m.trust_keys == (tmp_path / "keys" / "cosign.pub",)
    assert len(options.matrix_vouchers(m).keys) == 1
    assert matrix.load(ROOT / "matrix.yaml").trust_keys == ()


def test_trust_names_keys_and_identities(tmp_path: Path) -> None:
    m = matrix.load(write(tmp_path, trust={
        "keys": ["keys/cosign.pub"], "trusted_root": "root.json",
        "identities": [{"issuer": keyless.GITHUB_ISSUER, "identity": WORKFLOW},
                       {"issuer": keyless.GITHUB_ISSUER, "identity_regexp": "https://x/.*"}]}))
    found = options.matrix_vouchers(m)
    assert len(found.keys) == 1 and found.trusted_root == tmp_path / "root.json"
    assert found.identities == (keypair.Identity(keyless.GITHUB_ISSUER, WORKFLOW),
                                keypair.Identity(keyless.GITHUB_ISSUER, regexp="https://x/.*"))


def test_an_identity_alone_is_trusted_and_the_command_line_overrides_each_half(
        tmp_path: Path) -> None:
    path = write(tmp_path, trust={"keys": ["keys/cosign.pub"], "identities": [
        {"issuer": keyless.GITHUB_ISSUER, "identity": WORKFLOW}]})
    args = cli.build_parser("publish").parse_args([
        "publish", "--matrix", str(path), "--certificate-identity", WORKFLOW + "x",
        "--certificate-oidc-issuer", keyless.GITHUB_ISSUER])
    found = options.vouchers(args, matrix.load(path))
    assert len(found.keys) == 1  # the matrix's keys stay
    assert [x.identity for x in found.identities] == [WORKFLOW + "x"]
    (tmp_path / "only").mkdir()
    only = matrix.load(write(tmp_path / "only", trust={"identities": [
        {"issuer": keyless.GITHUB_ISSUER, "identity": WORKFLOW}]}))
    assert options.matrix_vouchers(only).keys == () and options.matrix_vouchers(only)


@pytest.mark.parametrize("fields", [
    {"trust": {"keys": ["a.pub"]}, "trust_keys": ["a.pub"]},
    {"trust": {"identities": [{"issuer": keyless.GITHUB_ISSUER}]}},
    {"trust": {"identities": [{"issuer": keyless.GITHUB_ISSUER, "identity": WORKFLOW,
                               "identity_regexp": ".*"}]}},
])
def test_an_ambiguous_trust_is_refused(tmp_path: Path, fields: dict[str, Any]) -> None:
    with pytest.raises(MatrixError):
        matrix.load(write(tmp_path, **fields))


def test_publishing_without_a_key_needs_unsigned_or_a_token(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COSIGN_PRIVATE_KEY", raising=False)
    with pytest.raises(BuilderError, match="no signing key") as exc:
        keypair.trust(None, keypair.NOBODY, unsigned=False)
    assert exc.value.exit_code == 2 and "--unsigned" in (exc.value.hint or "")
    assert keypair.trust(None, keypair.NOBODY, unsigned=True) == keypair.UNSIGNED
    identity = keypair.Vouchers(identities=(keypair.Identity(keyless.GITHUB_ISSUER, WORKFLOW),))
    signer = keypair.KeylessSigner("TOKEN")
    trust = keypair.trust(None, identity, unsigned=False, keyless=signer)
    assert trust.signs and trust.key is None and trust.vouchers == identity
