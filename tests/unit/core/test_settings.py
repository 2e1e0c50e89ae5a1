"""The run's settings: made once from the arguments, the matrix and the environment, applied
around the command, and read (never written) by the modules that need them."""

from __future__ import annotations

import pytest

from builder import cli
from builder.commands.options import resolve
from builder.core import oci, proc, registry_http, settings
from builder.core.errors import UsageError

PUBLISH = cli.build_parser("publish")  # at collection: its imports run ldconfig (core/swap.py)


def test_the_environment_is_read_afresh_outside_a_command(monkeypatch, tmp_path):
    bundle = tmp_path / "ca.pem"
    bundle.write_text("x")
    monkeypatch.setenv(settings.CA_BUNDLE_ENV, str(bundle))
    monkeypatch.setenv(settings.DEADLINE_ENV, "7.5")
    monkeypatch.setenv(settings.INSECURE_ENV, "lab.example:5000, 10.1.0.0/16")
    now = settings.current()
    assert (now.ca_bundle, now.registry_deadline_s) == (str(bundle), 7.5)
    assert now.insecure_registries == ("lab.example:5000", "10.1.0.0/16")
    assert proc.host_ca_bundle() == str(bundle)
    assert oci.Registry("r.example").deadline == 7.5


@pytest.mark.parametrize("value", ["abc", "0", "-1", "inf"])
def test_a_deadline_that_is_no_number_of_seconds_is_bad_usage(monkeypatch, value):
    monkeypatch.setenv(settings.DEADLINE_ENV, value)
    with pytest.raises(UsageError, match=settings.DEADLINE_ENV):
        settings.current()


def test_the_command_line_wins_and_the_settings_end_with_the_command(monkeypatch, tmp_path):
    env_bundle, given = tmp_path / "env.pem", tmp_path / "given.pem"
    env_bundle.write_text("x")
    given.write_text("y")
    monkeypatch.setenv(settings.CA_BUNDLE_ENV, str(env_bundle))
    args = PUBLISH.parse_args(
        ["publish", "--ca-bundle", str(given), "--insecure-registry", "10.9.0.0/16"])
    with settings.applied(resolve(args)):
        assert proc.host_ca_bundle() == str(given)
        assert registry_http.is_insecure("10.9.8.7:5000")
    assert proc.host_ca_bundle() == str(env_bundle)
    assert not registry_http.is_insecure("10.9.8.7:5000")


def test_settings_are_frozen():
    with pytest.raises(AttributeError):
        settings.current().ca_bundle = "/tmp/x"  # type: ignore[misc]
