"""Go's ``encoding/json``: Marshal (compact, keys in the given order, HTML-safe
escapes) and Unmarshal's tolerance of what a client sends.

nsqd's and nsqlookupd's JSON answers are compared byte for byte with Go's,
so floats, string escapes (``<>&``, U+2028/9, invalid UTF-8 as U+FFFD) and
key order follow Go exactly. Input is read as Go reads it: invalid UTF-8
inside strings becomes U+FFFD, nesting up to Go's 10,000 levels decodes and
deeper input is an error, never a ``RecursionError`` from Python's decoder.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_NESTING_DEPTH", "go_dumps", "go_json", "go_loads", "go_number"]

#: encoding/json's scanner refuses input nested deeper than this
MAX_NESTING_DEPTH = 10000
#: below this many brackets Python's decoder cannot run out of recursion
_SHALLOW = 200
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def _nesting_depth(text: str) -> int:
    """The deepest bracket nesting outside strings, in C-speed passes (no per-character Python)."""
    brackets = _BRACKETS.findall(_STRINGS.sub("", text))
    return max(itertools.accumulate(map(_STEP.__getitem__, brackets)), default=0)


def go_loads(data: bytes | str) -> Any:
    """Decode JSON from a client as Go's ``json.Unmarshal`` would accept it (ValueError if not).

    Deep but legal input (Go allows 10,000 levels) is decoded with the
    interpreter's recursion limit raised for the call; the C decoder's
    frames are small, so the main thread's stack holds them.
    """
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    if text.count("[") + text.count("{") < _SHALLOW:
        return json.loads(text)
    depth = _nesting_depth(text)
    if depth > MAX_NESTING_DEPTH:
        raise ValueError(f"exceeded max depth {MAX_NESTING_DEPTH}")
    limit = sys.getrecursionlimit()
    if depth + 200 > limit:
        sys.setrecursionlimit(depth + 200)
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    finally:
        sys.setrecursionlimit(limit)


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


#: json.dumps output that may need Go's escapes (a prefilter: may say yes wrongly, never no)
_MAYBE_UNGO = re.compile("[<>&\u2028\u2029\ud800-\udfff]|\\\\[bf]")
#: one escape sequence (kept whole, so an escaped backslash is not read as the start of
#: another) or one character Go escapes and json.dumps does not
_UNGO = re.compile("\\\\(?:u[0-9a-fA-F]{4}|.)|[<>&\u2028\u2029\ud800-\udfff]", re.DOTALL)
_GO_ESCAPES = {"\\b": "\\u0008", "\\f": "\\u000c", "<": "\\u003c", ">": "\\u003e",
               "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _go_escape(match: re.Match[str]) -> str:
    token = match.group()
    fixed = _GO_ESCAPES.get(token)
    if fixed is not None:
        return fixed
    if len(token) == 1:  # a lone surrogate: an undecodable byte (surrogateescape)
        return "\\ufffd"
    return token


class _NotPlain(Exception):
    """A float json.dumps would write differently from Go (the exact encoder is used)."""


def go_number(value: float) -> int | float:
    """A float json.dumps writes as Go does: integral ones as ints (``1`` not ``1.0``).

    Raises :class:`ValueError` for the few json.dumps cannot write Go's way
    (below 1e-4 or from 1e21 on, where the exponent forms differ).
    """
    if value.is_integer() and abs(value) < 1e21:
        if value == 0 and math.copysign(1.0, value) < 0:
            raise ValueError(value)  # Go writes -0
        return int(value)
    if value != 0 and not 1e-4 <= abs(value) < 1e21:
        raise ValueError(value)
    return value


def _plain(value: Any) -> Any:
    """``value`` with its floats made :func:`go_number`s; raises _NotPlain when one cannot be."""
    if isinstance(value, float):
        try:
            return go_number(value)
        except ValueError:
            raise _NotPlain from None
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    return value


def go_dumps(value: Any) -> str:
    """Go's ``json.Marshal`` text at C speed: ``json.dumps`` and Go's escapes fixed in after.

    The caller guarantees there is no float json.dumps writes otherwise than
    Go (pass them through :func:`go_number`) and no bytes; a big snapshot is
    encoded in pieces with this (``/stats``), so no call holds the reactor
    long. Go escapes ``<>&``, U+2028/U+2029, ``\\b``/``\\f`` as ``\\u00XX``
    and writes an undecodable byte as U+FFFD; json.dumps does neither.
    """
    text = _ENCODER.encode(value)
    if text.isascii():  # the usual case: four substring scans at C speed, no regex
        if "<" in text or ">" in text or "&" in text or "\\b" in text or "\\f" in text:
            text = _UNGO.sub(_go_escape, text)
    elif _MAYBE_UNGO.search(text) is not None:
        text = _UNGO.sub(_go_escape, text)
    return text


def go_json(value: Any) -> bytes:
    """Encode like Go's ``json.Marshal``: compact, keys in the given order, HTML-safe escapes."""
    try:
        plain = _plain(value)
    except _NotPlain:
        out: list[str] = []
        _encode(value, out)
        return "".join(out).encode("utf-8")
    return go_dumps(plain).encode("utf-8")
