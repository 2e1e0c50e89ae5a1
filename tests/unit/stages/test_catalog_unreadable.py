"""One image pushed with labels or a manifest off catalog.json's schema is listed as
`unreadable: <reason>`; the catalog goes on with every other image."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from builder.model import catalog_doc, catalog_unreadable
from builder.stages import catalog, catalog_site

GOOD, BAD = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def facts(accelerator: Any = "cpu", found_labels: Any = None) -> dict[str, Any]:
    return {"digest": GOOD, "index": False, "torch": "2.13.0", "python": "3.11",
            "accelerator": accelerator, "cuda": None, "flavor": "runtime",
            "platforms": [{"platform": "linux/amd64",
                           "labels": {"a": "b"} if found_labels is None else found_labels}]}


def test_off_schema_facts_are_named() -> None:
    assert catalog_unreadable.problem(facts()) == ""
    assert catalog_unreadable.problem(facts("tpu")) == "accelerator 'tpu' is not one of cpu, cuda"
    assert catalog_unreadable.problem(facts(found_labels={"x": 1})) == \
        "its labels are not a map of strings"
    weird = facts()
    weird["torch"] = ["2.13.0"]
    assert catalog_unreadable.problem(weird) == "torch ['2.13.0'] is not a string"
    weird = facts()
    weird["platforms"][0]["platform"] = "Linux AMD64"
    assert catalog_unreadable.problem(weird).startswith("platform 'Linux AMD64' does not match")


def test_readable_facts_turns_a_broken_or_off_schema_image_into_a_reason(
        monkeypatch: pytest.MonkeyPatch) -> None:
    answers = {GOOD: facts(), BAD: facts("tpu")}
    monkeypatch.setattr(catalog, "image_facts", lambda reader, d, tags, digests: answers[d])
    assert catalog.readable_facts(None, GOOD, None, {}) == answers[GOOD]  # type: ignore[arg-type]
    assert catalog.readable_facts(None, BAD, None, {}) == {  # type: ignore[arg-type]
        "unreadable": "accelerator 'tpu' is not one of cpu, cuda"}

    def broken(reader: Any, digest: str, tags: Any, digests: Any) -> dict[str, Any]:
        raise KeyError("config")
    monkeypatch.setattr(catalog, "image_facts", broken)
    assert catalog.readable_facts(None, BAD, None, {}) == {  # type: ignore[arg-type]
        "unreadable": "KeyError: 'config'"}


def test_the_document_and_the_site_list_it(tmp_path: Path) -> None:
    doc = {"schema_version": 1, "generated_at": "2026-12-04T00:00:00Z", "registry": "r:5000",
           "repository": "torch", "tags": {}, "images": {}, "variants": [],
           "unreadable": [catalog_unreadable.entry(BAD, ["x-slim", "evil"], "accelerator 'tpu' "
                                                   "is not one of cpu, cuda")]}
    schema = json.loads(catalog_doc.SCHEMA_PATH.read_text())
    jsonschema.Draft202012Validator(schema).validate(doc)
    catalog_site.write_site(doc, tmp_path)
    index = (tmp_path / "index.html").read_text()
    assert "evil, x-slim (sha256:222222222222): unreadable: accelerator &#39;tpu&#39;" in index
