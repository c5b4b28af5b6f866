"""A failed start ends the process with status 1 once twistd is done; SIGTERM ends it with 0.

twistd has no public way to choose the exit status; :mod:`nsqtw.net.exit`
records it and leans on Twisted's private ``_exitSignal`` (read through
nsqtw.net.twisted_privates; tests/unit/test_twisted_privates.py guards it).
"""

from __future__ import annotations

import signal
from typing import Any

from twisted.internet.testing import MemoryReactor
from twisted.logger import LogLevel, globalLogPublisher
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.net.exit import ProcessExit, exit_cleanly_after_signal


class ProcessExitTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.registered: list[Any] = []
        self.exited: list[int] = []
        self.process = ProcessExit(self.registered.append, self.exited.append)
        self.events: list[dict[str, Any]] = []
        globalLogPublisher.addObserver(self.events.append)
        self.addCleanup(globalLogPublisher.removeObserver, self.events.append)

    def fatal_lines(self) -> list[str]:
        return [e["reason"] for e in self.events
                if e.get("log_level") == LogLevel.critical and "reason" in e]

    def test_failure_before_the_reactor_runs_stops_it_once_it_runs(self) -> None:
        """A listener that fails while twistd starts the services (before ``reactor.run``): one FATAL
        line, the reactor stops as soon as it runs, and the process exits 1 at interpreter exit."""
        reactor = MemoryReactor()
        self.process.fail(reactor, "failed to instantiate nsqd - listen (x) failed - nope")
        self.assertEqual(self.process.status, 1)
        self.assertEqual(self.fatal_lines(), ["failed to instantiate nsqd - listen (x) failed - nope"])
        self.assertFalse(reactor.hasStopped)
        reactor.run()  # MemoryReactor.run fires the "when running" calls
        self.assertTrue(reactor.hasStopped)
        self.assertEqual(len(self.registered), 1)
        self.assertEqual(self.exited, [])
        self.registered[0]()  # what atexit does
        self.assertEqual(self.exited, [1])

    def test_only_the_first_failure_is_fatal(self) -> None:
        """Two listeners failing give one FATAL line, one stop, one exit handler."""
        reactor = MemoryReactor()
        reactor.running = True
        self.process.fail(reactor, "first")
        self.process.fail(reactor, "second")
        self.assertTrue(reactor.hasStopped)
        self.assertEqual(self.fatal_lines(), ["first"])
        self.assertEqual(len(self.registered), 1)
        self.registered[0]()
        self.assertEqual(self.exited, [1])

    def test_failure_overrides_a_signal_stop(self) -> None:
        """A failure recorded while the reactor stops for a signal exits 1, not by the signal."""
        reactor = MemoryReactor()
        reactor._exitSignal = signal.SIGTERM  # type: ignore[attr-defined]
        self.process.fail(reactor, "failed")
        self.assertIsNone(reactor._exitSignal)  # type: ignore[attr-defined]


class SignalExitTests(SynchronousTestCase):
    def test_sigterm_and_sigint_exit_cleanly(self) -> None:
        """After a graceful SIGTERM or SIGINT twistd is told not to re-raise the signal; others stay."""
        reactor = MemoryReactor()
        for sig, expected in ((signal.SIGTERM, None), (signal.SIGINT, None), (signal.SIGHUP, signal.SIGHUP)):
            reactor._exitSignal = sig  # type: ignore[attr-defined]
            exit_cleanly_after_signal(reactor)
            self.assertEqual(reactor._exitSignal, expected)  # type: ignore[attr-defined]
