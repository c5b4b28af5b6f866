"""Direct routes answered without twisted.web's Request: a health check at the cost of a line or two.

A load balancer checks ``GET /ping`` on a new connection every few seconds,
and tools poll it in loops. twisted.web spends about a hundred microseconds
of Python on each (the line-by-line parser, a ``Request`` with two header
tables, resource lookup, rendering, ``finish``): more than half of what a
connect/``/ping``/close cycle cost nsqtw, which made HTTP churn cost twice
Go's CPU.

:func:`parse_simple_get` recognizes the plain case only: the first bytes a
channel receives (or the first after an answer this way) are exactly one
``GET`` of a direct route (``GoHTTPAPI.direct_routes``: a fixed path, no
query), HTTP/1.0 or 1.1, with well-formed headers and no body, Expect or
Transfer-Encoding. Anything else, or anything unusual about it, returns
None and twisted.web handles it as before. The handler is the route's own,
given a :class:`DirectRequest`, and the answer is written with twisted.web's
own ``writeHeaders`` with the headers in the order its Request would have
set them, so the bytes are the same either way
(``tests/unit/test_http_api.py::DirectRouteTests`` compares the two paths
on every variant).
"""

from __future__ import annotations

import re
import time
from typing import Any

from twisted.web.http import RESPONSES, datetimeToString
from twisted.web.http_headers import Headers

__all__ = ["DirectRequest", "SimpleGet", "parse_simple_get"]

#: a request head larger than this goes twisted.web's way
MAX_DIRECT_HEAD = 8192
#: one header line as twisted.web reads it without complaint: a token, a colon, printable ASCII
_HEADER = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[\t -~]*")
#: headers that give a request a body or a protocol step the plain case does not take
_NOT_SIMPLE = frozenset((b"content-length", b"transfer-encoding", b"expect", b"upgrade"))


class SimpleGet:
    """A plain GET of a direct route: what twisted.web would have made of it."""

    __slots__ = ("target", "version", "persistent")

    def __init__(self, target: bytes, version: bytes, persistent: bool) -> None:
        self.target = target
        self.version = version
        #: twisted.web's ``HTTPChannel.checkPersistence``: HTTP/1.1 unless ``close``; never 1.0
        self.persistent = persistent


def parse_simple_get(data: bytes, routes: dict[bytes, str]) -> SimpleGet | None:
    """``data`` as one plain GET of a path in ``routes``, or None for anything else."""
    if (len(data) > MAX_DIRECT_HEAD or not data.startswith(b"GET /") or not data.endswith(b"\r\n\r\n")
            or not data.isascii()):
        return None
    head = data[:-4]
    unbroken = head.replace(b"\r\n", b"")
    if b"\n" in unbroken or b"\r" in unbroken:
        return None  # a bare CR or LF
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ")
    if len(parts) != 3 or parts[1] not in routes or parts[2] not in (b"HTTP/1.1", b"HTTP/1.0"):
        return None
    connection: bytes | None = None
    for line in lines[1:]:
        if not _HEADER.fullmatch(line):
            return None  # empty (a second request), folded, or malformed: twisted.web answers it
        name, _, value = line.partition(b":")
        name = name.lower()
        if name in _NOT_SIMPLE:
            return None
        if name == b"connection" and connection is None:
            connection = value.strip(b" \t")
    version = parts[2]
    # as twisted.web decides (the first Connection header, split on spaces): HTTP/1.1 stays
    # open unless it says close, HTTP/1.0 never does
    tokens = [t.lower() for t in connection.split(b" ")] if connection else []
    return SimpleGet(parts[1], version, version == b"HTTP/1.1" and b"close" not in tokens)


_date_cache: tuple[int, bytes] = (0, b"")


def _date() -> bytes:
    """twisted.web's ``Date`` value, formatted once a second."""
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, datetimeToString(now))
    return _date_cache[1]


class DirectRequest:
    """What a direct route's handler uses of a twisted.web ``Request``, and no more.

    The handler sets the code and headers and returns the body; the headers
    keep twisted.web's order and spelling (a ``Headers`` table, which also
    writes names as twisted.web does), preceded by what twisted.web's
    Request sets before rendering: ``Connection: close`` when the
    connection will close after an HTTP/1.1 answer, then ``Date``.
    """

    method = b"GET"
    defaultContentType: bytes | None = None

    def __init__(self, channel: Any, request: SimpleGet) -> None:
        self.channel = channel
        self.uri = self.path = request.target
        self.clientproto = request.version
        self.code = 200
        self.responseHeaders = Headers()
        if request.version == b"HTTP/1.1" and not request.persistent:
            self.responseHeaders.setRawHeaders(b"Connection", [b"close"])
        self.responseHeaders.setRawHeaders(b"Date", [_date()])

    def setResponseCode(self, code: int) -> None:
        self.code = code

    def setHeader(self, name: bytes, value: bytes) -> None:
        self.responseHeaders.setRawHeaders(name, [value])

    def getClientAddress(self) -> Any:
        # asked for every answer's log line; a pipelining client asks thousands of times
        channel = self.channel
        peer = getattr(channel, "_direct_peer", None)
        if peer is None:
            peer = channel._direct_peer = channel.transport.getPeer()
        return peer

    def answer(self, body: bytes) -> None:
        """Write the status line, headers and ``body`` as twisted.web's Request writes them."""
        self.channel.writeHeaders(self.clientproto, b"%d" % self.code, RESPONSES.get(self.code, b"Unknown Status"),
                                  self.responseHeaders)
        if body:
            self.channel.write(body)
