"""The eager transport: its reliance on Twisted's private write buffers, its fallback, corking and closing."""

from __future__ import annotations

import socket
import types
from typing import Any

from twisted.internet import error, main
from twisted.internet.protocol import Protocol, connectionDone
from twisted.internet.testing import MemoryReactorClock
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.net import eager


class AcceptTests(SynchronousTestCase):
    """AcceptSocket and EagerPort: the same accepted sockets and connections, fewer Python steps."""

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

    def test_the_eager_port_accepts_through_accept_socket(self) -> None:
        """EagerPort makes its listening socket an AcceptSocket (Twisted's ``createInternetSocket`` seam),
        makes its logger once, and accepts connections as ``tcp.Port`` does."""
        import socket

        from twisted.internet import tcp
        from twisted.internet.protocol import Protocol, ServerFactory
        from twisted.internet.testing import MemoryReactor

        made: list[Protocol] = []

        class Factory(ServerFactory):
            def buildProtocol(self, addr: object) -> Protocol:
                made.append(Protocol())
                return made[-1]

        port = eager.EagerPort(0, Factory(), interface="127.0.0.1", reactor=MemoryReactor())
        port.startListening()
        self.addCleanup(port.socket.close)
        self.assertIs(type(port.socket), eager.AcceptSocket)
        self.assertFalse(port.socket.getblocking())
        self.assertEqual(port.socket.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) != 0,
                         tcp.Port(0, Factory()).createInternetSocket().getsockopt(
                             socket.SOL_SOCKET, socket.SO_REUSEADDR) != 0)
        self.assertIs(port._logger, port._logger)  # made once, not per access
        client = socket.create_connection(("127.0.0.1", port.getHost().port))
        self.addCleanup(client.close)
        port.doRead()
        self.assertEqual(len(made), 1)
        transport = made[0].transport
        self.assertIsInstance(transport, eager.SERVER_CLASS)
        self.addCleanup(transport.socket.close)  # type: ignore[union-attr]
        self.assertEqual(transport.getPeer().port, client.getsockname()[1])  # type: ignore[union-attr]


class _Recorder(Protocol):
    """Records what the transport reports to its protocol."""

    def __init__(self) -> None:
        self.lost: list[Failure] = []

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.lost.append(reason)


