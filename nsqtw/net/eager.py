"""A TCP listener whose connections send at once when nothing is queued.

Twisted's ``transport.write`` only buffers: the bytes leave on a later
reactor turn, after ``epoll`` has reported the socket writable. For a
request/response protocol that is a full extra turn and two ``epoll_ctl``
calls per answer, which measured as a third of a one-message PUB round trip.
When the transport has nothing queued, :class:`EagerServer` calls ``send``
directly; whatever the kernel does not take goes through Twisted's normal
buffering, so ordering, producers (``pauseProducing`` on a full buffer) and
connection-loss handling are unchanged. TLS connections always take
Twisted's path (the bytes must be encrypted first).

Knowing that "nothing is queued" means reading ``FileDescriptor``'s private
buffer attributes, through :mod:`nsqtw.net.twisted_privates`.
:func:`~nsqtw.net.twisted_privates.write_buffers_understood` checks once, at
import, that they exist and behave as expected in the installed Twisted; if
not, :class:`EagerPort` hands out plain ``tcp.Server`` connections (Twisted's
normal write path, TCP_NODELAY still on) and logs why.
"""

from __future__ import annotations

import _socket
import os
import socket
from collections.abc import Callable
from typing import Any

from twisted.internet import address, defer, error, tcp
from twisted.internet.interfaces import IListeningPort, IStreamServerEndpoint
from twisted.python.failure import Failure
from zope.interface import implementer

from nsqtw.log import Logger
from nsqtw.net.twisted_privates import (
    WRITE_BUFFER_ATTRIBUTES,
    cache_port_logger,
    is_aborting,
    may_send_now,
    write_buffer_empty,
    write_buffers_understood,
    write_side_closed,
)

#: how a connection closed by its own side is reported (the reactor reports it so too)
_CONNECTION_DONE = Failure(error.ConnectionDone())


def send_now(sock: socket.socket, data: bytes) -> bytes:
    """Send ``data`` on ``sock`` at once; what it did not take, for Twisted's write to queue.

    The caller has checked that Twisted holds nothing unsent for the
    connection, so the order of the bytes is kept, and hands what comes
    back (usually ``b""``) to Twisted's ``write``. On any error (``EAGAIN``,
    or a broken connection) all of ``data`` comes back, and Twisted's own
    write then meets the error and reports it. Used by :class:`EagerServer`
    and by :func:`direct_sender`.
    """
    try:
        sent = sock.send(data)
    except OSError:
        return data
    return data[sent:] if sent < len(data) else b""


def direct_sender(transport: Any) -> Callable[[bytes], None] | None:
    """For a plain TCP transport, a ``send(data)`` that writes to the socket at once.

    As asyncio's transports do: when Twisted holds nothing unsent for the
    connection, ``data`` goes straight to the socket, and only what the
    socket does not take (or everything, on any error, which Twisted's own
    write then meets and reports) is queued with ``transport.write``; when
    Twisted holds something, ``data`` is queued behind it. The order of the
    bytes is kept either way. None for any other transport (TLS, a test's
    transport), or a Twisted whose TCP transport lacks the buffers looked at
    (read through :mod:`nsqtw.net.twisted_privates`). The client library's
    connections and a replication link's owner end use it: connections
    Twisted made; a listener's :class:`EagerServer` gets its own ``write``,
    which sends at once already and keeps its :meth:`~EagerServer.cork`.
    """
    if isinstance(transport, EagerServer):
        return transport.write if not transport.TLS else None
    if not isinstance(transport, tcp.Connection) or getattr(transport, "TLS", True):
        return None
    if not hasattr(transport, "socket") or not all(hasattr(transport, a) for a in WRITE_BUFFER_ATTRIBUTES):
        return None
    sock = transport.socket

    def send(data: bytes) -> None:
        t = transport
        if not t.connected or t.disconnecting or not may_send_now(t):
            t.write(data)
            return
        rest = send_now(sock, data)
        if rest:
            t.write(rest)

    return send


#: the most buffers one ``sendmsg`` takes (Linux's ``IOV_MAX``); more wait for Twisted's write
_IOV_MAX = 1024


def send_pieces(sock: socket.socket, pieces: list[bytes]) -> list[bytes]:
    """Send ``pieces`` at once, in one ``sendmsg`` (gathered by the kernel, never joined here);
    what it did not take, in order, for Twisted's write to queue (the caller's promise and
    the errors as in :func:`send_now`)."""
    try:
        sent = sock.sendmsg(pieces[:_IOV_MAX])
    except OSError:
        return pieces
    for i, piece in enumerate(pieces):
        if sent < len(piece):
            return [piece[sent:], *pieces[i + 1:]] if sent else pieces[i:]
        sent -= len(piece)
    return []


