"""Read matrix.yaml once into frozen variants; every problem names file:line: field.path.

Expansion follows GitHub Actions matrix rules: the product of `axes`, minus `exclude`, then each
`include` entry is merged into every combination whose original axis values it does not
overwrite, or becomes a new combination when it fits none.
"""

from __future__ import annotations

import difflib
import hashlib
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from builder.core import limits
from builder.core.errors import BuilderError, ConfigError, UsageError
from builder.model import tags
from builder.model.platforms import DEFAULT as DEFAULT_PLATFORM

SCHEMA_PATH = Path(__file__).resolve().parents[1] / "schema" / "matrix.schema.json"
AXES = ("torch", "python", "accelerator", "flavor")
SELECT_KEYS = (*AXES, "id", "default", "platform")
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


@dataclass(frozen=True)
class Base:
    image: str
    python_from: str = "apt"

    @property
    def bootstrap_suite(self) -> str | None:
        """`mmdebstrap:bookworm` → "bookworm": built locally rather than pulled."""
        return self.image.split(":", 1)[1] if self.image.startswith("mmdebstrap:") else None


@dataclass(frozen=True)
class Variant:
    torch: str
    python: str
    accelerator: str
    flavor: str
    base: Base
    packages: tuple[str, ...] = ()
    find_links: tuple[str, ...] = ()
    index_url: str | None = None
    cuda: str | None = None  # declared CUDA (with an index); otherwise what the wheel brings
    default: bool = False
    platform: str = DEFAULT_PLATFORM  # one variant per (id, platform); see builder.model.platforms

    @property
    def key(self) -> str:
        """Unique per (id, platform): the id itself on linux/amd64, `<id>.linux-arm64` else."""
        return self.id if self.platform == DEFAULT_PLATFORM else \
            f"{self.id}.{self.platform.replace('/', '-')}"

    @property
    def torch_public(self) -> str:
        """The torch version without its local part: 2.13.0+cpu → 2.13.0."""
        return self.torch.split("+", 1)[0]

    @property
    def id(self) -> str:
        accel = f"cuda{self.cuda}" if self.cuda else self.accelerator
        return f"{self.torch_public}-py{self.python}-{accel}-{self.flavor}"

    def value(self, key: str) -> str:
        if key == "id":
            return self.id
        if key == "default":
            return "true" if self.default else "false"
        return str(getattr(self, key))

    def matches(self, selector: Mapping[str, str]) -> bool:
        return all(self.value(k) == str(v) for k, v in selector.items())

    def matches_any(self, wanted: Mapping[str, Iterable[str]]) -> bool:
        """Every key matches one of its values (a repeated --select key means "any of")."""
        return all(self.value(k) in values for k, values in wanted.items())


@dataclass(frozen=True)
class Alias:
    tag: str
    selector: Mapping[str, str]


@dataclass(frozen=True)
class Matrix:
    path: Path
    registry: str
    repository: str
    bases: Mapping[str, Base]
    toolkits: Mapping[str, Mapping[str, Any]]
    variants: tuple[Variant, ...]
    aliases: tuple[Alias, ...] = ()
    lines: Mapping[Path_, int] = field(default_factory=dict, repr=False)
    staging: str = ""  # registry/repository; "" is <registry>/<repository>-staging
    trust_keys: tuple[Path, ...] = ()  # cosign.pub files staged evidence must be signed by
    insecure_registries: tuple[str, ...] = ()  # plain HTTP allowed, as Docker's daemon setting

    @property
    def image_name(self) -> str:
        return f"{self.registry}/{self.repository}"

    @property
    def staging_registry(self) -> str:
        return self.staging.partition("/")[0] if self.staging else self.registry

    @property
    def staging_repository(self) -> str:
        return self.staging.partition("/")[2] if self.staging else f"{self.repository}-staging"

    def select(self, selectors: Iterable[str] = ()) -> list[Variant]:
        """Variants matching every key of the KEY=VALUE selectors (any of a repeated key's)."""
        wanted = parse_selectors(selectors)
        for key, values in wanted.items():
            unknown_value(key, values, self)
        return [v for v in self.variants if v.matches_any(wanted)]

    def variant(self, variant_id: str) -> Variant:
        """The variant with this id on its first platform (or with this key)."""
        for v in self.variants:
            if variant_id in (v.id, v.key):
                return v
        raise ConfigError(f"no variant `{variant_id}` in {self.path}", hint=suggest(
            variant_id, [v.id for v in self.variants]))

    def toolkit_for(self, cuda: str) -> Mapping[str, Any] | None:
        """The toolkit source for CUDA major.minor: an exact key, else `major.*`."""
        return self.toolkits.get(cuda) or self.toolkits.get(cuda.split(".")[0] + ".*")


