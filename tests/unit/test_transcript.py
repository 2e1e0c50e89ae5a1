"""tests/transcript.py: with BUILDER_TRANSCRIPT set, each e2e `builder` command is appended as
`$ builder ARGS`, its output and `exit N`; unset, nothing is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import transcript


def test_an_entry_is_the_command_its_output_and_its_exit_status() -> None:
    text = transcript.entry(["verify", "--key", "my key.pub", "REF"], 1, "ok\n", "error: no",
                            test="e2e/test_x.py::test_y (call)")
    assert text == ("# e2e/test_x.py::test_y (call)\n"
                    "$ builder verify --key 'my key.pub' REF\nok\nerror: no\nexit 1\n\n")


def test_an_entry_without_output_or_test_is_two_lines() -> None:
    assert transcript.entry(["plan"], 0, "", "") == "$ builder plan\nexit 0\n\n"


def test_entries_are_appended_when_the_variable_names_a_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "transcript.txt"
    monkeypatch.setenv(transcript.ENV, str(path))
    monkeypatch.delenv("PYTEST_CURRENT_TEST")
    transcript.append(["plan"], 0, "up-to-date\n", "")
    transcript.append(["publish"], 2, "", "error: x\n")
    assert path.read_text() == ("$ builder plan\nup-to-date\nexit 0\n\n"
                                "$ builder publish\nerror: x\nexit 2\n\n")


def test_nothing_is_written_when_the_variable_is_unset(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(transcript.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    transcript.append(["plan"], 0, "up-to-date\n", "")
    assert list(tmp_path.iterdir()) == []
