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


class AddressTests(SynchronousTestCase):
    """Go's address syntax and its errors, as nsqd's FATAL line words them."""

    def test_accepted_forms(self) -> None:
        from nsqtw.net.listen import split_host_port

        self.assertEqual(split_host_port("127.0.0.1:4150"), ("127.0.0.1", 4150))
        self.assertEqual(split_host_port("[::1]:0"), ("::1", 0))
        self.assertEqual(split_host_port(":4151"), ("", 4151))
        self.assertEqual(split_host_port("host:"), ("host", 0))  # Go: an empty port picks one

    def test_malformed_addresses_say_why(self) -> None:
        """No port, a port that is not a number or out of range: ValueError in Go's words."""
        from nsqtw.net.listen import split_host_port

        for address, reason in (("notanaddress", "address notanaddress: missing port in address"),
                                ("127.0.0.1:99999", "address 99999: invalid port"),
                                ("127.0.0.1:abc", "address abc: invalid port"),
                                ("127.0.0.1:-1", "address -1: invalid port")):
            with self.assertRaises(ValueError) as e:
                split_host_port(address)
            self.assertEqual(str(e.exception), reason)

    def test_listen_errors_in_go_words(self) -> None:
        """A port taken, a name that does not resolve, a malformed address: nsqd's wording."""
        import errno
        import socket

        from twisted.internet.error import CannotListenError

        from nsqtw.net.listen import listen_error

        taken = CannotListenError("127.0.0.1", 4150, OSError(errno.EADDRINUSE, "Address already in use"))
        self.assertEqual(listen_error("127.0.0.1:4150", taken),
                         "listen tcp 127.0.0.1:4150: bind: address already in use")
        unknown = CannotListenError("nosuch.invalid", 4150,
                                    socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
        self.assertEqual(listen_error("nosuch.invalid:4150", unknown),
                         "listen tcp: lookup nosuch.invalid: name or service not known")
        self.assertEqual(listen_error("bad", ValueError("address bad: missing port in address")),
                         "listen tcp: address bad: missing port in address")
