"""The HTTP/1.1 connection nsqd's and nsqlookupd's listeners speak: twisted.web's parser held to Go's limits.

Request line plus headers are bounded as Go's net/http bounds them (1 MiB,
answered 431); a malformed request gets Go's 400 text; a raw non-ASCII
request target is accepted as Go accepts it; a body far past its route's
limit is not read to its end. A plain ``GET`` of a direct route (``/ping``)
is answered here without twisted.web's ``Request`` (:mod:`nsqtw.http.direct`).
The API it serves is known only through :class:`nsqtw.interfaces.IHTTPAPI`,
so this module and :mod:`nsqtw.http.server` sit under :mod:`nsqtw.http.base`.
"""

from __future__ import annotations

from typing import Any

from twisted.python.failure import Failure
from twisted.web.http import HTTPChannel

from nsqtw.http.direct import MAX_DIRECT_HEAD, DirectRequest, parse_simple_get
from nsqtw.interfaces import IHTTPAPI
from nsqtw.net.twisted_privates import (
    drop_transfer_decoder,
    handling_request,
    on_request_line,
    received_header_size,
    transfer_decoder,
    waiting_for_transport,
)

__all__ = ["DIRECT_PER_TURN", "DISCARD_LIMIT", "MAX_HEADER_BYTES", "RST_AVOIDANCE_DELAY", "GoHTTPChannel"]


#: Go's net/http reads at most this much request line and headers (DefaultMaxHeaderBytes
#: plus the 4 KiB its reader allows on top)
MAX_HEADER_BYTES = (1 << 20) + 4096
#: after answering, Go's server reads and discards up to this much of an unread body to
#: keep the connection; past it, it closes the connection instead
DISCARD_LIMIT = 256 * 1024
#: how long Go's server keeps reading (and dropping) a cut-off upload after its answer
RST_AVOIDANCE_DELAY = 0.5
#: pipelined plain GETs of direct routes answered on one connection per reactor turn
DIRECT_PER_TURN = 16
_GO_ERROR_HEADERS = b"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
_TOO_LARGE = b"HTTP/1.1 431 Request Header Fields Too Large" + _GO_ERROR_HEADERS + \
    b"431 Request Header Fields Too Large"
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request" + _GO_ERROR_HEADERS + b"400 Bad Request"


def _escape_target(line: bytes) -> bytes:
    """Percent-encode the raw non-ASCII bytes of a request line's target.

    Go's server takes such a target as it is (and its query parser keeps
    the bytes); twisted.web refuses it with 400. ``%XX`` decodes to the
    same bytes, so routing and query parsing see what Go sees.
    """
    method, sep, rest = line.partition(b" ")
    target, sep2, version = rest.rpartition(b" ")
    if not sep or not sep2:
        return line
    escaped = b"".join(b"%%%02X" % c if c >= 0x80 else bytes((c,)) for c in target)
    return method + b" " + escaped + b" " + version