def parse_selectors(selectors: Iterable[str]) -> dict[str, frozenset[str]]:
    """KEY=VALUE items as KEY → the values it may take: keys AND, a repeated key ORs."""
    wanted: dict[str, set[str]] = {}
    for item in selectors:
        key, sep, value = item.partition("=")
        if not sep or key not in SELECT_KEYS:  # bad usage (exit 2), not a matrix finding
            close = suggest(key, SELECT_KEYS) if sep else None
            raise UsageError(
                f"--select {limits.shorten(item)!r}: expected KEY=VALUE with KEY one of "
                f"{', '.join(SELECT_KEYS)}", hint=close)
        wanted.setdefault(key, set()).add(value)
    return {key: frozenset(values) for key, values in wanted.items()}


def unknown_value(key: str, values: Iterable[str], m: Matrix, shown: int = 12) -> None:
    """A --select value no variant has is bad usage (exit 2): the error lists the values that
    key takes in this matrix and suggests the closest (`torch=2.13.0` → `2.13.0+cpu`)."""
    known = sorted({v.value(key) for v in m.variants})
    for value in sorted(values):
        if value in known:
            continue
        listed = ", ".join(known[:shown]) + (f" … ({len(known) - shown} more)"
                                             if len(known) > shown else "")
        prefixed = [k for k in known if k.split("+")[0] == value] or \
            [k for k in known if k.startswith(value)]
        close = f"did you mean `{prefixed[0]}`?" if prefixed else suggest(value, known)
        raise UsageError(f"--select `{key}={limits.shorten(value)}` matches no variant in "
                         f"{m.path}: `{key}` is one of {listed}",
                         hint=close or f"pick one of the values above for `{key}`")


