"""How a problem in matrix.yaml or --select reads: alias names that would take a generated tag,
a repeated --select key (any of), an unknown one (did you mean), the tag pattern, `~`, one
problem printed once, `validate --json`."""

from __future__ import annotations

import json

import pytest
from matrix_files import ROOT, SLIM_TAG, load_problems, shipped_with, validate_args

from builder import cli
from builder.commands import matrix as matrix_cmd
from builder.core.errors import BuilderError
from builder.model import matrix


@pytest.mark.parametrize(("tag", "why"), [
    (SLIM_TAG, "shape of a variant's floating tag"),
    ("latest-runtime-20260101", "shape of a dated tag"),
    ("latest-runtime-20260101.2", "shape of a dated tag"),
    ("build-0123456789abcdef0123", "which content tags use"),
    ("sha256-abc.sbom", "SBOM/smoke tags"),
    ("latest-slim", "alias `latest-slim` is already aliases[0]"),
])
def test_aliases_cannot_take_generated_or_repeated_names(tmp_path, tag, why):
    path = shipped_with(tmp_path, "  - {tag: latest-runtime,", f"  - {{tag: {tag}, torch: \"2.15.0\", "
                        "python: \"3.12\", flavor: slim}\n  - {tag: latest-runtime,")
    assert why in load_problems(path)


def test_a_repeated_select_key_means_any_of():
    m = matrix.load(ROOT / "matrix.yaml")
    chosen = m.select(["flavor=slim", "flavor=runtime", "python=3.11"])
    assert {v.flavor for v in chosen} == {"slim", "runtime"}
    assert all(v.python == "3.11" for v in chosen)
    assert len(chosen) == len(m.select(["flavor=slim", "python=3.11"])) + len(
        m.select(["flavor=runtime", "python=3.11"]))
    assert "any of" in cli.build_parser()._subparsers._group_actions[0].choices[  # type: ignore
        "plan"].format_help()


def test_validate_json_prints_json_for_an_invalid_matrix(tmp_path, capsys):
    path = shipped_with(tmp_path, "registry: 127.0.0.1:5000", "registry: 127.0.0.1:99999")
    assert matrix_cmd.cmd_validate(validate_args(path, json=True)) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is False
    assert any("registry" in p and "port 1-65535" in p for p in doc["problems"])


def test_tag_pattern_error_names_the_allowed_characters(tmp_path):
    path = shipped_with(tmp_path, "{tag: latest-runtime,", "{tag: \"a:b/c\",")
    text = load_problems(path)
    assert "letters, digits and _ . -" in text and ": /" not in text


def test_a_tilde_key_reads_as_null_not_a_number(tmp_path):
    path = shipped_with(tmp_path, '"3.11": {image: "mmdebstrap:bookworm"', '~: {image: "x"')
    text = load_problems(path)
    assert '`~` is read as null; write "~" (quoted)' in text and "None" not in text


def test_one_problem_is_printed_once(tmp_path):
    path = shipped_with(tmp_path, "include:\n", "include:\n  - {flavor: slim, cuda: \"12.6\"}\n")
    text = load_problems(path)
    assert text.count("an explicit `cuda` needs the `index_url`") == 1


def test_an_unknown_select_key_is_bad_usage_with_a_suggestion():
    m = matrix.load(ROOT / "matrix.yaml")
    with pytest.raises(BuilderError) as exc:
        m.select(["flavour=slim"])
    assert exc.value.exit_code == 2
    assert exc.value.hint == "did you mean `flavor`?"


def test_validate_names_each_default_variant_once_with_its_platforms():
    variants = list(matrix.load(ROOT / "matrix.yaml").variants)
    listed = matrix_cmd.default_list(variants)
    assert listed.count("2.15.0-py3.11-cuda-slim") == 1
    assert "2.15.0-py3.11-cuda-slim (linux/amd64, linux/arm64)" in listed
