"""stdout stays one JSON document when a command fails after printing its results; a closed stdout
ends quietly with 141; a JSON document nested 5000 deep is a message."""

from __future__ import annotations

import argparse
import json
import os
import sys

import pytest
from matrix_files import CPU, ROOT

from builder import cli
from builder.commands import sbom as sbom_cmd
from builder.core import output, proc
from builder.core.errors import BuilderError, GateRefused
from builder.stages import publish


def test_json_prints_one_document_when_the_command_fails_after_its_results(monkeypatch, capsys):
    """`publish --dry-run --json` with nothing staged: the results (with the refusals), then the
    GateRefused; stdout is still one document."""

    def refuse(_args: argparse.Namespace) -> int:
        output.emit_json([{"id": CPU, "status": "refused", "reason": "not staged"}])
        raise GateRefused("1 of 1 images refused: " + CPU, printed=True)

    args = argparse.Namespace(func=refuse, json=True, debug=False)
    assert cli.run(args) == 1
    out, err = capsys.readouterr()
    assert json.loads(out)[0]["status"] == "refused"
    assert f"error: 1 of 1 images refused: {CPU}" in err


def test_a_closed_stdout_ends_quietly_with_141(monkeypatch, capsys):
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader (`| head`) is gone before anything is written
    monkeypatch.setattr(sys, "stdout", os.fdopen(write_end, "w"))
    monkeypatch.setattr(proc, "install_signal_handlers", lambda: None)
    code = cli.main(["validate", "--json", "--offline", "--matrix", str(ROOT / "matrix.yaml")])
    assert code == 141
    assert capsys.readouterr().err == ""


def test_an_sbom_nested_5000_deep_is_a_message(tmp_path):
    deep = tmp_path / "deep.cdx.json"
    deep.write_text('{"bomFormat": "CycloneDX", "components": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(BuilderError, match=r"deep\.cdx\.json` is not JSON: nested deeper than"):
        sbom_cmd._load(deep)
    cand = publish.Candidate(planned=None, image="x", evidence={"sbom": deep.read_bytes()})  # type: ignore[arg-type]
    assert "the SBOM is not JSON: nested deeper than" in publish.sbom_gate(cand)
