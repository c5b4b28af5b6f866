"""Sans-IO pieces of the lookup V1 protocol, for both ends of the connection.

nsqd opens with the magic ``"  V1"`` and then sends text lines
(``PING``, ``REGISTER topic [channel]``, ``UNREGISTER topic [channel]``) and
``IDENTIFY\\n`` followed by a 4-byte big-endian size and a JSON body.
nsqlookupd answers every command with ``[4-byte size][data]``: ``OK``, the
IDENTIFY JSON, or an error text (after which it hangs up). Unlike V2 there is
no frame type.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from nsqtw.errors import fatal
from nsqtw.protocol.wire import MAX_LINE_LENGTH, LineTooLong

__all__ = ["MAGIC_V1", "MAX_IDENTIFY_BODY", "Body", "Line", "LineTooLong", "ResponseReader",
           "V1Parser", "encode_command", "encode_response", "identify"]

MAGIC_V1 = b"  V1"
#: nsqlookupd reads any IDENTIFY size it is sent (a negative one crashes it);
#: nsqd's IDENTIFY is a few hundred bytes, so anything past this is refused.
MAX_IDENTIFY_BODY = 1024 * 1024

_INT32 = struct.Struct(">i")
_WHITESPACE = " \t\n\v\f\r\x85\xa0"


class Line(NamedTuple):
    """A command line, split on single spaces after trimming (as nsqlookupd does)."""

    params: list[str]


class Body(NamedTuple):
    """The IDENTIFY body that followed a line the caller asked a body for."""

    data: bytes


class V1Parser:
    """Server side: bytes in (after the magic), :class:`Line` and :class:`Body` events out.

    A body is read only when the caller asks for one with :meth:`expect_body`
    after seeing an ``IDENTIFY`` line, since nsqlookupd decides that from
    the connection's state (a second IDENTIFY is refused before its body).
    """

    def __init__(self) -> None:
        self._buf = bytearray()
        self._want_body = False

    def feed(self, data: bytes) -> None:
        self._buf += data

    def expect_body(self) -> None:
        self._want_body = True

    def next_event(self) -> Line | Body | None:
        """The next line or body, None until more bytes arrive.

        Raises :class:`LineTooLong` for a line past nsqd's 16 KiB and a fatal
        ``E_BAD_BODY`` for an IDENTIFY size that is negative or too large.
        """
        buf = self._buf
        if self._want_body:
            if len(buf) < 4:
                return None
            (size,) = _INT32.unpack_from(buf, 0)
            if not 0 <= size <= MAX_IDENTIFY_BODY:
                raise fatal("E_BAD_BODY", "IDENTIFY failed to read body size")
            if len(buf) < 4 + size:
                return None
            data = bytes(buf[4:4 + size])
            del buf[:4 + size]
            self._want_body = False
            return Body(data)
        nl = buf.find(b"\n")
        if nl < 0:
            if len(buf) > MAX_LINE_LENGTH:
                raise LineTooLong()
            return None
        if nl >= MAX_LINE_LENGTH:
            raise LineTooLong()
        text = bytes(buf[:nl]).decode("utf-8", "surrogateescape")
        del buf[:nl + 1]
        return Line(text.strip(_WHITESPACE).split(" "))


def encode_response(data: bytes) -> bytes:
    """One nsqlookupd response: size prefix and data."""
    return _INT32.pack(len(data)) + data


def encode_command(name: str, *params: str) -> bytes:
    """A V1 text command as go-nsq writes it (empty parameters left out)."""
    parts = [name, *(p for p in params if p)]
    return " ".join(parts).encode("utf-8", "surrogateescape") + b"\n"


def identify(body: bytes) -> bytes:
    return b"IDENTIFY\n" + _INT32.pack(len(body)) + body


class ResponseReader:
    """Client side: splits nsqlookupd's responses; refuses sizes past ``max_size`` (as nsqd)."""

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._buf = bytearray()

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_response(self) -> bytes | None:
        """The next response, None until it is complete; ValueError for a bad size."""
        buf = self._buf
        if len(buf) < 4:
            return None
        (size,) = _INT32.unpack_from(buf, 0)
        if size < 0 or size > self.max_size:
            raise ValueError(f"response body size ({size}) is greater than limit ({self.max_size})")
        if len(buf) < 4 + size:
            return None
        data = bytes(buf[4:4 + size])
        del buf[:4 + size]
        return data
