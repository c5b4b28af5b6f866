"""Go's ``url.ParseQuery`` and ``url.QueryUnescape``, as nsqd's and nsqlookupd's handlers read queries.

Go skips a malformed pair and still parses the rest; handlers then answer
``INVALID_REQUEST``, so the "was anything malformed" flag travels with the values.
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

__all__ = ["parse_query", "query_unescape"]


def query_unescape(text: str) -> str:
    """Go's ``url.QueryUnescape``: ``+`` is a space; a bad ``%`` escape is an error."""
    if "%" in text:
        i = text.find("%")
        while i != -1:
            pair = text[i + 1:i + 3]
            if len(pair) != 2 or any(c not in "0123456789abcdefABCDEF" for c in pair):
                raise ValueError("invalid URL escape")
            i = text.find("%", i + 3)
    raw = unquote_to_bytes(text.replace("+", " "))
    return raw.decode("utf-8", "surrogateescape")


def parse_query(raw: str) -> tuple[dict[str, list[str]], bool]:
    """Go's ``url.ParseQuery``: the values, and whether any part was malformed.

    Like Go, a malformed pair (bad escape, ``;`` separator) is skipped and the
    rest is still parsed.
    """
    values: dict[str, list[str]] = {}
    bad = False
    for pair in raw.split("&"):
        if ";" in pair:
            bad = True
            continue
        if not pair:
            continue
        key, _, value = pair.partition("=")
        try:
            key = query_unescape(key)
            value = query_unescape(value)
        except ValueError:
            bad = True
            continue
        values.setdefault(key, []).append(value)
    return values, bad