class _CountingSocket:
    """A connected socket that counts the system calls EagerServer makes on it."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.sends: list[bytes] = []
        self.calls: list[str] = []

    def send(self, data: bytes) -> int:
        self.sends.append(bytes(data))
        return self._sock.send(data)

    def sendmsg(self, buffers: list[bytes]) -> int:
        """A gathered send, recorded as the bytes it offered."""
        self.sends.append(b"".join(buffers))
        return self._sock.sendmsg(buffers)

    def setsockopt(self, *args: Any) -> None:
        self.calls.append("setsockopt")
        self._sock.setsockopt(*args)

    def shutdown(self, how: int) -> None:
        self.calls.append("shutdown")
        self._sock.shutdown(how)

    def close(self) -> None:
        self.calls.append("close")
        self._sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class EagerServerTests(SynchronousTestCase):
    """EagerServer's corked writes and its close without a writability round, on a real socket pair."""

    def setUp(self) -> None:
        self.reactor = MemoryReactorClock()
        listener = socket.create_server(("127.0.0.1", 0))
        self.peer = socket.create_connection(listener.getsockname())
        ours, _ = listener.accept()
        listener.close()
        self.addCleanup(self.peer.close)
        self.peer.setblocking(False)
        ours.setblocking(False)
        self.sock = _CountingSocket(ours)
        self.protocol = _Recorder()
        self.server = eager.EagerServer(self.sock, self.protocol, ("127.0.0.1", 1234), None, 1, self.reactor)
        self.protocol.makeConnection(self.server)
        self.addCleanup(lambda: self.server.connected and self.server.abortConnection())

    def received(self) -> bytes:
        try:
            return self.peer.recv(65536)
        except BlockingIOError:
            return b""

    def test_corked_writes_leave_in_one_send(self) -> None:
        """What is written while corked (a response's head, then its body) is sent once, in order, on uncork."""
        self.server.cork()
        self.server.writeSequence([b"HTTP/1.1 200 OK\r\n", b"Content-Length: 2\r\n\r\n"])
        self.server.write(b"OK")
        self.assertEqual((self.sock.sends, self.received()), ([], b""))
        self.server.uncork()
        self.assertEqual(self.sock.sends, [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK"])
        self.assertEqual(self.received(), b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")
        self.server.write(b"after")  # no longer corked: at once
        self.assertEqual(self.sock.sends[-1], b"after")

    def test_its_direct_sender_is_its_own_write_and_keeps_the_cork(self) -> None:
        """direct_sender of an EagerServer (a replication link's replica end) sends at once as its
        write does, and never ahead of what a cork holds."""
        send = eager.direct_sender(self.server)
        assert send is not None
        send(b"now")
        self.assertEqual((self.sock.sends, self.received()), ([b"now"], b"now"))
        self.server.cork()
        self.server.write(b"head ")
        send(b"body")
        self.assertEqual(self.received(), b"")
        self.server.uncork()
        self.assertEqual(self.received(), b"head body")

    def test_write_sequence_is_one_send(self) -> None:
        """writeSequence on an idle connection sends its parts in one gathered send instead of buffering them."""
        self.server.writeSequence([b"a", b"b", b"c"])
        self.assertEqual(self.sock.sends, [b"abc"])
        self.assertEqual(self.received(), b"abc")
        self.assertEqual(self.reactor.getWriters(), [])

    def test_what_a_gathered_send_leaves_is_queued_in_order(self) -> None:
        """Parts the socket did not take, a part cut where the send stopped, wait in Twisted's buffer, in order."""
        self.sock.sendmsg = lambda buffers: 5  # type: ignore[method-assign]  # took "ab" and "cde"
        self.server.writeSequence([b"ab", b"cdefg", b"hi"])
        self.assertEqual(self.reactor.getWriters(), [self.server])
        del self.sock.sendmsg
        self.server.write(b"jk")  # queued behind them, not sent ahead
        self.assertEqual(self.sock.sends, [])
        self.server.doWrite()
        self.assertEqual(self.received(), b"fghijk")

    def test_gathered_send_cuts(self) -> None:
        """send_pieces returns exactly what a send of each count of bytes left."""
        pieces = [b"ab", b"cde", b"f"]
        for sent, rest in [(0, pieces), (1, [b"b", b"cde", b"f"]), (2, [b"cde", b"f"]), (4, [b"e", b"f"]),
                           (5, [b"f"]), (6, [])]:
            sock = types.SimpleNamespace(sendmsg=lambda buffers, n=sent: n)
            self.assertEqual(eager.send_pieces(sock, pieces), rest, sent)  # type: ignore[arg-type]

        def refuse(buffers: list[bytes]) -> int:
            raise BlockingIOError()
        self.assertEqual(eager.send_pieces(types.SimpleNamespace(sendmsg=refuse), pieces), pieces)  # type: ignore[arg-type]

    def test_close_when_idle_skips_the_writability_round(self) -> None:
        """With nothing queued, loseConnection closes on the next turn: no writer, never synchronously."""
        self.server.write(b"bye")
        self.server.loseConnection()
        self.assertEqual(self.reactor.getWriters(), [])
        self.assertNotIn(self.server, self.reactor.getReaders())
        self.assertEqual(self.protocol.lost, [])  # not from within loseConnection
        self.reactor.advance(0)
        self.assertEqual(len(self.protocol.lost), 1)
        self.protocol.lost[0].trap(error.ConnectionDone)
        self.assertEqual(self.sock.calls[-1:], ["close"])
        self.assertNotIn("shutdown", self.sock.calls)  # close alone ends it, as Go's Close
        self.assertEqual(self.received(), b"bye")
        self.assertEqual(self.peer.recv(10), b"")  # the peer sees the end

    def test_close_flushes_the_cork_first(self) -> None:
        """Closing while corked sends what was corked before the connection ends."""
        self.server.cork()
        self.server.write(b"answer")
        self.server.loseConnection()
        self.reactor.advance(0)
        self.assertEqual(self.received(), b"answer")
        self.assertEqual(len(self.protocol.lost), 1)

    def test_written_after_close_still_goes_out_first(self) -> None:
        """Bytes written between loseConnection and the next turn take Twisted's way: sent, then closed."""
        self.server.loseConnection()
        self.server.write(b"late")
        self.reactor.advance(0)
        self.assertEqual(self.protocol.lost, [])
        self.assertIn(self.server, self.reactor.getWriters())
        self.server.doWrite()
        self.assertEqual(self.received(), b"late")

    def test_close_with_queued_bytes_waits_for_them(self) -> None:
        """With bytes queued in Twisted's buffer, loseConnection is Twisted's: write them, then close."""
        self.server.cork()
        self.server.write(b"x")
        super(eager.EagerServer, self.server).write(b"queued")  # as if the kernel had refused it
        self.server.loseConnection()
        self.assertIn(self.server, self.reactor.getWriters())
        self.assertEqual(self.server.doWrite(), main.CONNECTION_DONE)
        self.assertEqual(self.received(), b"queuedx")

    def test_no_delay_is_set_once(self) -> None:
        """Asking again for TCP_NODELAY (twisted.web's HTTPChannel does) makes no second system call."""
        self.assertEqual(self.sock.calls.count("setsockopt"), 1)  # by __init__, as Go sets it
        self.server.setTcpNoDelay(True)
        self.server.setTcpNoDelay(True)
        self.assertEqual(self.sock.calls.count("setsockopt"), 1)
        self.server.setTcpNoDelay(False)
        self.assertEqual(self.sock.calls.count("setsockopt"), 2)
        self.assertFalse(self.server.getTcpNoDelay())

    def test_a_pull_producer_is_asked_for_more_by_twisted(self) -> None:
        """With a pull producer registered, writes take Twisted's buffer, so doWrite asks for the next part."""
        parts = [b"one", b"two"]
        server = self.server

        class Pull:
            resumed = 0

            def resumeProducing(self) -> None:
                self.resumed += 1
                if parts:
                    server.write(parts.pop(0))

            def stopProducing(self) -> None:
                pass

        producer = Pull()
        server.registerProducer(producer, False)  # Twisted asks for the first part at once
        self.assertEqual((producer.resumed, self.sock.sends), (1, []))
        self.assertIn(server, self.reactor.getWriters())
        server.doWrite()  # sends "one" and, its buffer empty, asks for more
        server.doWrite()
        self.assertEqual(producer.resumed, 3)
        self.assertEqual(self.received(), b"onetwo")

    def test_aborted_before_the_close_turn_is_lost_once(self) -> None:
        """An abort between loseConnection and the next turn is reported once, as an abort; the turn does nothing."""
        self.server.loseConnection()
        self.server.abortConnection()
        self.reactor.advance(0)  # the pending close finds the connection gone
        self.assertEqual(len(self.protocol.lost), 1)
        self.protocol.lost[0].trap(error.ConnectionAborted)
        self.assertEqual(self.sock.calls[-2:], ["setsockopt", "close"])  # SO_LINGER 0: a reset, as aborts send
        self.assertEqual(self.sock.calls.count("close"), 1)
