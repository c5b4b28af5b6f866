"""nsqtw.net.dispatch: the epoll reactor's events without the legacy log context per event."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from twisted.internet.abstract import FileDescriptor
from twisted.python import log as legacy_log
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.net.dispatch import direct_dispatch

epollreactor = pytest.importorskip("twisted.internet.epollreactor")


class Reader(FileDescriptor):
    """Reads from one end of a socket pair; ``boom`` makes its logPrefix and disconnect raise."""

    def __init__(self, reactor: Any, sock: socket.socket, boom: bool = False) -> None:
        super().__init__(reactor)  # type: ignore[no-untyped-call]
        self.sock = sock
        self.got: list[bytes] = []
        self.contexts: list[Any] = []
        self.boom = boom
        self.lost: list[Any] = []

    def fileno(self) -> int:
        return self.sock.fileno()

    def logPrefix(self) -> str:
        return "ReaderPrefix"

    def doRead(self) -> Any:
        from twisted.internet.main import CONNECTION_DONE
        from twisted.python import context

        self.contexts.append(context.get(legacy_log.ILogContext))
        data = self.sock.recv(100)
        if not data:
            return CONNECTION_DONE
        self.got.append(data)
        return None

    def connectionLost(self, reason: Any) -> None:
        self.lost.append(reason)
        if self.boom:
            raise RuntimeError("connectionLost blew up")


class DirectDispatchTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.reactor = epollreactor.EPollReactor()
        self.addCleanup(self.reactor._poller.close)
        self.a, self.b = socket.socketpair()
        self.addCleanup(self.a.close)
        self.addCleanup(self.b.close)
        self.a.setblocking(False)

    def test_installed_once_and_only_on_the_epoll_reactor(self) -> None:
        self.assertTrue(direct_dispatch(self.reactor))
        self.assertFalse(direct_dispatch(self.reactor))
        from twisted.internet.task import Clock

        self.assertFalse(direct_dispatch(Clock()))

    def test_ready_descriptors_are_read_without_the_legacy_context(self) -> None:
        direct_dispatch(self.reactor)
        reader = Reader(self.reactor, self.a)
        self.reactor.addReader(reader)
        self.b.sendall(b"hello")
        self.reactor.doIteration(0)
        self.assertEqual(reader.got, [b"hello"])
        self.assertNotEqual((reader.contexts[0] or {}).get("system"), "ReaderPrefix")
        self.reactor.doIteration(0)  # nothing ready: nothing read, nothing raised
        self.assertEqual(reader.got, [b"hello"])

    def test_twisteds_own_poll_for_comparison(self) -> None:
        """Without it, Twisted's poll step labels the call with the prefix (what is given up)."""
        reader = Reader(self.reactor, self.a)
        self.reactor.addReader(reader)
        self.b.sendall(b"x")
        self.reactor.doIteration(0)
        self.assertEqual(reader.got, [b"x"])
        self.assertEqual(reader.contexts[0]["system"], "ReaderPrefix")

    def test_an_escaping_exception_is_logged_with_the_prefix_and_goes_no_further(self) -> None:
        """A peer's close makes _doReadOrWrite call connectionLost, which raises here."""
        direct_dispatch(self.reactor)
        reader = Reader(self.reactor, self.a, boom=True)
        self.reactor.addReader(reader)
        logged: list[dict[str, Any]] = []
        legacy_log.addObserver(logged.append)
        self.addCleanup(legacy_log.removeObserver, logged.append)
        self.b.close()
        self.reactor.doIteration(0)
        self.assertEqual(len(reader.lost), 1)
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertTrue(any(e.get("system") == "ReaderPrefix" and e.get("isError") for e in logged))
