"""Go's ``strconv``: ParseInt, ParseBool, ParseFloat and ``%q`` quoting, as nsqd relies on them.

One integer parser serves every caller (flags, config values, HTTP query
parameters, V2 command arguments); the callers differ only in the base and
sign rules Go applies at each place, which are parameters here.
"""

from __future__ import annotations

import json

__all__ = ["INT64_MAX", "INT64_MIN", "PARSE", "RANGE", "NumError", "parse_bool", "parse_float",
           "parse_int", "quote"]

INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

#: the reasons Go's strconv.NumError carries
PARSE = "parse error"
RANGE = "value out of range"

_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})


class NumError(ValueError):
    """A value Go's strconv refuses; ``str()`` is Go's reason (``parse error``/``value out of range``)."""


def quote(text: str) -> str:
    """Double-quote like Go's ``%q`` so error lines match nsqd's."""
    return json.dumps(text, ensure_ascii=False)


def parse_bool(text: str) -> bool:
    """Go's ``strconv.ParseBool``."""
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise NumError(PARSE)


def parse_int(text: str | bytes, base: int = 10, *, signed: bool = True, bounded: bool = True) -> int:
    """Go's ``strconv.ParseInt(s, base, 64)`` for base 0 or 10.

    Base 0 is what Go's ``flag`` package uses: ``0x``, ``0o``, ``0b`` and a
    leading ``0`` (octal) select the base. Base 10 is plain decimal digits.
    ``signed=False`` refuses a sign at all, as nsqd's ``ByteToBase10`` does
    for V2 command arguments. The result must fit in an int64 unless
    ``bounded`` is false (the caller checks its own, narrower range).
    """
    if isinstance(text, bytes):
        if not text.isascii():
            raise NumError(PARSE)
        text = text.decode("ascii")
    sign = text[:1] in ("+", "-")
    if sign and not signed:
        raise NumError(PARSE)
    body = text[1:] if sign else text
    if base == 10:
        if not body or not body.isascii() or not body.isdigit():
            raise NumError(PARSE)
        value = int(body, 10)
    elif base == 0:
        if not text.isascii() or any(c.isspace() for c in text) or not body or body[:1] == "_":
            raise NumError(PARSE)
        try:
            if body[:2].lower() in ("0x", "0o", "0b"):
                value = int(body, 0)
            elif len(body) > 1 and body[0] == "0":
                value = int(body, 8)
            else:
                value = int(body, 10)
        except ValueError:
            raise NumError(PARSE) from None
    else:
        raise ValueError(f"unsupported base {base}")
    if text[:1] == "-":
        value = -value
    if bounded and not INT64_MIN <= value <= INT64_MAX:
        raise NumError(RANGE)
    return value


def parse_float(text: str) -> float:
    """Go's ``strconv.ParseFloat`` for the forms people write (no spaces, no ``_``)."""
    if not text.isascii() or any(c.isspace() for c in text) or "_" in text:
        raise NumError(PARSE)
    try:
        return float(text)
    except ValueError:
        raise NumError(PARSE) from None