class EagerServer(tcp.Server):
    """A server-side connection that writes directly when its buffer is empty.

    It also turns Nagle's algorithm off, as Go does for every TCP connection:
    small answers (OK, a heartbeat) must not wait for an ACK.

    A protocol that answers in several writes (twisted.web writes a
    response's headers and its body separately) can :meth:`cork` the
    transport while it handles input and :meth:`uncork` it after: what was
    written meanwhile leaves in one ``send``. Closing flushes a cork first.
    """

    #: Twisted calls ``shutdown(2)`` before ``close``, "just to be safe" by its own comment:
    #: the socket is close-on-exec and held by this process alone, so ``close`` alone ends
    #: the connection the same way (as Go's ``Close`` does), one system call fewer per connection
    #: (a private Twisted attribute: listed in ``nsqtw.net.twisted_privates.OVERRIDDEN``)
    _shouldShutdown = False
    #: writes held by :meth:`cork` until :meth:`uncork`; None when not corked
    _corked: list[bytes] | None = None

    _no_delay = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.setTcpNoDelay(True)

    def cork(self) -> None:
        """Hold what is written from now on until :meth:`uncork`."""
        if self._corked is None:
            self._corked = []

    def uncork(self) -> None:
        """Send what was written since :meth:`cork` (in one write), and stop holding."""
        corked, self._corked = self._corked, None
        if corked:
            self.writeSequence(corked)

    def writeSequence(self, iovec: Any) -> None:
        """Several buffers: sent together in one ``sendmsg`` when they may go at once (a
        response's head and body, a consumer's MESSAGE frames in pieces), without joining them."""
        if type(iovec) is not list or not all(type(part) is bytes for part in iovec):
            super().writeSequence(iovec)  # type: ignore[no-untyped-call]
        elif self._corked is not None:
            self._corked.extend(part for part in iovec if part)
        elif len(iovec) < 2:
            for part in iovec:
                self.write(part)
        elif self._sends_now():
            rest = send_pieces(self.socket, iovec)
            if rest:
                super().writeSequence(rest)  # type: ignore[no-untyped-call]
        else:
            super().writeSequence(iovec)  # type: ignore[no-untyped-call]

    def _sends_now(self) -> bool:
        """Whether a write may go to the socket at once rather than through Twisted's buffers:
        nothing is queued (:func:`may_send_now`), no TLS, not closing, no pull producer (which
        Twisted asks for more from ``doWrite``)."""
        return bool(not self.TLS and self.connected and not self.disconnecting and may_send_now(self)
                    and (self.producer is None or self.streamingProducer))

    def setTcpNoDelay(self, enabled: bool) -> None:
        # twisted.web's HTTPChannel asks again for what __init__ set: one system call saved
        if bool(enabled) is not self._no_delay:
            super().setTcpNoDelay(enabled)
            self._no_delay = bool(enabled)

    def loseConnection(self) -> None:
        """Close once everything written is sent; with nothing queued, on the next turn.

        Twisted's way asks ``epoll`` for writability first (two ``epoll_ctl``
        calls, a turn, an empty ``send``) even when nothing is queued. Here,
        when nothing is (and no paused or pull producer waits to write more),
        reading stops and the connection closes on the next reactor turn, as
        Twisted would close it: ``connectionLost`` with ``ConnectionDone``,
        never from within this call. Bytes written in between still go out
        first, by Twisted's way.
        """
        self.uncork()
        if (self.connected and not self.disconnecting and not write_side_closed(self) and not self.TLS
                and write_buffer_empty(self)
                and (self.producer is None or (self.streamingProducer and not self.producerPaused))):
            self.stopReading()  # type: ignore[no-untyped-call]
            self.disconnecting = True
            self.reactor.callLater(0, self._close_idle)  # type: ignore[attr-defined]
            return
        super().loseConnection()  # type: ignore[no-untyped-call]

    def _close_idle(self) -> None:
        if not self.connected or is_aborting(self):  # lost or aborted meanwhile: that is reported instead
            return
        if not write_buffer_empty(self):
            # written after loseConnection: Twisted's doWrite sends it, then closes
            self.startWriting()  # type: ignore[no-untyped-call]
            return
        self.connectionLost(_CONNECTION_DONE)

    def loseWriteConnection(self) -> None:
        self.uncork()
        super().loseWriteConnection()  # type: ignore[no-untyped-call]

    def abortConnection(self) -> None:
        self._corked = None
        super().abortConnection()  # type: ignore[no-untyped-call]

    def write(self, data: bytes) -> None:
        if self._corked is not None and type(data) is bytes:
            if data:
                self._corked.append(data)
            return
        if type(data) is not bytes or not data or not self._sends_now():
            super().write(data)  # type: ignore[no-untyped-call]
            return
        rest = send_now(self.socket, data)
        if rest:
            super().write(rest)  # type: ignore[no-untyped-call]


