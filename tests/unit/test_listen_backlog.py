"""The TCP and HTTP listeners use the kernel's accept backlog, as Go's net.Listen does."""

from __future__ import annotations

from unittest import mock

from twisted.internet.protocol import ServerFactory
from twisted.internet.testing import MemoryReactor
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.net.listen import listen_backlog, server_endpoint


class ListenBacklogTests(SynchronousTestCase):
    def test_listeners_use_somaxconn(self) -> None:
        """IPv4 and IPv6 listeners ask for somaxconn, not Twisted's 50 (a reconnect storm would drop SYNs)."""
        with mock.patch("builtins.open", mock.mock_open(read_data="4096\n")):
            self.assertEqual(listen_backlog(), 4096)
            reactor = MemoryReactor()
            endpoints = [server_endpoint(reactor, "127.0.0.1:0"), server_endpoint(reactor, "[::1]:0")]
        self.assertEqual([(e.interface, e.backlog) for e in endpoints], [("127.0.0.1", 4096), ("::1", 4096)])
        # the port an endpoint makes listens with that backlog (tcp.Port hands it to listen())
        port = endpoints[0]._make_port(ServerFactory())
        self.assertEqual(port.backlog, 4096)

    def test_backlog_capped_and_defaulted(self) -> None:
        """A huge somaxconn is capped at 65535; without /proc the platform's SOMAXCONN is used."""
        with mock.patch("builtins.open", mock.mock_open(read_data="1000000\n")):
            self.assertEqual(listen_backlog(), 65535)
        with mock.patch("builtins.open", side_effect=OSError("no /proc")):
            import socket
            self.assertEqual(listen_backlog(), socket.SOMAXCONN)
