"""Errors in uv's style: an `error:` line, `Caused by:` lines for a kept cause, a `hint:` line;
with --json, one object whose "hint" is never null. The exit-code contract is unchanged."""

from __future__ import annotations

import argparse
import json

import pytest

from builder import cli
from builder.core import errors
from builder.core.errors import BuilderError, ConfigError, GateRefused

KINDS = [BuilderError, *BuilderError.__subclasses__(),
         *(k for sub in BuilderError.__subclasses__() for k in sub.__subclasses__())]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_every_kind_of_error_has_a_hint(kind: type[BuilderError]) -> None:
    assert kind.default_hint.strip()


def _fail(exc: BaseException):
    def func(_args: argparse.Namespace) -> int:
        raise exc
    return func


def test_text_error_has_error_caused_by_and_hint_lines(capsys):
    try:
        raise OSError(13, "Permission denied")
    except OSError as cause:
        exc = BuilderError("cannot write out/site")
        exc.__cause__ = cause
    code = cli.run(argparse.Namespace(func=_fail(exc), json=False, debug=False))
    assert code == errors.COULD_NOT_RUN
    assert capsys.readouterr().err.splitlines() == [
        "error: cannot write out/site", "  Caused by: [Errno 13] Permission denied", "",
        f"hint: {BuilderError.default_hint}"]


@pytest.mark.parametrize(("exc", "code"), [
    (ConfigError("matrix.yaml is invalid"), errors.FINDINGS),
    (BuilderError("the registry went away"), errors.COULD_NOT_RUN),
    (RuntimeError("a bug"), errors.COULD_NOT_RUN),
])
def test_json_error_always_carries_a_hint(exc, code, capsys):
    assert cli.run(argparse.Namespace(func=_fail(exc), json=True, debug=False)) == code
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_code"] == code and doc["hint"] and doc["caused_by"] == []


def test_a_cause_the_message_already_quotes_is_said_once(capsys):
    cause = ValueError("Expecting value: line 1 column 1 (char 0)")
    exc = BuilderError(f"`a.json` is not JSON: {cause}", hint="pass an SBOM")
    exc.__cause__ = cause
    cli.run(argparse.Namespace(func=_fail(exc), json=False, debug=False))
    assert "Caused by" not in capsys.readouterr().err


def test_an_error_after_the_document_adds_nothing_to_stdout(capsys):
    def refuse(_args: argparse.Namespace) -> int:
        print(json.dumps({"results": []}))
        raise GateRefused("1 of 1 variants refused", printed=True)

    assert cli.run(argparse.Namespace(func=refuse, json=True, debug=False)) == errors.FINDINGS
    assert json.loads(capsys.readouterr().out) == {"results": []}