class GoHTTPChannel(HTTPChannel):
    """twisted.web's HTTP/1.1 parser held to Go net/http's limits and answers.

    Request line plus headers may take :data:`MAX_HEADER_BYTES` (twisted's
    default stops at 16 KiB and 500 headers and hangs up without a word);
    past that the answer is Go's 431, and a malformed request gets Go's 400
    text. A body streamed far past its route's limit stops being read: the
    request runs on what was kept and the connection closes after the
    answer (Go's "413 and close", not a drain of an endless upload).

    The overrides read twisted.web internals (the body decoder, the
    first-line flag, the header byte count) through
    :mod:`nsqtw.net.twisted_privates`, and override its private
    ``_respondToBadRequestAndDisconnect``; ``tests/unit/test_twisted_privates.py``
    fails if a Twisted release changes them.
    """

    MAX_LENGTH = MAX_HEADER_BYTES
    totalHeadersSize = MAX_HEADER_BYTES
    #: Go limits the bytes of the headers, not their number
    maxHeaders = MAX_HEADER_BYTES
    _refused = False
    _cut_off = False
    #: nothing has reached twisted.web's parser on this connection yet: a plain GET of a
    #: direct route may be answered without it (:meth:`_answer_directly`)
    _pristine = True
    #: the start of a pipelined request not yet answered directly: a head cut between reads,
    #: or the requests past this turn's :data:`DIRECT_PER_TURN`
    _direct_buffer = b""
    _direct_call: Any = None
    _closing_call: Any = None
    #: the protocol this connection was switched to by an ``Upgrade`` (:meth:`_upgrade`), else None
    _upgraded: Any = None
    callLater: Any  # set by HTTPFactory.buildProtocol

    def cut_off(self) -> None:
        """Read no more from this connection: the request is answered without the rest of it.

        The transport stops reading (as twisted pauses a client that sends
        ahead), and whatever was already read is dropped; the answer still
        goes out, then the connection closes (``persistent`` is false).
        """
        self._cut_off = True
        self.transport.pauseProducing()  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        if self._upgraded is not None:
            self._upgraded.dataReceived(data)
            return
        if self._cut_off:
            return
        # the answers made while this input is handled (twisted.web writes a response's
        # head and body separately) leave in one send (nsqtw.net.eager)
        transport: Any = self.transport
        cork = getattr(transport, "cork", None)
        if cork is not None:
            cork()
        try:
            if self._pristine:
                self._direct_input(data)
            else:
                super().dataReceived(data)  # type: ignore[no-untyped-call]
        finally:
            if cork is not None:
                transport.uncork()

    def _direct_input(self, data: bytes) -> None:
        """Answer the plain GETs of direct routes the input starts with, :data:`DIRECT_PER_TURN` a turn.

        Pipelined requests (a client sending many without waiting) are
        answered in order, each without twisted.web (:meth:`_answer_directly`);
        past :data:`DIRECT_PER_TURN` the connection stops reading and the
        rest waits for the next reactor turn. A head cut between reads waits
        for its end. From the first request that is not a plain GET of a
        direct route on, everything goes to twisted.web, as it arrived.
        """
        buf = self._direct_buffer + data if self._direct_buffer else data
        self._direct_buffer = b""
        pos = 0
        answered = 0
        size = len(buf)
        while pos < size:
            end = buf.find(b"\r\n\r\n", pos)
            if end < 0:
                rest = buf[pos:]
                if len(rest) <= MAX_DIRECT_HEAD and (rest.startswith(b"GET /") or b"GET /".startswith(rest)):
                    self.resetTimeout()  # type: ignore[no-untyped-call]
                    self._direct_buffer = rest  # the rest of a head still to come
                    return
                break
            if pos == 0 and self._upgrade(buf[:end + 4], buf[end + 4:]):
                return
            if answered == DIRECT_PER_TURN:
                self._direct_buffer = buf[pos:]
                self._direct_later()
                return
            if not self._answer_directly(buf[pos:end + 4]):
                break
            answered += 1
            pos = end + 4
            if not self._pristine:
                return  # answered and closing: what follows is dropped, as twisted.web drops it
        if pos < size:
            self._pristine = False
            super().dataReceived(buf[pos:])  # type: ignore[no-untyped-call]

    def _upgrade(self, head: bytes, rest: bytes) -> bool:
        """Switch the connection to the protocol the API gives for this request's ``Upgrade``.

        The API's ``upgrade(head)``, when it has one (nsqd's only with
        ``--replicas=2``: an API without one costs a request nothing here),
        returns None to let twisted.web answer the request as any other, or,
        for a request it checked asks for its ``Upgrade``, a callable that
        makes the new protocol on this transport once the ``101 Switching
        Protocols`` is written, and the header lines that answer carries
        besides (the link's nonce). From then on every byte read goes to that
        protocol, and this channel's timeout and producer are out of its way.
        """
        api = getattr(getattr(self, "factory", None), "api", None)
        upgrade = getattr(api, "upgrade", None)
        if upgrade is None:
            return False
        upgraded = upgrade(head)
        if upgraded is None:
            return False
        make, extra = upgraded
        self._pristine = False
        self.setTimeout(None)  # type: ignore[no-untyped-call]
        transport: Any = self.transport
        token = head.lower().split(b"\r\nupgrade:", 1)[1].split(b"\r\n", 1)[0].strip()
        transport.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: "
                        + token + b"\r\n" + b"".join(line + b"\r\n" for line in extra) + b"\r\n")
        transport.unregisterProducer()
        self._upgraded = make(transport)
        if rest:
            self._upgraded.dataReceived(rest)
        return True

    def _direct_later(self) -> None:
        """Read nothing more until the next reactor turn, then go on with the buffered requests."""
        self.transport.pauseProducing()  # type: ignore[union-attr]
        self._direct_call = self.callLater(0, self._direct_next)

    def _direct_next(self) -> None:
        self._direct_call = None
        if waiting_for_transport(self):
            return  # the client is not reading its answers: go on when it does (resumeProducing)
        self.transport.resumeProducing()  # type: ignore[union-attr]
        self.dataReceived(b"")

    def resumeProducing(self) -> None:
        super().resumeProducing()  # type: ignore[no-untyped-call]
        if self._pristine and self._direct_buffer and self._direct_call is None and not self._cut_off:
            self._direct_later()

    def _answer_directly(self, data: bytes) -> bool:
        """Answer a plain GET of a direct route without twisted.web's Request (:mod:`nsqtw.http.direct`)."""
        api = getattr(getattr(self, "factory", None), "api", None)
        if not IHTTPAPI.providedBy(api) or not api.direct_routes or (api.tls_required and not api.tls_enabled):
            return False  # TLS_REQUIRED is _Root's answer to give
        simple = parse_simple_get(data, api.direct_routes)
        if simple is None:
            return False
        self.resetTimeout()  # type: ignore[no-untyped-call]
        request = DirectRequest(self, simple)
        request.answer(getattr(api, api.direct_routes[simple.target])(request))
        if not simple.persistent:
            self._pristine = False
            self.loseConnection()
        return True

    def loseConnection(self) -> None:
        """Close; after a cut-off body, first let the client read the answer, as Go does.

        Closing a socket with unread input makes the kernel send a reset,
        which can destroy the answer before the client reads it. Go's server
        half-closes, discards input for up to :data:`RST_AVOIDANCE_DELAY`,
        then closes; so does this.
        """
        half_close = getattr(self.transport, "loseWriteConnection", None)
        if not self._cut_off or half_close is None or self._closing_call is not None:
            super().loseConnection()  # type: ignore[no-untyped-call]
            return
        transport: Any = self.transport
        transport.unregisterProducer()
        half_close()
        transport.resumeProducing()
        self._closing_call = self.callLater(RST_AVOIDANCE_DELAY, transport.loseConnection)

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        if self._closing_call is not None and self._closing_call.active():
            self._closing_call.cancel()
        if self._direct_call is not None and self._direct_call.active():
            self._direct_call.cancel()
        if self._upgraded is not None:
            self._upgraded.connectionLost(reason)
        super().connectionLost(reason)  # type: ignore[no-untyped-call]

    def lineReceived(self, line: bytes) -> None:
        if received_header_size(self) + len(line) > self.totalHeadersSize:
            self._refuse(_TOO_LARGE)
            return
        if on_request_line(self) and not line.isascii():
            line = _escape_target(line)
        super().lineReceived(line)  # type: ignore[no-untyped-call]

    def lineLengthExceeded(self, line: bytes) -> None:
        self._refuse(_TOO_LARGE)

    def _respondToBadRequestAndDisconnect(self) -> None:
        self._refuse(_BAD_REQUEST)

    def _refuse(self, answer: bytes) -> None:
        if not self._refused and not handling_request(self):
            self._refused = True
            self.transport.write(answer)  # type: ignore[union-attr]
        self.loseConnection()

    def rawDataReceived(self, data: bytes) -> None:
        super().rawDataReceived(data)
        request = self.requests[-1] if self.requests else None
        if transfer_decoder(self) is not None and getattr(request, "over_limit", False):  # a BoundedRequest's
            drop_transfer_decoder(self)
            self.persistent = False
            self.cut_off()
            self.allContentReceived()  # type: ignore[no-untyped-call]
