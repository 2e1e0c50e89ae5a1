"""BUILDER_SIGSTORE_CONFIG and BUILDER_TRUSTED_ROOT name another sigstore instance than the
public good for a whole machine (the workflow rehearsal's runner, where the workflows pass no
--sigstore-config or --trusted-root): the options' defaults, the command line winning, and the
environment winning over the matrix's `trust.trusted_root`. Unset, as on GitHub's runners,
signing goes to the public good and verification uses the pinned root."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder import cli
from builder.commands import options
from builder.core import keypair


def parsed(*argv: str):
    return cli.build_parser(argv[0]).parse_args(list(argv))


def test_unset_means_the_public_good(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(options.SIGSTORE_CONFIG_ENV, raising=False)
    monkeypatch.delenv(options.TRUSTED_ROOT_ENV, raising=False)
    monkeypatch.setenv("SIGSTORE_ID_TOKEN", "TOKEN")
    args = parsed("publish")
    assert options.sigstore_config(args) is None and options.trusted_root(args) is None
    assert options.keyless_signer(args) == keypair.KeylessSigner("TOKEN", None)


def test_the_environment_names_the_instance_and_the_command_line_wins(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(options.SIGSTORE_CONFIG_ENV, "/mock/trust_config.json")
    monkeypatch.setenv(options.TRUSTED_ROOT_ENV, "/mock/trusted_root.json")
    monkeypatch.setenv("SIGSTORE_ID_TOKEN", "TOKEN")
    for command in ("publish", "rebuild", "attest"):
        args = parsed(command, *(["REF"] if command == "attest" else []))
        assert options.sigstore_config(args) == Path("/mock/trust_config.json"), command
    assert options.keyless_signer(parsed("build", "--stage")) == keypair.KeylessSigner(
        "TOKEN", Path("/mock/trust_config.json"))
    extra = {"verify": ["REF"], "catalog": ["--out", "site"]}
    for command in ("publish", "verify", "catalog", "build"):
        args = parsed(command, *extra.get(command, []))
        assert options.trusted_root(args) == Path("/mock/trusted_root.json"), command
    given = parsed("verify", "REF", "--trusted-root", "/given.json")
    assert options.trusted_root(given) == Path("/given.json")
    given = parsed("publish", "--sigstore-config", "/given.json")
    assert options.sigstore_config(given) == Path("/given.json")


def test_the_environment_wins_over_the_matrix_trusted_root(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(options, "matrix_vouchers", lambda m: keypair.Vouchers(
        trusted_root=Path("/matrix/trusted_root.json")))
    monkeypatch.delenv(options.TRUSTED_ROOT_ENV, raising=False)
    assert options.vouchers(parsed("publish"), object()).trusted_root == Path(
        "/matrix/trusted_root.json")
    monkeypatch.setenv(options.TRUSTED_ROOT_ENV, "/mock/trusted_root.json")
    assert options.vouchers(parsed("publish"), object()).trusted_root == Path(
        "/mock/trusted_root.json")
