"""nsqtw.net.epollreactor: nsqtw's reactor dispatches events without the legacy log context per event.

Also how a daemon gets it: installed by the taps when no reactor is
installed yet, by name with ``twistd --reactor=nsqtw``, and any other
reactor left as it is (nsqtw.net.reactor).
"""

from __future__ import annotations

import socket
from typing import Any

import pytest
from twisted.internet.abstract import FileDescriptor
from twisted.python import log as legacy_log
from twisted.trial.unittest import SynchronousTestCase

epollreactor = pytest.importorskip("twisted.internet.epollreactor")

from nsqtw.net.epollreactor import NSQTWReactor  # noqa: E402 (Linux only, as epoll)


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


class ReactorTestCase(SynchronousTestCase):
    """A fresh NSQTWReactor and a socket pair, ``a`` (non-blocking, for readers) and ``b``."""

    def setUp(self) -> None:
        self.reactor = NSQTWReactor()
        self.addCleanup(self.reactor._poller.close)
        self.a, self.b = socket.socketpair()
        self.addCleanup(self.a.close)
        self.addCleanup(self.b.close)
        self.a.setblocking(False)


class DirectDispatchTests(ReactorTestCase):
    def test_is_an_epoll_reactor_whose_poll_step_is_its_own(self) -> None:
        """A subclass of Twisted's epoll reactor that overrides the poll step, not an instance patched."""
        self.assertIsInstance(self.reactor, epollreactor.EPollReactor)
        self.assertIs(NSQTWReactor.doIteration, NSQTWReactor.doPoll)
        self.assertIsNot(NSQTWReactor.doIteration, epollreactor.EPollReactor.doIteration)
        self.assertNotIn("doIteration", vars(self.reactor))
        self.assertEqual(self.reactor.busy_poll.limit, 0.0, "busy polling is off until asked for")

    def test_ready_descriptors_are_read_without_the_legacy_context(self) -> None:
        reader = Reader(self.reactor, self.a)
        self.reactor.addReader(reader)
        self.b.sendall(b"hello")
        self.reactor.doIteration(0)
        self.assertEqual(reader.got, [b"hello"])
        self.assertNotEqual((reader.contexts[0] or {}).get("system"), "ReaderPrefix")
        self.reactor.doIteration(0)  # nothing ready: nothing read, nothing raised
        self.assertEqual(reader.got, [b"hello"])

    def test_twisteds_own_poll_for_comparison(self) -> None:
        """Twisted's own epoll reactor labels the call with the prefix (what is given up)."""
        reactor = epollreactor.EPollReactor()
        self.addCleanup(reactor._poller.close)
        reader = Reader(reactor, self.a)
        reactor.addReader(reader)
        self.b.sendall(b"x")
        reactor.doIteration(0)
        self.assertEqual(reader.got, [b"x"])
        self.assertEqual(reader.contexts[0]["system"], "ReaderPrefix")

    def test_an_escaping_exception_is_logged_with_the_prefix_and_goes_no_further(self) -> None:
        """A peer's close makes _doReadOrWrite call connectionLost, which raises here."""
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


