"""matrix.yaml read with a line number for every value: bounded (size, nodes, depth, aliases),
only plain YAML tags, then checked against the JSON Schema. Every problem is a Problem naming
`file:line: key.path`; builder.model.matrix turns what passes into variants.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from builder.core import limits
from builder.core.errors import ConfigError

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schema" / "matrix.schema.json"
Path_ = tuple[str | int, ...]


@dataclass(frozen=True)
class Problem:
    line: int
    path: Path_
    message: str

    def format(self, file: str) -> str:
        where = format_path(self.path)
        message = limits.shorten(self.message, MAX_MESSAGE)  # the last guard: values are shortened
        return f"{file}:{self.line}: {where + ': ' if where else ''}{message}"


def format_path(path: Path_) -> str:
    out = ""
    for part in path:
        name = limits.shorten(str(part))
        out += f"[{part}]" if isinstance(part, int) else (f".{name}" if out else name)
    return out


class MatrixError(ConfigError):
    def __init__(self, file: str, problems: Sequence[Problem]) -> None:
        # An include entry merged into many combinations reports its problem once, not per merge.
        unique = dict.fromkeys(problems)
        self.problems = sorted(unique, key=lambda p: (p.line, format_path(p.path)))
        lines = [p.format(file) for p in self.problems[:limits.SHOWN_PROBLEMS]]
        more = len(self.problems) - len(lines)
        if more:
            lines.append(f"… and {more} more problems (the first {len(lines)} are shown)")
        count = len(self.problems)
        super().__init__(
            f"{file} is invalid ({count} problem{'s' * (count != 1)}):\n  " + "\n  ".join(lines)
        )


# ---- YAML with line numbers -------------------------------------------------------------------


# libyaml's parser when PyYAML has it (about 10x faster on a large matrix), else the Python one.
class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    pass


# These bounds stop alias bombs ("billion laughs") and deep nesting long before they cost time or
# memory (or a RecursionError in the composer). Only what aliases add counts against the node
# budget: the written-out document is already bounded by its size.
MAX_DEPTH = 32
MAX_ALIAS_NODES = 10_000
# Size and time caps on the rest (#25): a matrix is a few KB and a few hundred nodes; these are
# far above any real one and far below what costs a user minutes or gigabytes.
MAX_MATRIX_BYTES = 1024 ** 2
MAX_NODES = 100_000
MAX_MESSAGE = 400  # characters of one problem
# Only tags the safe loader constructs; `!!python/...` and unknown tags are problems.
_PLAIN_TAGS = frozenset(tag for tag in _Loader.yaml_constructors if tag is not None)


def _read_text(path: Path) -> str:
    file = str(path)
    data = limits.read_bounded(path, MAX_MATRIX_BYTES, "a matrix")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise MatrixError(file, [Problem(line, (), f"not UTF-8 text (byte 0x{data[exc.start]:02x} "
                                         f"at offset {exc.start})")]) from None


def _yaml_problem(exc: yaml.YAMLError, file: str) -> MatrixError:
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark else 1
    return MatrixError(file, [Problem(line, (), f"not valid YAML: {exc}")])


def _check_bounds(text: str, file: str) -> None:
    """One streaming pass over the parser's events (no tree, no recursion): refuse nesting
    deeper than MAX_DEPTH, more than MAX_NODES nodes, and aliases that add more than
    MAX_ALIAS_NODES nodes in all."""
    sizes: dict[str, int] = {}  # anchor → how many nodes one use of it expands to
    anchor_lines: dict[str, int] = {}
    open_frames: list[list[Any]] = []  # [anchor, nodes so far] per open collection
    added = 0  # nodes that aliases add to the document
    written = 0  # nodes written out
    for event in yaml.parse(text, Loader=_Loader):
        line = event.start_mark.line + 1
        written += isinstance(event, yaml.NodeEvent) and not isinstance(event, yaml.AliasEvent)
        if written > MAX_NODES:
            raise MatrixError(file, [Problem(line, (), f"more than {MAX_NODES} values (the limit "
                                             "for a matrix): is this the right file?")])
        if isinstance(event, yaml.CollectionEndEvent):
            anchor, count = open_frames.pop()
            if anchor:
                sizes[anchor] = count
            if open_frames:
                open_frames[-1][1] += count
            continue
        if not isinstance(event, yaml.NodeEvent):
            continue
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in anchor_lines and event.anchor not in sizes:
                raise MatrixError(file, [Problem(line, (), f"alias *{event.anchor} refers to its "
                                                 "own anchor (a recursive structure)")])
            count = sizes.get(event.anchor, 1)
            added += count
            if added > MAX_ALIAS_NODES:
                raise MatrixError(file, [Problem(line, (), (
                    f"alias *{event.anchor} (anchor at line {anchor_lines.get(event.anchor, '?')}"
                    f") expands the document past {MAX_ALIAS_NODES} more nodes; write the values "
                    "out instead"))])
        else:
            count = 1
            if event.anchor:
                anchor_lines[event.anchor] = line
        if isinstance(event, yaml.CollectionStartEvent):
            if len(open_frames) >= MAX_DEPTH:
                raise MatrixError(file, [Problem(line, (), f"nested deeper than {MAX_DEPTH} "
                                                 "levels")])
            open_frames.append([event.anchor, 1])
        elif open_frames:
            open_frames[-1][1] += count
        elif event.anchor:
            sizes[event.anchor] = 1


def _compose(text: str, file: str) -> yaml.Node | None:
    try:
        _check_bounds(text, file)
        return yaml.compose(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise _yaml_problem(exc, file) from None


@dataclass(frozen=True)
class _Walk:
    """What walking the composed tree records besides the data."""

    lines: dict[Path_, int] = field(default_factory=dict)
    raw: dict[Path_, str] = field(default_factory=dict)  # source text of scalars: `3.10`
    problems: list[Problem] = field(default_factory=list)


def _walk(node: yaml.Node, path: Path_, seen: _Walk) -> Any:
    """Turn a composed node into plain data, recording each path's line and YAML traps."""
    problems = seen.problems
    seen.lines[path] = node.start_mark.line + 1
    if node.tag not in _PLAIN_TAGS:
        problems.append(_tag_problem(node, path))
        return None
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                problems.append(Problem(key_node.start_mark.line + 1, path,
                                        "a key must be plain text"))
                continue
            if key_node.tag not in _PLAIN_TAGS:
                problems.append(_tag_problem(key_node, path))
                continue
            key = key_node.value
            if key_node.tag != "tag:yaml.org,2002:str":
                problems.append(_key_trap(key_node, path + (key,)))
            if key in out:
                problems.append(Problem(key_node.start_mark.line + 1, path + (key,),
                                        "duplicate key (YAML keeps only the last one)"))
            out[key] = _walk(value_node, path + (key,), seen)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_walk(item, path + (i,), seen) for i, item in enumerate(node.value)]
    seen.raw[path] = node.value
    try:
        return _scalar(node)
    except (yaml.YAMLError, ValueError, TypeError):
        problems.append(Problem(node.start_mark.line + 1, path,
                                f"`{limits.shorten(node.value)}` is not a valid "
                                f"{node.tag.rsplit(':', 1)[-1]}"))
        return None


