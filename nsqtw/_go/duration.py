"""Go's ``time.ParseDuration`` and ``Duration.String``, exact to the nanosecond.

nsqd's flags, config file and ``/stats`` text all use Go durations, and
users copy them between Go nsqd and nsqtw; values round-trip and overflow is
caught where Go catches it.
"""

from __future__ import annotations

from nsqtw._go.strconv import INT64_MAX as _INT64_MAX
from nsqtw._go.strconv import quote as _quote

__all__ = ["format_duration", "format_duration_ns", "parse_duration", "parse_duration_ns"]

_NS = 1
_US = 1000 * _NS
_MS = 1000 * _US
_S = 1000 * _MS
_MIN = 60 * _S
_H = 60 * _MIN

_UNITS = {
    "ns": _NS,
    "us": _US,
    "\u00b5s": _US,  # micro sign
    "\u03bcs": _US,  # Greek small letter mu
    "ms": _MS,
    "s": _S,
    "m": _MIN,
    "h": _H,
}


def parse_duration_ns(text: str) -> int:
    """Parse a Go duration string into integer nanoseconds.

    Kept exact (no floats) so values round-trip and overflow is caught the way
    Go catches it: the result must fit in a signed 64-bit count of nanoseconds.
    """
    orig = text
    bad = ValueError("time: invalid duration " + _quote(orig))
    s = text
    neg = False
    if s and s[0] in "+-":
        neg = s[0] == "-"
        s = s[1:]
    if s == "0":
        return 0
    if not s:
        raise bad
    total = 0
    while s:
        if not (s[0] == "." or s[0].isascii() and s[0].isdigit()):
            raise bad
        i = 0
        while i < len(s) and s[i].isascii() and s[i].isdigit():
            i += 1
        pre = i > 0
        whole = int(s[:i]) if pre else 0
        s = s[i:]
        frac = 0
        scale = 1
        post = False
        if s and s[0] == ".":
            s = s[1:]
            i = 0
            while i < len(s) and s[i].isascii() and s[i].isdigit():
                i += 1
            post = i > 0
            digits = s[:i]
            s = s[i:]
            # Go keeps fraction digits only while they fit in 63 bits.
            for d in digits:
                if frac * 10 + int(d) > _INT64_MAX:
                    break
                frac = frac * 10 + int(d)
                scale *= 10
        if not pre and not post:
            raise bad
        i = 0
        while i < len(s) and not (s[i] == "." or s[i].isascii() and s[i].isdigit()):
            i += 1
        if i == 0:
            raise ValueError("time: missing unit in duration " + _quote(orig))
        unit_name = s[:i]
        s = s[i:]
        unit = _UNITS.get(unit_name)
        if unit is None:
            raise ValueError(
                f"time: unknown unit {_quote(unit_name)} in duration {_quote(orig)}"
            )
        if whole > (1 << 63) // unit:
            raise bad
        value = whole * unit
        if frac:
            value += int(frac * (unit / scale))
            if value > 1 << 63:
                raise bad
        total += value
        if total > 1 << 63:
            raise bad
    if neg:
        return -total
    if total > _INT64_MAX:
        raise bad
    return total


def parse_duration(text: str) -> float:
    """Parse a Go duration (``300ms``, ``1m30s``, ``1.5h``, ``-2s``) into float seconds.

    Raises :class:`ValueError` for anything Go's ``time.ParseDuration`` rejects,
    including a bare number other than ``0``.
    """
    return parse_duration_ns(text) / _S


def _fmt_frac(value: int, prec: int) -> tuple[str, int]:
    """Split ``value`` at ``prec`` decimal digits; the fraction loses trailing zeros."""
    whole, frac = divmod(value, 10**prec)
    digits = str(frac).rjust(prec, "0").rstrip("0") if prec else ""
    return ("." + digits if digits else ""), whole


def format_duration_ns(ns: int) -> str:
    """Format integer nanoseconds as Go's ``Duration.String()`` does."""
    if ns == 0:
        return "0s"
    neg = ns < 0
    u = -ns if neg else ns
    if u < _S:
        if u < _US:
            frac, whole, unit = "", u, "ns"
        elif u < _MS:
            frac, whole = _fmt_frac(u, 3)
            unit = "\u00b5s"
        else:
            frac, whole = _fmt_frac(u, 6)
            unit = "ms"
        out = f"{whole}{frac}{unit}"
    else:
        frac, secs = _fmt_frac(u, 9)
        out = f"{secs % 60}{frac}s"
        mins = secs // 60
        if mins:
            out = f"{mins % 60}m{out}"
            hours = mins // 60
            if hours:
                out = f"{hours}h{out}"
    return "-" + out if neg else out


def format_duration(seconds: float) -> str:
    """Format float seconds as Go prints a duration: ``1m0s``, ``250ms``, ``0s``, ``1h0m0s``."""
    return format_duration_ns(round(seconds * _S))