def suggest(word: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f"did you mean `{close[0]}`?" if close else None


# ---------------------------------------------------------------- YAML with line numbers


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
MAX_COMBINATIONS = 10_000  # of the axes, before include and platforms
MAX_MERGES = 1_000_000  # include entries merged into combinations
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


# ---------------------------------------------------------------- schema checks


@cache
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def _line_of(lines: Mapping[Path_, int], path: Path_) -> int:
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
    line = _line_of(lines, path)
    if err.validator == "additionalProperties" and isinstance(err.instance, dict):
        allowed = list(err.schema.get("properties", {}))
        out = []
        for key in err.instance:
            if key not in allowed:
                hint = suggest(key, allowed)
                msg = f"unknown key `{limits.shorten(key)}`" + (f"; {hint}" if hint else
                                                f"; allowed: {', '.join(allowed)}")
                out.append(Problem(_line_of(lines, path + (key,)), path + (key,), msg))
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


# ---------------------------------------------------------------- expansion


def expand(axes: Mapping[str, Sequence[Any]], include: Sequence[Mapping[str, Any]],
           exclude: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[int]]:
    """GitHub Actions matrix semantics. Returns the combinations and, for each, the index of
    the include entry that created it (-1 for combinations from the axes).

    An include entry merges into every combination from the axes whose axis values it does not
    contradict. Those are found by lookup in an index per set of axis keys, not by comparing
    every entry with every combination, so a long include list costs linear time."""
    keys = list(axes)
    combos = [dict(zip(keys, values, strict=True)) for values in itertools.product(*axes.values())]
    excluded = _exclude_matcher(exclude)
    combos = [c for c in combos if not excluded(c)]
    matching = _axis_index(combos, keys)
    added: list[dict[str, Any]] = []
    origin = [-1] * len(combos)
    merges = 0
    for index, entry in enumerate(include):
        hits = matching(entry)
        merges += len(hits)
        if merges > MAX_MERGES:
            raise ExpansionTooLarge(Problem(0, ("include", index), (
                f"include merges into more than {MAX_MERGES} combinations in all (the limit): "
                "name axis values in each entry")))
        # Only combinations from the axes take merges; those added by include never do.
        for i in hits:
            combos[i].update(entry)
        if not hits:
            added.append(dict(entry))
            origin.append(index)
    return combos + added, origin


class ExpansionTooLarge(Exception):
    def __init__(self, problem: Problem) -> None:
        super().__init__(problem.message)
        self.problem = problem


def _axis_index(combos: Sequence[Mapping[str, Any]], keys: Sequence[str]
                ) -> Callable[[Mapping[str, Any]], list[int]]:
    """entry → the positions of the combinations whose original axis values equal the entry's
    (on the axis keys it names), from one dict per distinct set of named axis keys."""
    originals = [tuple(_hashable(c[k]) for k in keys) for c in combos]
    by_keys: dict[tuple[int, ...], dict[tuple[Any, ...], list[int]]] = {}

    def matching(entry: Mapping[str, Any]) -> list[int]:
        named = tuple(i for i, k in enumerate(keys) if k in entry)
        if named not in by_keys:
            table: dict[tuple[Any, ...], list[int]] = {}
            for pos, values in enumerate(originals):
                table.setdefault(tuple(values[i] for i in named), []).append(pos)
            by_keys[named] = table
        return by_keys[named].get(tuple(_hashable(entry[keys[i]]) for i in named), [])

    return matching


def _exclude_matcher(exclude: Sequence[Mapping[str, Any]]) -> Callable[[Mapping[str, Any]], bool]:
    """Whether any exclude entry is a subset of a combination, with one set lookup per distinct
    key set instead of comparing every combination with every entry."""
    index: dict[tuple[str, ...], set[tuple[Any, ...]]] = {}
    for entry in exclude:
        keys = tuple(sorted(entry))
        index.setdefault(keys, set()).add(tuple(_hashable(entry[k]) for k in keys))

    def excluded(combo: Mapping[str, Any]) -> bool:
        return any(tuple(_hashable(combo.get(k)) for k in keys) in values
                   for keys, values in index.items())

    return excluded


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return json.dumps(value, sort_keys=True, default=str)
    return value


# ---------------------------------------------------------------- semantic checks and build


def declared_insecure_registries(path: str | Path) -> tuple[str, ...]:
    """The matrix's `insecure_registries`, read before a command starts so that they are part
    of its settings (core/settings.py); a missing or broken matrix gives none here, and the
    command's own `load` reports it."""
    try:
        data, _ = load_yaml(Path(path))
    except (BuilderError, OSError, ValueError):
        return ()
    listed = data.get("insecure_registries") if isinstance(data, dict) else None
    if not isinstance(listed, list):
        return ()
    return tuple(s for s in listed if isinstance(s, str) and _REGISTRY_ENTRY.fullmatch(s))


_REGISTRY_ENTRY = re.compile(r"[a-z0-9.:/-]+")  # the schema's pattern of `insecure_registries`


def load(path: str | Path = "matrix.yaml") -> Matrix:
    """Parse, validate and expand a matrix file, or raise MatrixError listing every problem."""
    path = Path(path)
    file = str(path)
    data, seen = load_yaml(path)
    lines, problems = seen.lines, seen.problems
    if not isinstance(data, dict):
        raise MatrixError(file, [Problem(1, (), "the top level must be a mapping of keys")])
    marker = _schema_ok_marker(path)
    if not marker.exists():
        problems += schema_problems(data, lines, seen.raw)
    if problems:
        raise MatrixError(file, problems)
    matrix, problems = _build(path, data, lines)
    if problems:
        raise MatrixError(file, problems)
    _remember(marker)
    return matrix


def _schema_ok_marker(path: Path) -> Path:
    """A file named by the hash of (matrix text, schema text): present once that pair validated,
    so a no-op `plan` skips importing the schema validator."""
    from builder.core import state

    digest = hashlib.sha256(path.read_bytes() + SCHEMA_PATH.read_bytes()).hexdigest()[:32]
    return state.root() / "cache" / f"matrix-valid-{digest}"


def _remember(marker: Path) -> None:
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
    except OSError:
        pass  # a read-only state folder only costs the next run its speed


def _build(path: Path, data: dict[str, Any],
           lines: dict[Path_, int]) -> tuple[Matrix, list[Problem]]:
    problems: list[Problem] = []
    bases = {py: Base(**spec) for py, spec in data["bases"].items()}
    try:
        if too_large := _combinations_problem(data, lines):
            raise ExpansionTooLarge(too_large)
        combos, origin = expand(data["axes"], data.get("include", []), data.get("exclude", []))
    except ExpansionTooLarge as exc:  # a problem without a line yet: expand has no lines
        where = exc.problem.path
        return Matrix(path=path, registry=data["registry"], repository=data["repository"],
                      bases=bases, toolkits={}, variants=()), [
            Problem(_line_of(lines, where), where, exc.problem.message)]
    combos, origin = expand_platforms(combos, origin, data)
    defaults = data.get("default", [])
    variants: list[Variant] = []
    seen: dict[str, Path_] = {}
    for combo, index in zip(combos, origin, strict=True):
        where: Path_ = ("include", index) if index >= 0 else ("axes",)
        missing = [k for k in AXES if k not in combo]
        if missing:
            problems.append(Problem(_line_of(lines, where), where,
                                    f"a new variant needs {', '.join(AXES)}; missing: "
                                    + ", ".join(missing)))
            continue
        variant, variant_problems = _variant(combo, data, bases, defaults, where, lines)
        problems += variant_problems
        if variant is None:
            continue
        if variant.key in seen:
            problems.append(Problem(_line_of(lines, where), where,
                                    f"duplicate variant `{variant.key}` (also from "
                                    f"{format_path(seen[variant.key])})"))
            continue
        seen[variant.key] = where
        variants.append(variant)
    variants = whole_defaults(variants)
    problems += _selector_problems(data, lines, variants)
    problems += _alias_problems(data.get("aliases", []), lines)
    aliases = tuple(
        Alias(a["tag"], {k: v for k, v in a.items() if k != "tag"}) for a in data.get("aliases", [])
    )
    matrix = Matrix(
        path=path, registry=data["registry"], repository=data["repository"], bases=bases,
        toolkits=data.get("toolkits", {}), variants=tuple(variants), aliases=aliases, lines=lines,
        staging=data.get("staging", ""),
        trust_keys=tuple(path.parent / key for key in data.get("trust_keys", [])),
        insecure_registries=tuple(data.get("insecure_registries", [])),
    )
    return matrix, problems


def _combinations_problem(data: Mapping[str, Any], lines: Mapping[Path_, int]) -> Problem | None:
    """The axes' product past its cap, counted before anything is expanded."""
    count = math.prod(len(values) for values in data["axes"].values())
    if count <= MAX_COMBINATIONS:
        return None
    return Problem(_line_of(lines, ("axes",)), ("axes",), f"the axes make {count} combinations; "
                   f"the limit is {MAX_COMBINATIONS}: use include for the rare ones")


def _variant(combo: dict[str, Any], data: dict[str, Any], bases: Mapping[str, Base],
             defaults: Sequence[Mapping[str, Any]], where: Path_, lines: Mapping[Path_, int]
             ) -> tuple[Variant | None, list[Problem]]:
    line = _line_of(lines, where)
    problems = []
    base = bases.get(combo["python"])
    if base is None:
        problems.append(Problem(line, where, f"python {combo['python']} has no entry in `bases` "
                                f"(known: {', '.join(bases)})"))
    cpu_build = "+cpu" in combo["torch"] or bool(combo.get("index_url", "").endswith("/cpu"))
    if combo["accelerator"] == "cuda" and cpu_build:
        problems.append(Problem(line, where, f"accelerator cuda cannot use the CPU build "
                                f"torch {combo['torch']}"))
    if combo["accelerator"] == "cpu" and not cpu_build:
        problems.append(Problem(line, where, f"accelerator cpu needs a CPU build of torch: a "
                                f"`+cpu` version or a CPU `index_url`, not torch {combo['torch']} "
                                "(PyPI's default wheels are CUDA builds)"))
    if combo["accelerator"] == "cpu" and combo.get("cuda"):
        problems.append(Problem(line, where, "`cuda` makes no sense with accelerator cpu"))
    if combo.get("cuda") and not combo.get("index_url"):
        problems.append(Problem(line, where, "an explicit `cuda` needs the `index_url` that "
                                "serves that CUDA build (e.g. https://download.pytorch.org/whl/cu126)"))
    if problems or base is None:
        return None, problems
    packages = tuple(dict.fromkeys([*data.get("packages", []), *combo.get("packages", [])]))
    variant = Variant(
        torch=combo["torch"], python=combo["python"], accelerator=combo["accelerator"],
        flavor=combo["flavor"], base=base, packages=packages,
        find_links=tuple(combo.get("find_links", [])), index_url=combo.get("index_url"),
        cuda=combo.get("cuda"), platform=combo["platform"],
    )
    # Marked per platform here; whole_defaults then extends it to every platform of the id.
    is_default = any(variant.matches(s) for s in defaults)
    return Variant(**{**variant.__dict__, "default": is_default}), []


def whole_defaults(variants: list[Variant]) -> list[Variant]:
    """`default` selects whole variants: every declared platform of a variant an entry names
    (one index holds them all, so half a variant could never be published)."""
    ids = {v.id for v in variants if v.default}
    return [v if v.default == (v.id in ids) else replace(v, default=v.id in ids)
            for v in variants]


def _alias_problems(aliases: Sequence[Mapping[str, Any]],
                    lines: Mapping[Path_, int]) -> list[Problem]:
    """Alias names that repeat or take a generated tag's shape (see builder.model.tags). Whether one
    equals a variant's floating tag needs the locks: plan.tag_problems checks that."""
    problems = []
    first: dict[str, int] = {}
    for i, alias in enumerate(aliases):
        path: Path_ = ("aliases", i, "tag")
        tag = str(alias.get("tag", ""))
        why = tags.alias_shape_problem(tag)
        if tag in first:
            why = f"alias `{tag}` is already aliases[{first[tag]}]"
        first.setdefault(tag, i)
        if why:
            problems.append(Problem(_line_of(lines, path), path, why))
    return problems


def _selector_problems(data: dict[str, Any], lines: Mapping[Path_, int],
                       variants: Sequence[Variant]) -> list[Problem]:
    problems = []
    for key in ("default", "exclude", "aliases"):
        for i, selector in enumerate(data.get(key, [])):
            criteria = {k: v for k, v in selector.items() if k != "tag"}
            hits = list({v.id: v for v in variants if v.matches(criteria)}.values())
            path: Path_ = (key, i)
            if key == "exclude":
                continue  # excluding what the axes never made is harmless
            if not hits:
                problems.append(Problem(_line_of(lines, path), path, "selects no variant"))
            elif key == "aliases" and len(hits) > 1:
                problems.append(Problem(_line_of(lines, path), path,
                                        f"alias `{selector['tag']}` selects {len(hits)} variants "
                                        f"({', '.join(v.id for v in hits[:4])}…); add keys until "
                                        "it selects one"))
    return problems


def expand_platforms(combos: Sequence[dict[str, Any]], origin: Sequence[int],
                     data: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[int]]:
    """One combination per target platform. A combination's platforms come from a `platform`
    axis, else its own `platforms` (an include entry), else the top-level `platforms`, else
    linux/amd64. `exclude` entries naming a platform then remove single platforms."""
    default = data.get("platforms") or [DEFAULT_PLATFORM]
    dropped = _exclude_matcher([e for e in data.get("exclude", []) if "platform" in e])
    out: list[dict[str, Any]] = []
    out_origin: list[int] = []
    for combo, index in zip(combos, origin, strict=True):
        names = [combo["platform"]] if "platform" in combo else combo.get("platforms", default)
        for name in names:
            single = {k: v for k, v in combo.items() if k != "platforms"} | {"platform": name}
            if not dropped(single):
                out.append(single)
                out_origin.append(index)
    return out, out_origin