class _NoDelayServer(tcp.Server):
    """The fallback connection: Twisted's own write path, Nagle off as Go does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.setTcpNoDelay(True)


#: decided once: the eager connection when Twisted's buffers are as expected, else the fallback
SERVER_CLASS: type[tcp.Server] = EagerServer if write_buffers_understood() else _NoDelayServer


_raw_family = _socket.socket.family.__get__
_raw_type = _socket.socket.type.__get__


class AcceptSocket(socket.socket):
    """A listening socket whose ``accept`` skips two enum conversions.

    ``socket.socket.accept`` reads ``self.family`` and ``self.type``, each
    turned into an ``IntEnum`` member through ``EnumType.__call__``, only to
    pass them on as numbers: a tenth of the Python time of accepting a
    connection. This passes the numbers; the socket returned is the same.
    """

    __slots__ = ()

    def accept(self) -> tuple[socket.socket, Any]:
        fd, addr = self._accept()  # type: ignore[attr-defined]
        sock = socket.socket(_raw_family(self), _raw_type(self), self.proto, fileno=fd)
        if socket.getdefaulttimeout() is None and self.gettimeout():
            sock.setblocking(True)
        return sock, addr


class EagerPort(tcp.Port):
    """A listening port that accepts through :class:`AcceptSocket` and hands out :data:`SERVER_CLASS`."""

    transport = SERVER_CLASS

    def createInternetSocket(self) -> socket.socket:
        made = super().createInternetSocket()  # type: ignore[no-untyped-call]
        sock = AcceptSocket(made.family, made.type, made.proto, made.detach())
        sock.setblocking(False)  # as Twisted made it (a socket made from a descriptor takes the default)
        return sock

    def startListening(self) -> None:
        super().startListening()
        cache_port_logger(self)


def adopt_connection(reactor: Any, fd: int, factory: Any, sessionno: int = 0) -> tcp.Server | None:
    """A connected TCP socket accepted by another process (``--workers``: handed over by the core),
    served here as the listener's own connections are: a :data:`SERVER_CLASS` transport.

    What ``reactor.adoptStreamConnection`` does, with nsqtw's connection class
    rather than Twisted's plain ``tcp.Server``: the descriptor is duplicated
    (the caller closes ``fd``), the protocol built from the peer's address,
    and the connection made. None when the peer is gone already or the
    factory refused it (the socket is closed then).
    """
    sock = socket.socket(fileno=os.dup(fd))  # its family read from the socket
    sock.setblocking(False)
    family = sock.family
    try:
        peer = sock.getpeername()
        local_port = sock.getsockname()[1]
    except OSError:
        sock.close()
        return None
    kind = address.IPv6Address if family == socket.AF_INET6 else address.IPv4Address
    protocol = factory.buildProtocol(kind("TCP", *peer[:2]))
    if protocol is None:
        sock.close()
        return None
    conn = SERVER_CLASS(sock, protocol, peer, None, sessionno, reactor)  # type: ignore[arg-type]
    conn.repstr = f"<{type(protocol).__name__} #{sessionno} on {local_port}>"
    protocol.makeConnection(conn)
    return conn


@implementer(IStreamServerEndpoint)
class EagerTCPServerEndpoint:
    """Like ``TCP4ServerEndpoint``/``TCP6ServerEndpoint`` (by the interface), with :class:`EagerServer`."""

    def __init__(self, reactor: Any, port: int, backlog: int = 50, interface: str = "") -> None:
        self.reactor = reactor
        self.port = port
        self.backlog = backlog
        self.interface = interface

    def listen(self, factory: Any) -> defer.Deferred[IListeningPort]:
        return defer.execute(self._listen, factory)

    log = Logger()

    def _listen(self, factory: Any) -> IListeningPort:
        if SERVER_CLASS is not EagerServer:
            self.log.warn("TCP: this Twisted keeps its write buffers differently than nsqtw expects"
                          " ({attributes}); using Twisted's normal write path",
                          attributes=", ".join(WRITE_BUFFER_ATTRIBUTES))
        port = self._make_port(factory)
        port.startListening()
        return port

    def _make_port(self, factory: Any) -> EagerPort:
        """The port, not yet listening."""
        return EagerPort(self.port, factory, self.backlog, self.interface, self.reactor)
