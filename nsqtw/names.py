"""Topic and channel names: nsqd's validity rules and backend file names."""

from __future__ import annotations

import re

MAX_NAME_LENGTH = 64
EPHEMERAL_SUFFIX = "#ephemeral"

_VALID = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?")


def is_valid_name(name: str) -> bool:
    """nsqd's rule for both topics and channels: 1-64 chars, [.a-zA-Z0-9_-], optional #ephemeral."""
    return 0 < len(name) <= MAX_NAME_LENGTH and _VALID.fullmatch(name) is not None


is_valid_topic_name = is_valid_name
is_valid_channel_name = is_valid_name


def is_ephemeral(name: str) -> bool:
    return name.endswith(EPHEMERAL_SUFFIX)


def backend_name(topic: str, channel: str | None = None) -> str:
    """The diskqueue name nsqd uses: ``topic`` or ``topic:channel``."""
    if channel is None:
        return topic
    return f"{topic}:{channel}"


def go_quote(value: str | bytes) -> str:
    """Quote like Go's ``%q`` (used in nsqd's error texts)."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")
    out = ['"']
    escapes = {"\a": r"\a", "\b": r"\b", "\f": r"\f", "\n": r"\n", "\r": r"\r",
               "\t": r"\t", "\v": r"\v", "\\": r"\\", '"': r"\""}
    for ch in value:
        code = ord(ch)
        if ch in escapes:
            out.append(escapes[ch])
        elif 0xDC80 <= code <= 0xDCFF:  # an undecodable byte
            out.append(f"\\x{code - 0xDC00:02x}")
        elif ch.isprintable():
            out.append(ch)
        elif code < 0x80:
            out.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)
