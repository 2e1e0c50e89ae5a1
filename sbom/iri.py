"""RFC 3987 IRI syntax as one compiled regular expression, for JSON Schema `iri` formats.

jsonschema checks `iri` and `iri-reference` with rfc3987-syntax, a Lark Earley parser that takes
1.2 s to build at import and ~60 ms per value; CycloneDX uses `iri-reference` for every URL. This
is the same grammar (RFC 3987 section 2.2, with RFC 3986's IPv6 forms) checked in microseconds.
Differences from rfc3987-syntax, both where it departs from the RFC: characters outside the Basic
Multilingual Plane in `ucschar`/`iprivate`, and IPv6 literals with `::` elision (`[::1]`), are
accepted here.
"""

from __future__ import annotations

import re

# The regex sees ASCII only (it compiles in milliseconds, not the 180 ms of the Unicode ranges):
# each ucschar is replaced by _UCS and each iprivate by _PRIVATE, control characters that are
# never valid, so they stand exactly where the grammar allows those characters.
_UCS, _PRIVATE = "\x01", "\x02"
_UNRESERVED = r"A-Za-z0-9\-._~"
_SUB_DELIMS = r"!$&'()*+,;="
_PCT = r"%[0-9A-Fa-f]{2}"


def _chars(extra: str) -> str:
    """One iunreserved / pct-encoded / sub-delims / `extra` character."""
    return rf"(?:[{_UNRESERVED}{_UCS}{_SUB_DELIMS}{extra}]|{_PCT})"


def _ipv6() -> str:
    h16, dec = "[0-9A-Fa-f]{1,4}", r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
    ls32 = rf"(?:{h16}:{h16}|{dec}(?:\.{dec}){{3}})"
    forms = [rf"(?:{h16}:){{6}}{ls32}", rf"::(?:{h16}:){{5}}{ls32}"]
    # [ *n( h16 ":" ) h16 ] "::" tail, for n = -1 (absent) .. 6
    tails = [rf"(?:{h16}:){{4}}{ls32}", rf"(?:{h16}:){{3}}{ls32}", rf"(?:{h16}:){{2}}{ls32}",
             rf"{h16}:{ls32}", ls32, h16, ""]
    for n, tail in enumerate(tails):
        head = rf"(?:(?:{h16}:){{0,{n}}}{h16})?" if n else rf"(?:{h16})?"
        forms.append(rf"{head}::{tail}")
    return "(?:" + "|".join(forms) + ")"


_IPCHAR = _chars(":@")
_SEGMENT = f"{_IPCHAR}*"
_SEGMENT_NZ = f"{_IPCHAR}+"
_IP_LITERAL = rf"\[(?:{_ipv6()}|v[0-9A-Fa-f]+\.[{_UNRESERVED}{_SUB_DELIMS}:]+)\]"
_AUTHORITY = rf"(?:{_chars(':')}*@)?(?:{_IP_LITERAL}|{_chars('')}*)(?::[0-9]*)?"
_ABEMPTY = f"(?:/{_SEGMENT})*"
_ABSOLUTE = f"/(?:{_SEGMENT_NZ}(?:/{_SEGMENT})*)?"
_TAIL = rf"(?:\?(?:{_IPCHAR}|[/?{_PRIVATE}])*)?(?:#(?:{_IPCHAR}|[/?])*)?"
_SCHEME = r"[A-Za-z][A-Za-z0-9+\-.]*"
_HIER = f"(?://{_AUTHORITY}{_ABEMPTY}|{_ABSOLUTE}|{_SEGMENT_NZ}(?:/{_SEGMENT})*|)"
_RELATIVE = f"(?://{_AUTHORITY}{_ABEMPTY}|{_ABSOLUTE}|{_chars('@')}+(?:/{_SEGMENT})*|)"

_IRI = re.compile(f"{_SCHEME}:{_HIER}{_TAIL}")
_IRI_REFERENCE = re.compile(f"(?:{_SCHEME}:{_HIER}|{_RELATIVE}){_TAIL}")


def is_iri(value: object) -> bool:
    """True for an absolute IRI (and for non-strings, which the format does not constrain)."""
    return _matches(_IRI, value)


def is_iri_reference(value: object) -> bool:
    """True for an IRI or a relative reference (and for non-strings)."""
    return _matches(_IRI_REFERENCE, value)


def _matches(pattern: re.Pattern[str], value: object) -> bool:
    if not isinstance(value, str):
        return True
    text = _stand_ins(value)
    return text is not None and pattern.fullmatch(text) is not None


def _stand_ins(value: str) -> str | None:
    """`value` with _UCS/_PRIVATE for its non-ASCII characters; None if one is neither."""
    if _UCS in value or _PRIVATE in value:
        return None
    if value.isascii():
        return value
    out = []
    for ch in value:
        code = ord(ch)
        if code < 0x80:
            out.append(ch)
        elif _is_ucschar(code):
            out.append(_UCS)
        elif _is_iprivate(code):
            out.append(_PRIVATE)
        else:
            return None
    return "".join(out)


def _is_ucschar(code: int) -> bool:
    if code <= 0xFFFF:
        return 0xA0 <= code <= 0xD7FF or 0xF900 <= code <= 0xFDCF or 0xFDF0 <= code <= 0xFFEF
    # planes 1-13 less each plane's last two code points, then E1000-EFFFD
    return (code <= 0xDFFFF or 0xE1000 <= code <= 0xEFFFF) and code & 0xFFFF <= 0xFFFD


def _is_iprivate(code: int) -> bool:
    return 0xE000 <= code <= 0xF8FF or (code >= 0xF0000 and code & 0xFFFF <= 0xFFFD)
