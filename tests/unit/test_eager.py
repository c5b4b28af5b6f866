"""The eager V2 transport's reliance on Twisted's private write buffers, and its fallback."""

from __future__ import annotations

from twisted.internet import abstract
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.net import eager


class TwistedBuffersTests(SynchronousTestCase):
    def test_installed_twisted_is_understood(self) -> None:
        """The installed Twisted keeps FileDescriptor's buffers as EagerServer reads them.

        If this fails, a Twisted release renamed or changed ``_tempDataLen``,
        ``offset``, ``dataBuffer`` or ``_writeDisconnected``: nsqtw still works
        (it falls back to Twisted's write path) but loses the eager send.
        """
        self.assertTrue(eager.twisted_buffers_understood(),
                        f"Twisted changed {eager.PRIVATE_ATTRIBUTES}: see nsqtw/net/eager.py")
        self.assertIs(eager.SERVER_CLASS, eager.EagerServer)
        self.assertIs(eager.EagerPort.transport, eager.EagerServer)

    def test_missing_attribute_is_detected(self) -> None:
        """A FileDescriptor without one of the attributes is not trusted."""

        class Renamed(abstract.FileDescriptor):
            def __init__(self, reactor: object = None) -> None:
                super().__init__(reactor)  # type: ignore[arg-type]
                del self._tempDataLen

        self.assertFalse(eager.twisted_buffers_understood(Renamed))

    def test_changed_meaning_is_detected(self) -> None:
        """A FileDescriptor whose buffered write does not show in ``_tempDataLen`` is not trusted."""

        class Different(abstract.FileDescriptor):
            def write(self, data: bytes) -> None:
                self.dataBuffer = data  # flushes differently: the counters mean something else

        self.assertFalse(eager.twisted_buffers_understood(Different))


class AcceptTests(SynchronousTestCase):
    """speed_up_accepts: the same accepted sockets and connections, fewer Python steps."""

    def test_accept_socket_returns_what_socket_accept_does(self) -> None:
        import socket

        for family, host in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
            accepted = []
            for cls in (socket.socket, eager.AcceptSocket):
                listener = cls(family, socket.SOCK_STREAM)
                self.addCleanup(listener.close)
                try:
                    listener.bind((host, 0))
                except OSError:  # no IPv6 loopback here
                    break
                listener.listen()
                listener.setblocking(False)
                client = socket.create_connection(listener.getsockname()[:2])
                self.addCleanup(client.close)
                sock, addr = listener.accept()
                self.addCleanup(sock.close)
                self.assertIs(type(sock), socket.socket)
                self.assertEqual(addr[:2], client.getsockname()[:2])
                accepted.append((sock.family, sock.type, sock.proto, sock.gettimeout(), sock.get_inheritable()))
            if len(accepted) == 2:
                self.assertEqual(accepted[0], accepted[1])
                self.assertIsInstance(accepted[1][0], socket.AddressFamily)

    def test_a_listening_port_is_sped_up_and_still_accepts(self) -> None:
        import socket

        from twisted.internet import tcp
        from twisted.internet.protocol import Protocol, ServerFactory
        from twisted.internet.testing import MemoryReactor

        made: list[Protocol] = []

        class Factory(ServerFactory):
            def buildProtocol(self, addr: object) -> Protocol:
                made.append(Protocol())
                return made[-1]

        port = tcp.Port(0, Factory(), interface="127.0.0.1", reactor=MemoryReactor())
        port.startListening()
        self.addCleanup(port.socket.close)
        eager.speed_up_accepts(port)
        self.assertIs(type(port.socket), eager.AcceptSocket)
        self.assertIs(port._logger, port._logger)  # made once, not per access
        self.assertEqual(port._logger.namespace, tcp.Port._logger.__get__(port, tcp.Port).namespace)
        client = socket.create_connection(("127.0.0.1", port.getHost().port))
        self.addCleanup(client.close)
        port.doRead()
        self.assertEqual(len(made), 1)
        transport = made[0].transport
        self.addCleanup(transport.socket.close)  # type: ignore[union-attr]
        self.assertEqual(transport.getPeer().port, client.getsockname()[1])  # type: ignore[union-attr]

    def test_anything_else_is_left_alone(self) -> None:
        eager.speed_up_accepts(object())
        eager.speed_up_accepts(None)
