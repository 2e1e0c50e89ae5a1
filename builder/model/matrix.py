"""Read matrix.yaml once into frozen variants; every problem names file:line: field.path.

The model (Base, Variant, Alias, Matrix), the selection (`--select`) and `load`, which reads the
file (builder.model.matrix_yaml), expands it (builder.model.matrix_expand) and checks what only
the expanded variants show.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from builder.core import limits
from builder.core.errors import BuilderError, ConfigError, UsageError
from builder.model import tags
from builder.model.matrix_expand import (
    ExpansionTooLarge,
    combinations_problem,
    expand,
    expand_platforms,
)
from builder.model.matrix_yaml import (
    SCHEMA_PATH,
    MatrixError,
    Path_,
    Problem,
    format_path,
    line_of,
    load_yaml,
    schema_problems,
    suggest,
)
from builder.model.platforms import DEFAULT as DEFAULT_PLATFORM

AXES = ("torch", "python", "accelerator", "flavor")
SELECT_KEYS = (*AXES, "id", "default", "platform")


@dataclass(frozen=True)
class Base:
    image: str
    python_from: str = "apt"

    @property
    def bootstrap_suite(self) -> str | None:
        """`mmdebstrap:bookworm` → "bookworm": built locally rather than pulled."""
        return self.image.split(":", 1)[1] if self.image.startswith("mmdebstrap:") else None


@dataclass(frozen=True, kw_only=True)
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


@dataclass(frozen=True, kw_only=True)
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
    # `trust:` (or the deprecated `trust_keys:`): cosign.pub files and keyless identities
    # ({issuer, identity | identity_regexp}) that signatures read back must be made by
    trust_keys: tuple[Path, ...] = ()
    trust_identities: tuple[Mapping[str, str], ...] = ()
    trusted_root: Path | None = None  # None: sigstore's public good
    insecure_registries: tuple[str, ...] = ()  # plain HTTP allowed, as Docker's daemon setting
    compression: tuple[str, ...] = ("gzip", "zstd")  # zstd: a `<tag>-zstd` twin of each tag

    @property
    def image_name(self) -> str:
        return f"{self.registry}/{self.repository}"

    @property
    def staging_registry(self) -> str:
        return self.staging.partition("/")[0] if self.staging else self.registry

    @property
    def staging_repository(self) -> str:
        return self.staging.partition("/")[2] if self.staging else f"{self.repository}-staging"

    @property
    def zstd_twins(self) -> bool:
        """Whether `builder publish` gives each tag a `<tag>-zstd` twin (builder.stages.twin)."""
        return "zstd" in self.compression

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
    """The matrix a schema-valid document describes, and the problems only its variants show."""
    bases = {py: Base(**spec) for py, spec in data["bases"].items()}
    try:
        if too_large := combinations_problem(data, lines):
            raise ExpansionTooLarge(too_large)
        combos, origin = expand(data["axes"], data.get("include", []), data.get("exclude", []))
    except ExpansionTooLarge as exc:  # a problem without a line yet: expand has no lines
        where = exc.problem.path
        return Matrix(path=path, registry=data["registry"], repository=data["repository"],
                      bases=bases, toolkits={}, variants=()), [
            Problem(line_of(lines, where), where, exc.problem.message)]
    variants, problems = _variants(data, bases, *expand_platforms(combos, origin, data), lines)
    problems += _selector_problems(data, lines, variants)
    problems += _alias_problems(data.get("aliases", []), lines)
    trust, why = _trust(data)
    if why:
        problems.append(Problem(line_of(lines, ("trust_keys",)), ("trust_keys",), why))
    aliases = tuple(
        Alias(a["tag"], {k: v for k, v in a.items() if k != "tag"}) for a in data.get("aliases", [])
    )
    matrix = Matrix(
        path=path, registry=data["registry"], repository=data["repository"], bases=bases,
        toolkits=data.get("toolkits", {}), variants=tuple(variants), aliases=aliases, lines=lines,
        staging=data.get("staging", ""),
        trust_keys=tuple(path.parent / key for key in trust.get("keys", [])),
        trust_identities=tuple(trust.get("identities", [])),
        trusted_root=path.parent / trust["trusted_root"] if trust.get("trusted_root") else None,
        insecure_registries=tuple(data.get("insecure_registries", [])),
        compression=tuple(data.get("compression", ("gzip", "zstd"))),
    )
    return matrix, problems


def _trust(data: Mapping[str, Any]) -> tuple[Mapping[str, Any], str]:
    """`trust:`, or the deprecated top-level `trust_keys:` as its `keys`; a problem when both
    are given (which one counts would be a guess)."""
    if "trust_keys" in data and "trust" in data:
        return data["trust"], ("`trust_keys` is the deprecated spelling of `trust.keys`: give "
                               "one of them (move the keys under `trust:`)")
    return data.get("trust") or {"keys": data.get("trust_keys", [])}, ""


def _variants(data: dict[str, Any], bases: Mapping[str, Base], combos: Sequence[dict[str, Any]],
              origin: Sequence[int], lines: Mapping[Path_, int]
              ) -> tuple[list[Variant], list[Problem]]:
    """One Variant per expanded combination (each problem at the axes or include entry that
    made it), duplicates refused, `default` extended to whole variants."""
    defaults = data.get("default", [])
    problems: list[Problem] = []
    variants: list[Variant] = []
    seen: dict[str, Path_] = {}
    for combo, index in zip(combos, origin, strict=True):
        where: Path_ = ("include", index) if index >= 0 else ("axes",)
        missing = [k for k in AXES if k not in combo]
        if missing:
            problems.append(Problem(line_of(lines, where), where,
                                    f"a new variant needs {', '.join(AXES)}; missing: "
                                    + ", ".join(missing)))
            continue
        variant, variant_problems = _variant(combo, data, bases, defaults, where, lines)
        problems += variant_problems
        if variant is None:
            continue
        if variant.key in seen:
            problems.append(Problem(line_of(lines, where), where,
                                    f"duplicate variant `{variant.key}` (also from "
                                    f"{format_path(seen[variant.key])})"))
            continue
        seen[variant.key] = where
        variants.append(variant)
    return whole_defaults(variants), problems


def _variant(combo: dict[str, Any], data: dict[str, Any], bases: Mapping[str, Base],
             defaults: Sequence[Mapping[str, Any]], where: Path_, lines: Mapping[Path_, int]
             ) -> tuple[Variant | None, list[Problem]]:
    line = line_of(lines, where)
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
            problems.append(Problem(line_of(lines, path), path, why))
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
                problems.append(Problem(line_of(lines, path), path, "selects no variant"))
            elif key == "aliases" and len(hits) > 1:
                problems.append(Problem(line_of(lines, path), path,
                                        f"alias `{selector['tag']}` selects {len(hits)} variants "
                                        f"({', '.join(v.id for v in hits[:4])}…); add keys until "
                                        "it selects one"))
    return problems


