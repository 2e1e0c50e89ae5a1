"""The publication record: one shape for published.json, rebuild, verify and the catalog."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from records import platform_entry, publication

from builder.core.errors import BuilderError
from builder.model import publication as record
from builder.model.publication import Publication


def test_a_record_survives_the_json_round_trip_and_the_schema(tmp_path: Path) -> None:
    pub = publication()
    multi = replace(pub, platforms=(platform_entry("linux/amd64", "sha256:" + "a" * 64),
                                    platform_entry("linux/arm64", "sha256:" + "b" * 64)))
    for one in (pub, multi):
        assert Publication.from_json(json.loads(json.dumps(one.to_json()))) == one
    path = tmp_path / "published.json"
    record.record(path, {"v": pub})
    record.record(path, {"v": multi})
    assert record.load(path) == {"v": [pub]}  # same digest and dated tag: not added twice
    assert record.latest(path)["v"] == pub


def test_optional_fields_are_left_out_when_empty() -> None:
    doc = publication(provenance=None).to_json()
    assert "provenance" not in doc and "platforms" not in doc
    assert doc["cuda"] is None  # a required field with no value stays, as null


def test_each_platform_sees_its_own_entry_over_the_variants_fields() -> None:
    a, b = "sha256:" + "a" * 64, "sha256:" + "b" * 64
    index = publication(platforms=(platform_entry("linux/amd64", a, reference="r@a"),
                                   platform_entry("linux/arm64", b, reference="r@b")))
    arm = index.for_platform("linux/arm64")
    assert arm is not None and arm.reference == "r@b" and arm.digest == b
    assert arm.dated_tag == index.dated_tag  # the variant's own fields
    plain = publication()
    assert plain.for_platform("linux/amd64") == plain
    assert plain.for_platform("linux/arm64") is None


@pytest.mark.parametrize(("text", "message"), [("{", "is not JSON"),
                                               ('{"schema_version": 2, "variants": {}}', "schema_version")])
def test_a_broken_record_is_one_error_naming_the_file(tmp_path: Path, text: str,
                                                      message: str) -> None:
    path = tmp_path / "published.json"
    path.write_text(text)
    with pytest.raises(BuilderError, match=message) as err:
        record.load(path)
    assert str(path) in str(err.value)


def test_a_folder_is_not_a_record(tmp_path: Path) -> None:
    with pytest.raises(BuilderError, match="is a folder"):
        record.load(tmp_path)
    assert record.load(tmp_path / "absent.json") == {}
