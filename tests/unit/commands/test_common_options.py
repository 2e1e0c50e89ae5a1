"""--timeout-scale and --ca-bundle are checked when the arguments are parsed (exit 2); the CA
bundle reaches the host-side downloads; `registry start` names a registry it did not start."""

from __future__ import annotations

import argparse

import pytest
from matrix_files import ROOT

from builder import cli
from builder.commands import registry as registry_cmd
from builder.core import proc, registry
from builder.core.errors import BuilderError


def test_timeout_scale_must_be_positive_and_ca_bundle_readable(capsys):
    for argv in (["smoke", "img", "--timeout-scale", "-1"], ["smoke", "img", "--timeout-scale",
                                                              "0"],
                 ["build", "--ca-bundle", "/no/such/bundle.pem"]):
        with pytest.raises(SystemExit) as exc:
            cli.build_parser().parse_args(argv)
        assert exc.value.code == 2
    assert "is not a readable file" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["build", "rebuild"])
def test_a_ca_bundle_that_is_not_a_readable_file_is_bad_usage(command, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.build_parser(command).parse_args([command, "--ca-bundle", "/nonexistent"])
    assert exc.value.code == 2
    assert "/nonexistent is not a readable file" in capsys.readouterr().err


def test_ca_bundle_reaches_the_host_side_downloads(tmp_path, monkeypatch):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    monkeypatch.setenv(proc.CA_BUNDLE_ENV, str(bundle))
    assert proc.host_ca_bundle() == str(bundle)


def test_registry_start_names_a_foreign_registry(tmp_path, monkeypatch):
    monkeypatch.setenv("BUILDER_STATE", str(tmp_path))
    monkeypatch.setattr(registry, "is_up", lambda addr, timeout=2.0: True)
    monkeypatch.setattr(registry_cmd.portowner, "listener", lambda addr: registry_cmd.portowner
                        .Listener(0, 4242, ["docker-registry", "serve", "/srv/reg/config.yml"]))
    monkeypatch.setattr(registry_cmd.portowner, "free_port", lambda host, start: 5001)
    args = argparse.Namespace(matrix=str(ROOT / "matrix.yaml"), addr=None, action="start",
                              json=False)
    with pytest.raises(BuilderError) as caught:
        registry_cmd.cmd_registry(args)
    assert caught.value.exit_code == 2
    assert str(caught.value).startswith("a registry this checkout did not start answers on "
                                        "127.0.0.1:5000: pid 4242 (`docker-registry serve")
    assert f"its storage in {tmp_path / 'registry' / 'storage'}" in caught.value.hint
    assert "`builder registry start --addr 127.0.0.1:5001`" in caught.value.hint