def _tag_problem(node: yaml.Node, path: Path_) -> Problem:
    return Problem(node.start_mark.line + 1, path,
                   f"the tag `{node.tag}` is not allowed (plain YAML values only)")


def _scalar(node: yaml.ScalarNode) -> Any:
    loader = _Loader("")
    return loader.construct_object(node, deep=True)


def _key_trap(node: yaml.ScalarNode, path: Path_) -> Problem:
    """A key YAML reads as something other than text: `3.10`, `~`, `yes`."""
    try:
        shown = _scalar(node)
    except (yaml.YAMLError, ValueError, TypeError):
        shown = node.value
    written = limits.shorten(node.value)
    if shown is None:
        what = f"`{written}` is read as null"
    elif isinstance(shown, bool):
        what = f"`{written}` is read as the boolean {str(shown).lower()}"
    elif isinstance(shown, int | float):
        what = f"{_number_text(shown)} is a number"
    else:
        what = f"`{written}` is read as a {type(shown).__name__}"
    return Problem(node.start_mark.line + 1, path,
                   f'{what}; write "{written}" (quoted) so YAML keeps it a string')


def _number_text(value: float) -> str:
    """A number as Python reads it, shortened (a huge int has no str() at all past 4300
    digits)."""
    try:
        return limits.shorten(str(value))
    except ValueError:
        return "a number of more than 4300 digits"


def load_yaml(path: Path) -> tuple[Any, _Walk]:
    file = str(path)
    text = _read_text(path)
    node = _compose(text, file)
    if node is None:
        raise MatrixError(file, [Problem(1, (), "the file is empty")])
    seen = _Walk()
    data = _walk(node, (), seen)
    return data, seen


# ---- schema checks ----------------------------------------------------------------------------


@cache
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def line_of(lines: Mapping[Path_, int], path: Path_) -> int:
    while path not in lines and path:
        path = path[:-1]
    return lines.get(path, 1)


def schema_problems(data: Any, lines: Mapping[Path_, int],
                    raw: Mapping[Path_, str]) -> list[Problem]:
    import jsonschema  # slow to import (~1.5 s with format checkers): only when needed

    validator = jsonschema.Draft202012Validator(schema())
    problems = []
    for err in validator.iter_errors(data):
        path: Path_ = tuple(err.absolute_path)
        problems.extend(_explain(err, path, lines, raw))
    return problems


def _explain(err: Any, path: Path_, lines: Mapping[Path_, int],
             raw: Mapping[Path_, str]) -> list[Problem]:
    line = line_of(lines, path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = list(err.schema.get("properties", {}))
        out = []
        for key in err.instance:
            if key not in allowed:
                hint = suggest(key, allowed)
                msg = f"unknown key `{limits.shorten(key)}`" + (f"; {hint}" if hint else
                                                f"; allowed: {', '.join(allowed)}")
                out.append(Problem(line_of(lines, path + (key,)), path + (key,), msg))
        return out
    if err.validator == "type" and isinstance(err.instance, int | float) and "string" in str(
            err.validator_value):
        text = limits.shorten(raw.get(path) or _number_text(err.instance))
        return [Problem(line, path, f'{_number_text(err.instance)} is a number; write "{text}" '
                        "(quoted)")]
    if err.validator == "pattern":
        shape = err.schema.get("description") or f"the pattern {err.validator_value}"
        return [Problem(line, path, f"{_shown(err.instance)} is not allowed here; expected "
                        f"{shape}")]
    if err.validator == "enum":
        choices = ", ".join(map(str, err.validator_value))
        return [Problem(line, path, f"{_shown(err.instance)} is not one of: {choices}")]
    return [Problem(line, path, err.message)]


def _shown(value: Any) -> str:
    """A value as it appears in a message: JSON, shortened."""
    return limits.shorten(json.dumps(value, default=str))


def suggest(word: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean `{close[0]}`?" if close else None
