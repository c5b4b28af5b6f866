"""nsqd's HTTPS listener factory: TLS from the first byte, plain HTTP answered as Go does.

Apart from :mod:`nsqtw.net.tls` because ``twisted.protocols.tls`` imports
pyOpenSSL: only a node started with ``--tls-cert``/``--tls-key`` imports
this module (``docs/performance.md``, Memory).
"""

from __future__ import annotations

from twisted.protocols.tls import BufferingTLSTransport, TLSMemoryBIOFactory

__all__ = ["HTTPSFactory"]

#: Go's crypto/tls calls a first record with these five bytes an HTTP request
_HTTP_HEADS = (b"GET /", b"HEAD ", b"POST ", b"PUT /", b"OPTIO")
_PLAIN_HTTP_ANSWER = b"HTTP/1.0 400 Bad Request\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"


class _PlainHTTPAnsweringTLS(BufferingTLSTransport):
    """TLS that answers a plain HTTP request as Go's HTTPS server does, not with silence.

    The first five bytes are looked at before OpenSSL sees them: Go's
    net/http recognises the start of an HTTP request there and answers 400
    "Client sent an HTTP request to an HTTPS server." in plain text.
    """

    _head = b""
    _sniffing = True

    def dataReceived(self, data: bytes) -> None:
        if self._sniffing:
            head = self._head + data
            if len(head) < 5 and any(h.startswith(head) for h in _HTTP_HEADS):
                self._head = head
                return
            self._sniffing = False
            self._head = b""
            if head[:5] in _HTTP_HEADS:
                self.transport.write(_PLAIN_HTTP_ANSWER)  # type: ignore[union-attr]
                self.transport.loseConnection()  # type: ignore[union-attr]
                return
            data = head
        super().dataReceived(data)  # type: ignore[no-untyped-call]


class HTTPSFactory(TLSMemoryBIOFactory):
    """nsqd's HTTPS listener: TLS from the first byte, plain HTTP answered with Go's 400."""

    protocol = _PlainHTTPAnsweringTLS
