"""GitHub Actions expressions for the rehearsal's runner (tests/e2e/actions_runner.py): `${{ … }}`
in a value and `if:` as GitHub reads them (names over the job's contexts, the status functions,
`fromJSON`, `toJSON`, `contains`), translated into a Python expression and evaluated without
builtins. Enough for this repository's workflows, nothing more."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

_TOKEN = re.compile(r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>\d+(?:\.\d+)?)|(?P<op>==|!=|&&|\|\||"
                    r"[!(),<>])|(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*(?:\[\d+\])?))")


def to_python(expr: str) -> str:
    """A GitHub expression as a Python expression over `ctx` (names) and the functions."""
    out, pos = [], 0
    while pos < len(expr.rstrip()):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise ValueError(f"cannot read the expression `{expr}` at {pos}")
        pos = m.end()
        if m["str"]:
            out.append(repr(m["str"][1:-1].replace("''", "'")))
        elif m["num"]:
            out.append(m["num"])
        elif m["op"]:
            out.append({"&&": " and ", "||": " or ", "!": " not "}.get(m["op"], m["op"]))
        elif expr[pos:].lstrip().startswith("("):
            out.append(f"fn_{m['name']}")
        elif m["name"] in ("true", "false", "null"):
            out.append({"true": "True", "false": "False", "null": "None"}[m["name"]])
        else:
            out.append(f"ctx({m['name']!r})")
    return "".join(out)


def evaluate(expr: str, context: Mapping[str, Any], status: Mapping[str, bool]) -> Any:
    def ctx(name: str) -> Any:
        value: Any = context
        for part in name.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
        return value

    def fn_fromJSON(text: str) -> Any:
        return json.loads(text)

    def fn_contains(haystack: Any, needle: Any) -> bool:
        return needle in (haystack or [])

    def fn_toJSON(value: Any) -> str:
        return json.dumps(value)

    names = {"ctx": ctx, "fn_fromJSON": fn_fromJSON, "fn_contains": fn_contains,
             "fn_toJSON": fn_toJSON, **{f"fn_{k}": (lambda v=v: v) for k, v in status.items()}}
    return eval(to_python(expr), {"__builtins__": {}}, names)  # the workflows of this repo


def substitute(text: Any, context: Mapping[str, Any], status: Mapping[str, bool]) -> Any:
    """`${{ … }}` in a value: the whole value when it is one expression, else text."""
    if not isinstance(text, str) or "${{" not in text:
        return text
    whole = re.fullmatch(r"\s*\$\{\{(.*?)\}\}\s*", text, re.S)
    if whole and text.count("${{") == 1:
        return evaluate(whole[1], context, status)
    return re.sub(r"\$\{\{(.*?)\}\}",
                  lambda m: as_text(evaluate(m[1], context, status)), text, flags=re.S)


def as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return "" if value is None else str(value)


def condition(expr: Any, context: Mapping[str, Any], status: Mapping[str, bool]) -> bool:
    """An `if:` as GitHub reads it: without a status function it means `success() && (…)`."""
    if expr is None:
        return status["success"]
    text = str(expr).strip()
    text = text[3:-2] if text.startswith("${{") and text.endswith("}}") else text
    if not re.search(r"\b(always|cancelled|failure|success)\(", text):
        text = f"success() && ({text})"
    return bool(evaluate(text, context, status))
