"""Expansion (GitHub Actions include/exclude semantics) and every validation error class."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from builder.commands import options
from builder.core import registry_http, settings
from builder.model import matrix
from builder.model.matrix_expand import expand
from builder.model.matrix_yaml import MatrixError

HEAD = """\
registry: 127.0.0.1:5000
repository: torch
bases:
  "3.11": {image: "mmdebstrap:bookworm"}
  "3.12": {image: "python:3.12-slim-bookworm", python_from: image}
"""

# One CUDA runtime variant; tests add `include:` entries or other keys after it.
ONE_CUDA = HEAD + """\
axes:
  torch: ["2.9.1"]
  python: ["3.11"]
  accelerator: [cuda]
  flavor: [runtime]
"""


def problems(path) -> str:
    with pytest.raises(MatrixError) as exc:
        matrix.load(path)
    return str(exc.value)


def test_include_merges_into_matching_combinations_and_adds_new_ones():
    axes = {"fruit": ["apple", "pear"], "animal": ["cat", "dog"]}
    include = [{"color": "green"}, {"color": "pink", "animal": "cat"},
               {"fruit": "apple", "shape": "circle"}, {"fruit": "banana"},
               {"fruit": "banana", "animal": "cat"}]
    combos, origin = expand(axes, include, [])
    assert {"fruit": "apple", "animal": "cat", "color": "pink", "shape": "circle"} in combos
    assert {"fruit": "apple", "animal": "dog", "color": "green", "shape": "circle"} in combos
    assert {"fruit": "pear", "animal": "cat", "color": "pink"} in combos
    assert {"fruit": "pear", "animal": "dog", "color": "green"} in combos
    # Entries that fit no original combination become new ones, never merging into each other.
    assert combos[-2:] == [{"fruit": "banana"}, {"fruit": "banana", "animal": "cat"}]
    assert origin[-2:] == [3, 4]


def test_exclude_removes_before_include():
    combos, _ = expand({"a": [1, 2], "b": [1, 2]}, [{"a": 2, "b": 2, "x": 1}], [{"a": 2}])
    assert combos == [{"a": 1, "b": 1}, {"a": 1, "b": 2}, {"a": 2, "b": 2, "x": 1}]


def test_shipped_matrix_is_valid_and_has_the_promised_variants():
    m = matrix.load("matrix.yaml")
    ids = {v.id for v in m.variants}
    for torch in ("2.5.1", "2.7.1", "2.9.1", "2.15.0"):
        for py in ("3.11", "3.12"):
            for flavor in ("devel", "runtime", "slim"):
                assert f"{torch}-py{py}-cuda-{flavor}" in ids
    assert "2.13.0-py3.11-cpu-runtime" in ids
    defaults = [v.id for v in m.variants if v.default]
    assert "2.13.0-py3.11-cpu-runtime" in defaults and len(defaults) >= 2


def test_select_is_an_and_of_keys():
    m = matrix.load("matrix.yaml")
    chosen = m.select(["flavor=slim", "python=3.12"])
    assert chosen and all(v.flavor == "slim" and v.python == "3.12" for v in chosen)
    with pytest.raises(matrix.UsageError, match="KEY=VALUE"):  # bad usage: exit 2
        m.select(["flavour=slim"])


@pytest.mark.parametrize(("item", "listed", "hint"), [
    ("flavor=runtim", "`flavor` is one of devel, runtime, slim", "did you mean `runtime`?"),
    ("torch=2.13.0", "2.13.0+cpu, 2.15.0", "did you mean `2.13.0+cpu`?"),  # the local part
    ("python=3.99", "`python` is one of 3.11, 3.12, 3.13", "pick one of the values above"),
])
def test_a_select_value_that_matches_nothing_is_bad_usage_listing_the_values(item, listed, hint):
    m = matrix.load("matrix.yaml")
    with pytest.raises(matrix.UsageError) as caught:
        m.select(["default=true", item])
    assert caught.value.exit_code == 2
    assert str(caught.value).startswith(f"--select `{item}` matches no variant in matrix.yaml: ")
    assert listed in str(caught.value) and caught.value.hint.startswith(hint)
    with pytest.raises(matrix.UsageError, match="flavor=runtim"):  # one of a repeated key too
        m.select(["flavor=runtime", "flavor=runtim"])


def test_yaml_float_trap_names_line_and_tells_to_quote(write_matrix):
    path = write_matrix(HEAD + """\
axes:
  torch: ["2.9.1"]
  python: ["3.11", "3.12", 3.10]
  accelerator: [cuda]
  flavor: [runtime]
""")
    text = problems(path)
    assert f'{path}:8: axes.python[2]: 3.1 is a number; write "3.10"' in text


def test_unknown_key_suggests_the_close_one(write_matrix):
    path = write_matrix(HEAD + """\
axes:
  torch: ["2.9.1"]
  python: ["3.11"]
  accelerator: [cuda]
  flavour: [runtime]
""")
    text = problems(path)
    assert "axes.flavour: unknown key `flavour`; did you mean `flavor`?" in text
    assert ":10:" in text


def test_all_errors_are_listed_not_just_the_first(write_matrix):
    path = write_matrix(HEAD + """\
axes:
  torch: ["2.9.1"]
  python: [3.11]
  accelerator: [gpu]
  flavor: [runtime]
colour: red
""")
    text = problems(path)
    assert "3 problems" in text
    assert "axes.python[0]" in text and "axes.accelerator[0]" in text and "`colour`" in text


def test_duplicate_variants_are_refused(write_matrix):
    path = write_matrix(ONE_CUDA + """\
include:
  - {torch: "2.9.1", python: "3.11", accelerator: cuda, flavor: runtime, packages: [scipy]}
  - {torch: "2.8.0", python: "3.11", accelerator: cuda, flavor: slim}
  - {torch: "2.8.0", python: "3.11", accelerator: cuda, flavor: slim}
