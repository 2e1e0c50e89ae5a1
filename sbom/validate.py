"""Schema validation and atomic writing: an invalid SBOM is an error and leaves no file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from cyclonedx.schema import OutputFormat, SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from builder.errors import GateRefused

FORMATS = ("json", "xml")


class SbomInvalid(GateRefused):
    """The document does not validate against CycloneDX 1.6."""


def dumps(doc: dict[str, Any]) -> str:
    """The canonical JSON text: stable key order as built, two-space indent, final newline."""
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def validate(doc: dict[str, Any]) -> None:
    """Raise SbomInvalid unless `doc` is valid CycloneDX 1.6 JSON (strict: no unknown keys)."""
    errors = JsonStrictValidator(SchemaVersion.V1_6).validate_str(dumps(doc), all_errors=True)
    if errors is not None:
        raise SbomInvalid(
            "the SBOM is not valid CycloneDX 1.6",
            hint="\n".join(str(e)[:300] for e in list(errors)[:10]),
        )


def render(doc: dict[str, Any], fmt: str = "json") -> str:
    """The validated document as JSON or CycloneDX XML text."""
    if fmt not in FORMATS:
        raise SbomInvalid(f"unknown SBOM format `{fmt}`", hint="use one of: " + ", ".join(FORMATS))
    validate(doc)
    if fmt == "json":
        return dumps(doc)
    return _to_xml(doc)


def _to_xml(doc: dict[str, Any]) -> str:
    from cyclonedx.model.bom import Bom
    from cyclonedx.output import make_outputter

    # The model has no compositions; the XML carries everything else.
    bom = Bom.from_json({k: v for k, v in doc.items() if k != "compositions"})  # type: ignore[attr-defined]
    text = make_outputter(bom, OutputFormat.XML, SchemaVersion.V1_6).output_as_string(indent=2)
    _validate_xml(text)
    return text


def _validate_xml(text: str) -> None:
    from cyclonedx.exception import MissingOptionalDependencyException
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
