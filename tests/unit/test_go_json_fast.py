"""go_dumps (json.dumps and Go's escapes fixed in) writes exactly what the exact encoder writes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nsqtw._go import json as go

#: characters that matter: Go's escapes, json.dumps's \b and \f, backslashes next to b/f,
#: quotes, controls, line separators, undecodable bytes (surrogateescape), astral planes
_CHARS = list("ab\\\"<>&\b\f\n\r\t\x00\x1f\x7f\u2028\u2029\udc80\udcff\u00e9\U0001f600")
_TEXT = st.text(alphabet=st.sampled_from(_CHARS), max_size=30) | st.text(max_size=30)
_FLOATS = st.floats(allow_nan=False, allow_infinity=False)
_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64) | _FLOATS | _TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(_TEXT, inner, max_size=5),
    max_leaves=25)


def exact(value) -> bytes:
    out: list[str] = []
    go._encode(value, out)
    return "".join(out).encode("utf-8")


@settings(max_examples=400, deadline=None)
@given(_VALUES)
def test_fast_encoding_is_the_exact_one(value) -> None:
    assert go.go_json(value) == exact(value)


def test_escaped_backslash_before_b_is_not_a_backspace() -> None:
    """``\\\\b`` in json.dumps's output is a backslash then ``b``: it stays as it is."""
    assert go.go_json("\\b\b") == b'"\\\\b\\u0008"'
    assert go.go_json({"<k>": "a&b\u2028\udcff"}) == b'{"\\u003ck\\u003e":"a\\u0026b\\u2028\\ufffd"}'


def test_floats_as_go_writes_them() -> None:
    assert go.go_json([1.0, 0.5, 1234567.0, 1e-7, 1e21, 0.99, -0.0]) == b"[1,0.5,1234567,1e-7,1e+21,0.99,-0]"
