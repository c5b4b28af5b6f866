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
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer, tcp
from twisted.internet.interfaces import IListeningPort, IStreamServerEndpoint
from zope.interface import implementer


class EagerServer(tcp.Server):
    """A server-side connection that writes directly when its buffer is empty.

    It also turns Nagle's algorithm off, as Go does for every TCP connection:
    small answers (OK, a heartbeat) must not wait for an ACK.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.setTcpNoDelay(True)

    def write(self, data: bytes) -> None:
        # Twisted's own buffers (FileDescriptor internals, read here as a subclass):
        # if anything is queued, or TLS is on, or the connection is closing, append.
        if (self.TLS or self._tempDataLen or self.offset != len(self.dataBuffer)
                or not self.connected or self.disconnecting or self._writeDisconnected
                or type(data) is not bytes or not data):
            super().write(data)
            return
        try:
            sent = self.socket.send(data)
        except BlockingIOError:
            sent = 0
        except OSError:
            # Let Twisted's write path find the broken connection and report it.
            super().write(data)
            return
        if sent < len(data):
            super().write(data[sent:] if sent else data)


class EagerPort(tcp.Port):
    transport = EagerServer


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

    def _listen(self, factory: Any) -> IListeningPort:
        port = EagerPort(self.port, factory, self.backlog, self.interface, self.reactor)
        port.startListening()
        return port