def _run(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter (no reactor imported yet) on this checkout; its stdout lines."""
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=root,
                          timeout=60, check=True)
    return done.stdout.split()


class InstallTests(SynchronousTestCase):
    """Which reactor a daemon gets: nsqtw's when none is installed yet, else the one installed, unchanged."""

    def test_a_daemon_gets_nsqtws_reactor_when_none_is_installed(self) -> None:
        out = _run("from nsqtw.net.reactor import install_for_daemon\n"
                   "print(install_for_daemon())\n"
                   "from twisted.internet import reactor\n"
                   "print(type(reactor).__qualname__)\n")
        self.assertEqual(out, ["True", "NSQTWReactor"])

    def test_a_reactor_installed_before_is_kept_and_the_daemon_says_so(self) -> None:
        """``twistd --reactor=poll`` installs its reactor first: it runs unchanged, and one line says so."""
        out = _run("from twisted.internet import pollreactor\n"
                   "pollreactor.install()\n"
                   "from twisted.logger import globalLogPublisher\n"
                   "said = []\n"
                   "globalLogPublisher.addObserver(said.append)\n"
                   "from nsqtw.net.reactor import install_for_daemon\n"
                   "print(install_for_daemon())\n"
                   "from twisted.internet import reactor\n"
                   "print(type(reactor).__qualname__, hasattr(reactor, 'busy_poll'))\n"
                   "reactor.callWhenRunning(reactor.stop)\n"
                   "reactor.run()\n"
                   "print(sum('--busy-poll has no effect' in e.get('log_format', '')"
                   " and e.get('reactor') == 'twisted.internet.pollreactor.PollReactor' for e in said))\n")
        self.assertEqual(out, ["False", "PollReactor", "False", "1"])

    def test_twistd_can_name_it(self) -> None:
        """The reactor plugin: ``twistd --reactor=nsqtw`` installs nsqtw's reactor by name."""
        from twisted.application.reactors import getReactorTypes

        [plugin] = [r for r in getReactorTypes() if r.shortName == "nsqtw"]
        self.assertEqual(plugin.moduleName, "nsqtw.net.reactor")
        out = _run("from twisted.application.reactors import installReactor\n"
                   "installReactor('nsqtw')\n"
                   "from twisted.internet import reactor\n"
                   "print(type(reactor).__qualname__)\n")
        self.assertEqual(out, ["NSQTWReactor"])


class TurnEndTests(ReactorTestCase):
    """Calls at the end of a turn (ITurnEnd): after the turn's events, in the same iteration."""

    def test_a_call_asked_while_dispatching_runs_after_every_event_of_that_turn(self) -> None:
        order: list[str] = []
        c, d = socket.socketpair()
        self.addCleanup(c.close)
        self.addCleanup(d.close)
        c.setblocking(False)

        class Asking(Reader):
            def doRead(inner) -> Any:
                got = Reader.doRead(inner)
                order.append("read")
                if len(order) == 1:
                    self.reactor.callAtTurnEnd(lambda: order.append("end"))
                return got

        for sock in (self.a, c):
            self.reactor.addReader(Asking(self.reactor, sock))
        self.b.sendall(b"x")
        d.sendall(b"y")
        self.reactor.doIteration(0)
        self.assertEqual(order, ["read", "read", "end"])
        self.assertEqual(self.reactor.getDelayedCalls(), [])

    def test_a_call_asked_before_the_wait_runs_instead_of_it(self) -> None:
        """Asked by a timed call: run at once, and no wait (the reactor works out its timeout again)."""
        waits: list[float | None] = []
        self.reactor.busy_poll = lambda timeout, n: waits.append(timeout) or []  # type: ignore[assignment,func-returns-value]
        ran: list[int] = []
        self.reactor.callAtTurnEnd(lambda: ran.append(1))
        self.reactor.doIteration(None)  # would wait for ever
        self.assertEqual((ran, waits), ([1], []))
        self.reactor.doIteration(0)
        self.assertEqual((ran, waits), ([1], [0]))

    def test_a_call_asked_by_a_call_at_the_turns_end_runs_in_the_same_pass(self) -> None:
        """No extra iteration for it (the owner's records closed at a turn's end ask for their
        link's flush); a call that keeps asking again stops after TURN_END_ROUNDS rounds."""
        from nsqtw.net.epollreactor import TURN_END_ROUNDS

        waits: list[float | None] = []
        self.reactor.busy_poll = lambda timeout, n: waits.append(timeout) or []  # type: ignore[assignment,func-returns-value]
        ran: list[str] = []

        def first() -> None:
            ran.append("first")
            self.reactor.callAtTurnEnd(lambda: ran.append("asked by it"))

        self.reactor.callAtTurnEnd(first)
        self.reactor.doIteration(0)
        self.assertEqual((ran, waits), (["first", "asked by it"], []))
        self.reactor.doIteration(0)
        self.assertEqual(waits, [0])  # nothing left over: this one waits

        rounds: list[int] = []

        def again() -> None:
            rounds.append(1)
            self.reactor.callAtTurnEnd(again)

        self.reactor.callAtTurnEnd(again)
        self.reactor.doIteration(0)
        self.assertEqual((len(rounds), waits), (TURN_END_ROUNDS, [0]))
        self.reactor.doIteration(0)  # the one asked last runs before the next wait, instead of it
        self.assertEqual((len(rounds), waits), (2 * TURN_END_ROUNDS, [0]))

    def test_a_call_that_raises_is_logged_and_the_others_still_run(self) -> None:
        from twisted.logger import globalLogPublisher

        events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(events.append)
        self.addCleanup(globalLogPublisher.removeObserver, events.append)
        ran: list[int] = []

        def boom() -> None:
            raise RuntimeError("boom")

        self.reactor.callAtTurnEnd(boom)
        self.reactor.callAtTurnEnd(lambda: ran.append(2))
        self.reactor.doIteration(0)
        self.assertEqual(ran, [2])
        self.assertEqual(len(self.flushLoggedErrors(RuntimeError)), 1)
        self.assertTrue(any("end of a reactor turn" in str(e.get("log_format")) for e in events))

    def test_turn_end_caller_uses_the_reactors_turn_end_else_a_zero_delay_call(self) -> None:
        from twisted.internet.task import Clock

        from nsqtw.net.turn import ITurnEnd, turn_end_caller

        self.assertTrue(ITurnEnd.providedBy(self.reactor))
        ran: list[int] = []
        turn_end_caller(self.reactor)(lambda: ran.append(1))
        self.assertEqual(self.reactor.getDelayedCalls(), [])
        self.reactor.doIteration(0)
        self.assertEqual(ran, [1])
        clock = Clock()
        turn_end_caller(clock)(lambda: ran.append(2))
        self.assertEqual([c.getTime() for c in clock.getDelayedCalls()], [0.0])
        clock.advance(0)
        self.assertEqual(ran, [1, 2])
