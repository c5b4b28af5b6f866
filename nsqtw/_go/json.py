"""Go's ``encoding/json`` Marshal: compact, keys in the given order, HTML-safe escapes.

nsqd's and nsqlookupd's JSON answers are compared byte for byte with Go's,
so floats, string escapes (``<>&``, U+2028/9, invalid UTF-8 as U+FFFD) and
key order follow Go exactly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["go_json"]


def _go_float(value: float) -> str:
    """A float64 as Go's encoding/json writes it (shortest form, ``1`` not ``1.0``)."""
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"unsupported value: {value!r}")
    a = abs(value)
    if a != 0 and (a < 1e-6 or a >= 1e21):
        mant, _, exp = repr(value).partition("e")
        if not exp:  # repr chose positional; force Go's exponent form
            mant, _, exp = f"{value:e}".partition("e")
            mant = mant.rstrip("0").rstrip(".")
        sign = "-" if exp.startswith("-") else "+"
        digits = exp.lstrip("+-").lstrip("0") or "0"
        if sign == "+":  # strconv pads to two digits; json trims "e-07" to "e-7"
            digits = digits.rjust(2, "0")
        mant = mant.removesuffix(".0")
        return f"{mant}e{sign}{digits}"
    text = repr(value)
    if "e" in text:
        text = format(value, "f")
        if "." in text:
            text = text.rstrip("0").rstrip(".")
        return text
    return text.removesuffix(".0")


_HEX = "0123456789abcdef"


def _go_string(text: str) -> str:
    out = ['"']
    for ch in text:
        c = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif c < 0x20 or ch in "<>&":
            out.append("\\u00" + _HEX[c >> 4] + _HEX[c & 0xF])
        elif c in (0x2028, 0x2029):
            out.append(f"\\u{c:04x}")
        elif 0xD800 <= c <= 0xDFFF:  # undecodable byte (surrogateescape): invalid UTF-8
            out.append("\\ufffd")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _encode(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(_go_float(value))
    elif isinstance(value, str):
        out.append(_go_string(value))
    elif isinstance(value, bytes):
        out.append(_go_string(value.decode("utf-8", "surrogateescape")))
    elif isinstance(value, Mapping):
        out.append("{")
        first = True
        for k, v in value.items():
            if not first:
                out.append(",")
            first = False
            out.append(_go_string(str(k)))
            out.append(":")
            _encode(v, out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for i, v in enumerate(value):
            if i:
                out.append(",")
            _encode(v, out)
        out.append("]")
    else:
        raise TypeError(f"cannot encode {type(value).__name__} as JSON")


def go_json(value: Any) -> bytes:
    """Encode like Go's ``json.Marshal``: compact, keys in the given order, HTML-safe escapes."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out).encode("utf-8")
