"""Every `builder COMMAND … --flag` the README shows is a flag that command's --help offers, and
the quick start (the README's first section) is short and names only real commands."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from builder import cli

README = Path(__file__).resolve().parents[2] / "README.md"
cli.build_parser()  # every command module imported at collection (see test_help)

# `builder CMD rest-of-snippet`, in a code span or a code block line, up to where the shell
# command ends (a pipe, &&, ;, a comment, the span's end).
CALL = re.compile(r"(?:\.venv/bin/)?\bbuilder((?:\s+--?[a-z][\w-]*)*)\s+([a-z][a-z-]*)"
                  r"([^`|;&#\n]*)")
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*)")


def snippets(text: str) -> list[str]:
    """Inline code spans and the lines of fenced code blocks."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", text, re.S | re.M)
    outside = re.sub(r"^```[a-z]*\n.*?^```", "", text, flags=re.S | re.M)
    return [line for block in blocks for line in block.splitlines()] + re.findall(
        r"`([^`\n]+)`", outside)


def calls(text: str) -> list[tuple[str, list[str]]]:
    """(command, flags) of every `builder COMMAND …` in the README."""
    found = []
    for snippet in snippets(text):
        for match in CALL.finditer(snippet.replace("\\|", "|")):
            if match[2] in cli.COMMANDS:
                found.append((match[2], FLAG.findall(match[3])))
    return found


def help_of(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        cli.main([command, "--help"])
    return capsys.readouterr().out


def test_every_flag_the_readme_shows_is_in_that_commands_help(capsys):
    shown = calls(README.read_text())
    assert len(shown) > 40  # the README's commands were found
    helps = {command: help_of(command, capsys) for command in {c for c, _ in shown}}
    missing = sorted({f"builder {command} {flag}" for command, flags in shown for flag in flags
                      if not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])",
                                       helps[command])})
    assert missing == []


def test_the_quick_start_is_the_first_section_and_at_most_15_lines() -> None:
    text = README.read_text()
    first = text.split("\n## ", 2)[1]
    assert first.startswith("Quick start") and len(first.rstrip().splitlines()) <= 15
    lines = re.search(r"```sh\n(.*?)```", first, re.S)[1].splitlines()
    steps = [line.split("  #")[0].strip() for line in lines]
    commands = [s.split()[1] for s in steps if s.startswith("builder ")]
    assert commands == ["build", "keygen", "publish", "verify", "catalog"]
    assert steps[0].startswith("git clone") and steps[1] == "tools/setup.sh"
    assert ".venv/bin" in first  # where `builder` is
    untimed = [line for line in lines if not line.startswith("export")
               and not re.search(r"  # [\d.]+ (s|min)\b", line)]
    assert untimed == []  # the time each step took here
