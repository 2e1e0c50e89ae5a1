"""Images the catalog cannot describe: labels or manifests off catalog.json's schema. Anyone
with push rights can push such an image; the catalog lists it as `unreadable: <reason>` and goes
on, instead of failing as a whole.

The check is cheap (no jsonschema import): it reads the schema's own enums, types and patterns
for the facts taken from an image's labels and config.
"""

from __future__ import annotations

import json
import re
from functools import cache
from typing import Any

from builder.core import limits
from builder.model.catalog_doc import SCHEMA_PATH


@cache
def _rules() -> tuple[dict[str, Any], dict[str, Any]]:
    defs = json.loads(SCHEMA_PATH.read_text())["$defs"]
    return defs["image"]["properties"], defs["platform"]["properties"]


def _value_problem(name: str, rule: dict[str, Any], value: Any) -> str:
    shown = limits.shorten(repr(value))
    if "enum" in rule and value not in rule["enum"]:
        return f"{name} {shown} is not one of {', '.join(map(str, rule['enum']))}"
    kinds = rule.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds or []
    if "string" in kinds and not isinstance(value, str) and not (value is None and "null" in kinds):
        return f"{name} {shown} is not a string"
    if "pattern" in rule and isinstance(value, str) and not re.search(rule["pattern"], value):
        return f"{name} {shown} does not match {rule['pattern']}"
    return ""


def problem(image: dict[str, Any]) -> str:
    """Why `image` (an entry of catalog.json's `images`) breaks the schema ('' when it fits)."""
    image_rules, platform_rules = _rules()
    for name, rule in image_rules.items():
        if name in image and (found := _value_problem(name, rule, image[name])):
            return found
    if not image.get("platforms"):
        return "no platform manifest"
    for platform in image["platforms"]:
        if found := _value_problem("platform", platform_rules["platform"],
                                   platform.get("platform")):
            return found
        found_labels = platform.get("labels")
        if not isinstance(found_labels, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in found_labels.items()):
            return "its labels are not a map of strings"
    return ""


def entry(digest: str, tags: list[str], reason: str) -> dict[str, Any]:
    """catalog.json's `unreadable` entry of one image."""
    return {"digest": digest, "tags": sorted(tags), "reason": reason[:300]}