""")
    text = problems(path)
    assert "include[2]: duplicate variant `2.8.0-py3.11-cuda-slim`" in text


def test_impossible_accelerator_combinations(write_matrix):
    path = write_matrix(HEAD + """\
axes:
  torch: ["2.9.1"]
  python: ["3.11"]
  accelerator: [cpu]
  flavor: [runtime]
include:
  - {torch: "2.13.0+cpu", python: "3.11", accelerator: cuda, flavor: slim}
  - {torch: "2.13.0", python: "3.13", accelerator: cuda, flavor: slim}
""")
    text = problems(path)
    assert "accelerator cpu needs a CPU build of torch" in text
    assert "accelerator cuda cannot use the CPU build" in text
    assert "python 3.13 has no entry in `bases`" in text


def test_new_include_needs_all_axes(write_matrix):
    path = write_matrix(ONE_CUDA + """\
include:
  - {torch: "2.8.0", flavor: slim}
""")
    assert "include[0]: a new variant needs torch, python, accelerator, flavor; missing: " \
           "python, accelerator" in problems(path)


@pytest.mark.parametrize("evil", [
    '"2.9.1\\nRUN curl evil | sh"', '"2.9.1; rm -rf /"', "\"2.9.1'\"", '"$(id)"', '"2.9.1`id`"'])
def test_injection_attempts_never_pass_validation(write_matrix, evil):
    path = write_matrix(HEAD + f"""\
axes:
  torch: [{evil}]
  python: ["3.11"]
  accelerator: [cuda]
  flavor: [runtime]
""")
    assert "axes.torch[0]" in problems(path)


@pytest.mark.parametrize("field,value", [
    ("packages", '["numpy; curl x"]'), ("packages", '["numpy\\"x"]'),
])
def test_injection_in_packages_and_aliases(write_matrix, field, value):
    path = write_matrix(HEAD + f"""\
axes:
  torch: ["2.9.1"]
  python: ["3.11"]
  accelerator: [cuda]
  flavor: [runtime]
{field}: {value}
""")
    assert f"{field}[0]" in problems(path)


def test_duplicate_yaml_key_and_bad_yaml(write_matrix):
    path = write_matrix(HEAD + "registry: other\n")
    assert "duplicate key" in problems(path)
    bad = write_matrix("registry: [unclosed\n", name="bad.yaml")
    assert "not valid YAML" in problems(bad)


def test_alias_must_select_exactly_one(write_matrix):
    path = write_matrix(HEAD + """\
axes:
  torch: ["2.9.1"]
  python: ["3.11", "3.12"]
  accelerator: [cuda]
  flavor: [runtime]
aliases:
  - {tag: latest, flavor: runtime}
default:
  - {torch: "9.9.9"}
""")
    text = problems(path)
    assert "alias `latest` selects 2 variants" in text
    assert "default[0]: selects no variant" in text


def test_python_without_a_torch_wheel_is_refused(monkeypatch):
    from builder.stages import wheels

    base = matrix.Base("mmdebstrap:bookworm")
    names = ["torch-2.5.1-cp311-cp311-manylinux1_x86_64.whl",
             "torch-2.13.0%2Bcpu-cp311-cp311-manylinux_2_28_x86_64.whl"]
    ok = matrix.Variant(torch="2.5.1", python="3.11", accelerator="cuda", flavor="runtime", base=base)
    missing = matrix.Variant(torch="2.5.1", python="3.14", accelerator="cuda", flavor="runtime", base=base)
    cpu = matrix.Variant(torch="2.13.0+cpu", python="3.11", accelerator="cpu", flavor="runtime", base=base)
    monkeypatch.setattr(wheels, "filenames", lambda variant: names)
    monkeypatch.setattr(wheels, "is_cuda_build", lambda variant, name, resolve_cuda: None)
    problems, notes = wheels.missing_wheel_problems([ok, missing, cpu], lambda v: None)
    assert notes == [] and len(problems) == 1
    assert problems[0].startswith(f"{missing.key}: torch 2.5.1 has no wheel for python 3.14")


def test_staging_is_a_full_reference_on_any_registry(write_matrix):
    shipped = (Path(__file__).resolve().parents[3] / "matrix.yaml").read_text()
    m = matrix.load(write_matrix(shipped))
    assert (m.staging_registry, m.staging_repository) == ("127.0.0.1:5000", "torch-staging")
    other = shipped.replace("repository: torch\n", "repository: torch\n"
                            "staging: ci.example:5000/team/torch-staging\n", 1)
    m = matrix.load(write_matrix(other))
    assert (m.staging_registry, m.staging_repository) == ("ci.example:5000", "team/torch-staging")
    bad = shipped.replace("repository: torch\n", "repository: torch\nstaging: no-repository\n", 1)
    assert "staging" in problems(write_matrix(bad))


def test_insecure_registries_of_the_matrix_are_dockers_setting(write_matrix):
    """Read into the run's settings before the command starts; loading changes nothing."""
    shipped = (Path(__file__).resolve().parents[3] / "matrix.yaml").read_text()
    path = write_matrix(shipped.replace(
        "repository: torch\n", "repository: torch\ninsecure_registries: [lab.example:5000]\n", 1))
    assert matrix.load(path).insecure_registries == ("lab.example:5000",)
    assert not registry_http.is_insecure("lab.example:5000")  # no hidden side effect
    args = argparse.Namespace(matrix=str(path))
    with settings.applied(options.resolve(args)):
        assert registry_http.is_insecure("lab.example:5000")
    assert matrix.declared_insecure_registries(path.parent / "missing.yaml") == ()
