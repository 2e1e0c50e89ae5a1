"""matrix.yaml costs a message, never memory, minutes or a traceback: YAML bombs and hostile
YAML, size / value / axis / merge caps, include and exclude matching that does not grow with
combinations times entries, long values and many problems shortened."""

from __future__ import annotations

import time

import pytest
from matrix_files import ROOT, SHIPPED, load_error, load_problems

from builder.model import matrix_expand

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}]\n" for i in range(8))


def test_an_alias_bomb_is_refused_quickly_with_its_line(tmp_path):
    path = tmp_path / "matrix.yaml"
    path.write_text(BOMB)
    start = time.monotonic()
    text = load_problems(path)
    assert time.monotonic() - start < 2
    assert "expands the document past" in text and "(anchor at line" in text
    assert f"{path}:" in text


@pytest.mark.parametrize(("text", "expected"), [
    ("a: " + "[" * 20000 + "]" * 20000 + "\n", "nest"),  # libyaml's own limit, or ours
    ("".join(" " * i + f"k{i}:\n" for i in range(100)) + " " * 100 + "v\n",
     "nested deeper than 32 levels"),
    ("registry: caf\xe9\n".encode("latin-1"), "not UTF-8 text (byte 0xe9"),
    ("registry: !!python/name:os.system x\n", "the tag `tag:yaml.org,2002:python/name:os.system`"),
    ("? !!python/name:os.system x\n: 1\n", "is not allowed (plain YAML values only)"),
    ("a: &r [*r]\n", "alias *r refers to its own anchor"),
    ("{[a]: 1}\n", "a key must be plain text"),
    ("registry: !!int abc\n", "`abc` is not a valid int"),
])
def test_hostile_yaml_is_a_problem_not_a_traceback(tmp_path, text, expected):
    path = tmp_path / "matrix.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    assert expected in load_problems(path)


def test_exclude_matching_does_not_scale_with_combinations_times_excludes():
    axes = {"a": [str(i) for i in range(100)], "b": [str(i) for i in range(100)]}
    exclude = [{"a": str(i % 100), "b": f"x{i}"} for i in range(300_000)] + [{"a": "7"}]
    start = time.monotonic()
    combos, _ = matrix_expand.expand(axes, [], exclude)
    assert time.monotonic() - start < 5
    assert len(combos) == 9900


def test_a_matrix_larger_than_the_cap_is_refused_without_reading_it_all(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text(SHIPPED + "#" * (2 * 1024 ** 2))
    assert load_error(big) == f"{big} is larger than the 1 MiB limit for a matrix"


def test_a_matrix_with_too_many_values_is_refused(tmp_path):
    many = tmp_path / "many.yaml"
    many.write_text(SHIPPED.replace("packages: [numpy]", "packages: [" + "a, " * 110_000 + "a]"))
    assert "more than 100000 values (the limit for a matrix)" in load_error(many)


class Counted(str):
    """An axis value that counts how often it is compared."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        Counted.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_include_merges_by_lookup_not_by_comparing_every_entry_with_every_combination():
    axes = {"torch": [Counted(f"2.{i}") for i in range(40)],
            "python": [Counted(f"3.{i}") for i in range(50)]}
    include = [{"torch": f"2.{i % 40}", "python": f"3.{i % 50}", "packages": [f"p{i}"]}
               for i in range(2000)]
    Counted.compared = 0
    combos, _ = matrix_expand.expand(axes, include, [])
    assert len(combos) == 2000 and combos[0]["packages"] == ["p1800"]
    assert Counted.compared < 10 * (len(combos) + len(include))  # was about 2000 * 2000


def test_axes_and_include_past_their_caps_are_one_problem_each(tmp_path, monkeypatch):
    wide = tmp_path / "wide.yaml"
    wide.write_text(SHIPPED.replace('torch: ["2.5.1", "2.7.1", "2.9.1", "2.15.0"]', "torch: ["
                                    + ", ".join(f'"2.{i}.0"' for i in range(2000)) + "]"))
    assert "axes: the axes make 12000 combinations; the limit is 10000" in load_error(wide)
    monkeypatch.setattr(matrix_expand, "MAX_MERGES", 5)  # include[0] and [1] merge 3 each
    message = load_error(ROOT / "matrix.yaml")
    assert "include[1]: include merges into more than 5 combinations in all" in message


def test_long_values_and_many_problems_are_shortened(tmp_path):
    long = tmp_path / "long.yaml"
    long.write_text(SHIPPED.replace('python: ["3.11", "3.12"]',
                                    'python: ["3.11", "' + "x" * 100_000 + '"]'))
    message = load_error(long)
    assert "(100002 characters) is not allowed here" in message and len(message) < 400
    keys = tmp_path / "keys.yaml"
    # 3,000 problems (each unknown key is matched against the allowed ones: 0.2 ms apiece)
    # show the bound as well as 30,000 did: the message holds the first 50, whatever the count.
    keys.write_text(SHIPPED + "".join(f"k{i}: 1\n" for i in range(3_000)))
    message = load_error(keys)
    assert "(3000 problems)" in message and "… and 2950 more problems" in message
    assert len(message) < 20_000  # was 5 MB with 30,000
