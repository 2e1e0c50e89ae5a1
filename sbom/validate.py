"""Schema validation and atomic writing: an invalid SBOM is an error and leaves no file.

A document is validated once, where it leaves the process (`render`, `write`) and again at
publish, strictly (CycloneDX 1.6 JSON, no unknown keys, formats checked). The validator is built
once per process; `iri`/`iri-reference` are checked by `sbom.iri` (a regex) instead of
rfc3987-syntax's Earley parser, which cost 1.2 s to import and 60 ms per URL.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import itertools
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from builder.core.errors import GateRefused

FORMATS = ("json", "xml")


class SbomInvalid(GateRefused):
    """The document does not validate against CycloneDX 1.6."""


def dumps(doc: dict[str, Any]) -> str:
    """The canonical JSON text: stable key order as built, two-space indent, final newline."""
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def validate(doc: dict[str, Any]) -> None:
    """Raise SbomInvalid unless `doc` is valid CycloneDX 1.6 JSON (strict: no unknown keys)."""
    _check(json.loads(dumps(doc)))  # as a reader will see it: tuples become lists, and so on


def _check(data: Any) -> None:
    errors = list(itertools.islice(_validator().iter_errors(data), 10))
    if errors:
        raise SbomInvalid(
            "the SBOM is not valid CycloneDX 1.6",
            hint="\n".join(str(e)[:300] for e in errors),
        )


@functools.cache
def _validator() -> Any:
    """cyclonedx-python-lib's strict 1.6 JSON validator, with the fast IRI format checks."""
    _import_jsonschema()
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator
    from jsonschema import Draft7Validator, FormatChecker

    from sbom import iri

    checker = FormatChecker(())
    checker.checkers = {**Draft7Validator.FORMAT_CHECKER.checkers}
    checker.checks("iri", raises=ValueError)(iri.is_iri)
    checker.checks("iri-reference", raises=ValueError)(iri.is_iri_reference)
    # The library's schema and $ref registry (SPDX, JSF, cryptography definitions), built once.
    strict = JsonStrictValidator(SchemaVersion.V1_6)._validator  # type: ignore[attr-defined]
    return strict.evolve(format_checker=checker)


# Imported by jsonschema for its format checks, each at a cost paid before any validation:
# rfc3987-syntax builds an Earley parser (1.2 s), isoduration brings arrow (60 ms). The CycloneDX
# schema checks IRIs (sbom.iri does that with a regex) and no durations.
_DEFERRED = ("rfc3987_syntax", "isoduration")


def _import_jsonschema() -> None:
    """Import jsonschema without the _DEFERRED modules, then register the same checks.

    Whoever validates with jsonschema later in this process gets the same format checks: IRIs
    through sbom.iri, durations through isoduration imported at their first use.
    """
    if "jsonschema" in sys.modules:
        return
    blocked = [name for name in _DEFERRED if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]  # their import raises ImportError
    try:
        import jsonschema
    finally:
        for name in blocked:
            del sys.modules[name]
    from sbom import iri

    drafts = [jsonschema.Draft201909Validator.FORMAT_CHECKER,
              jsonschema.Draft202012Validator.FORMAT_CHECKER, jsonschema.FormatChecker]
    checks = [("iri", iri.is_iri, [jsonschema.Draft7Validator.FORMAT_CHECKER, *drafts]),
              ("iri-reference", iri.is_iri_reference,
               [jsonschema.Draft7Validator.FORMAT_CHECKER, *drafts])]
    if "isoduration" in blocked and importlib.util.find_spec("isoduration"):
        checks.append(("duration", _is_duration, drafts))
    for fmt, func, checkers in checks:
        for checker in checkers:
            checker.checkers.setdefault(fmt, (func, ValueError))


def _is_duration(instance: object) -> bool:
    """jsonschema's own `duration` check, importing isoduration when first needed."""
    if not isinstance(instance, str):
        return True
    # jsonschema's optional dependency, used as jsonschema uses it (not one of ours: by name).
    # It raises DurationParsingException, a ValueError.
    importlib.import_module("isoduration").parse_duration(instance)
    return instance.endswith(tuple("DMYWHMS"))  # as jsonschema: see bolsote/isoduration#25


def render(doc: dict[str, Any], fmt: str = "json") -> str:
    """The validated document as JSON or CycloneDX XML text."""
    if fmt not in FORMATS:
        raise SbomInvalid(f"unknown SBOM format `{fmt}`", hint="use one of: " + ", ".join(FORMATS))
    text = dumps(doc)
    _check(json.loads(text))
    return text if fmt == "json" else _to_xml(doc)


def _to_xml(doc: dict[str, Any]) -> str:
    from cyclonedx.model.bom import Bom
    from cyclonedx.output import make_outputter
    from cyclonedx.schema import OutputFormat, SchemaVersion

    # The model has no compositions; the XML carries everything else.
    bom = Bom.from_json({k: v for k, v in doc.items() if k != "compositions"})  # type: ignore[attr-defined]
    text = make_outputter(bom, OutputFormat.XML, SchemaVersion.V1_6).output_as_string(indent=2)
    _validate_xml(text)
    return text


def _validate_xml(text: str) -> None:
    from cyclonedx.exception import MissingOptionalDependencyException
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.xml import XmlValidator

    try:
        error = XmlValidator(SchemaVersion.V1_6).validate_str(text)
    except MissingOptionalDependencyException:
        return  # lxml absent: the JSON form above was validated strictly
    if error is not None:
        raise SbomInvalid("the SBOM's XML form is not valid CycloneDX 1.6", hint=str(error)[:2000])


def write(doc: dict[str, Any], path: Path, fmt: str = "json") -> Path:
    """Validate, then write atomically (temp file + os.replace); nothing is written on error."""
    text = render(doc, fmt)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
