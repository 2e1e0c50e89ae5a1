"""Each command's --help lists only the options it uses (commands/options.add_command)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from builder import cli

# Every command module is imported now, at collection: some import what runs a command on import
# (core/swap.py's ctypes.util.find_library runs ldconfig), which conftest forbids inside a test.
cli.build_parser()

README = Path(__file__).resolve().parents[3] / "README.md"
NO_SELECTION = ("keygen", "registry", "verify", "attest", "catalog", "reproduce", "smoke", "sbom", "audit")


def help_of(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("command", NO_SELECTION)
def test_commands_without_a_selection_offer_no_select(command, capsys):
    assert "--select" not in help_of(command, capsys)


@pytest.mark.parametrize("command", sorted(cli.COMMANDS))
def test_every_command_takes_matrix_and_json_as_the_readme_says(command, capsys):
    """So that `builder keygen --matrix m.yaml` (a script passing one matrix to every command)
    is not refused; verify, smoke, sbom and audit read its `insecure_registries`, verify its
    repository for a bare tag."""
    text = help_of(command, capsys)
    assert "--matrix FILE" in text and "--json" in text


def test_the_readme_names_the_commands_that_take_select() -> None:
    text = " ".join(README.read_text().split())
    listed = re.search(r"those over variants \(`([a-z ]+)`\) take `--select", text)[1]
    assert sorted(listed.split()) == sorted(set(cli.COMMANDS) - set(NO_SELECTION))


@pytest.mark.parametrize("command", ["keygen", "registry", "validate", "lock", "render"])
def test_commands_that_ask_no_registry_offer_no_insecure_registry(command, capsys):
    assert "--insecure-registry" not in help_of(command, capsys)


@pytest.mark.parametrize("command", sorted(set(cli.COMMANDS) - set(NO_SELECTION)))
def test_commands_over_the_matrix_keep_select_and_matrix(command, capsys):
    text = help_of(command, capsys)
    assert "--select" in text and "--matrix" in text and "--json" in text


def test_sbom_usage_is_one_line_per_form(capsys):
    usage = help_of("sbom", capsys).split("\n\n")[0]
    assert "usage: builder sbom IMAGE " in usage
    assert "\n       builder sbom diff OLD NEW [--json]" in usage
    assert "|" not in usage.replace("HOST[:PORT]|CIDR", "")
