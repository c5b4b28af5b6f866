"""nsqtw.net.busypoll: when the reactor's wait spins before it sleeps, and for how long."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from twisted.internet.task import Clock
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.net.busypoll import DEFAULT_LIMIT, BusyPoll, busy_poll_of

epollreactor = pytest.importorskip("twisted.internet.epollreactor")

from nsqtw.net.epollreactor import NSQTWReactor  # noqa: E402 (Linux only, as epoll)

US = 1e-6
LIMIT = 200 * US
#: what one non-blocking poll costs on the scripted clock
STEP = 1 * US


class ScriptedEpoll:
    """An epoll whose events arrive at given times, on a clock it advances itself.

    ``poll(0)`` takes :data:`STEP`; a blocking poll sleeps until the next
    arrival or its timeout. Every call is recorded as (timeout, found).
    """

    def __init__(self, arrivals: list[float]) -> None:
        self.now = 0.0
        self.arrivals = sorted(arrivals)
        self.calls: list[tuple[float, bool]] = []

    def clock(self) -> float:
        return self.now

    def poll(self, timeout: float, maxevents: int) -> list[tuple[int, int]]:
        if timeout == 0:
            self.now += STEP
            found = bool(self.arrivals) and self.arrivals[0] <= self.now
        elif self.arrivals and (timeout < 0 or self.arrivals[0] <= self.now + timeout):
            self.now = max(self.now, self.arrivals[0])
            found = True
        else:
            assert timeout >= 0, "blocked forever with nothing to come"
            self.now += timeout
            found = False
        self.calls.append((timeout, found))
        if found:
            self.arrivals.pop(0)
            return [(7, 1)]
        return []

    def work(self, seconds: float) -> None:
        """The reactor handles what it got (time passes outside poll)."""
        self.now += seconds


class Core:
    """The spinning thread's core: records each time it is given away (``sched_yield``), and runs
    ``waiting`` (another thread queued for the core) the first time it is."""

    def __init__(self, ep: ScriptedEpoll) -> None:
        self.ep = ep
        self.yields: list[float] = []
        self.waiting: list[float] = []

    def yield_core(self) -> None:
        self.yields.append(self.ep.now)
        if self.waiting:
            # the queued thread runs for its time, and sends what the reactor waits for
            self.ep.work(self.waiting.pop(0))
            self.ep.arrivals.append(self.ep.now)


def make(arrivals: list[float], limit: float = LIMIT, core: list[Core] | None = None) -> tuple[ScriptedEpoll, BusyPoll]:
    ep = ScriptedEpoll(arrivals)
    c = Core(ep)
    if core is not None:
        core.append(c)
    return ep, BusyPoll(ep.poll, limit, clock=ep.clock, yield_core=c.yield_core)


def blocking_calls(ep: ScriptedEpoll) -> list[float]:
    return [t for t, _ in ep.calls if t != 0]


class BusyPollTests(SynchronousTestCase):
    def test_limit_zero_is_a_plain_wait(self) -> None:
        ep, poll = make([50 * US, 60 * US], limit=0)
        self.assertEqual(poll(None, 8), [(7, 1)])
        self.assertEqual(poll(1.0, 8), [(7, 1)])
        self.assertEqual(ep.calls, [(-1, True), (1.0, True)])
        self.assertFalse(poll.spinning)

    def test_a_zero_timeout_never_spins(self) -> None:
        ep, poll = make([10 * US, 1.0])
        poll(None, 8)  # a short gap: spinning from now on
        self.assertTrue(poll.spinning)
        self.assertEqual(poll(0, 8), [])
        self.assertEqual(ep.calls[-1], (0, False))
        self.assertEqual(len(ep.calls), 2)

    def test_a_short_gap_makes_the_next_wait_spin_and_find_its_event_without_sleeping(self) -> None:
        ep, poll = make([50 * US, 50 * US + 30 * US + 10 * US])
        self.assertEqual(poll(None, 8), [(7, 1)])  # slept 50 µs: a short gap
        self.assertEqual(blocking_calls(ep), [-1])
        self.assertTrue(poll.spinning)
        ep.work(10 * US)
        self.assertEqual(poll(None, 8), [(7, 1)])
        self.assertEqual(blocking_calls(ep), [-1], "the second event was found by spinning")
        self.assertTrue(poll.spinning)

    def test_no_spin_after_long_work(self) -> None:
        """Events close together, but each brings more than the limit of work (a throughput
        load): the reactor sleeps between them, leaving the CPU to its clients."""
        ep, poll = make([10 * US, 10 * US + 300 * US + 20 * US, 10 * US + 2 * (300 + 20) * US])
        poll(None, 8)
        self.assertTrue(poll.spinning)
        ep.work(300 * US)
        self.assertEqual(poll(None, 8), [(7, 1)])
        self.assertEqual(blocking_calls(ep), [-1, -1], "slept: no spin after 300 µs of work")
        self.assertTrue(poll.spinning, "the gap itself was short")
        ep.work(150 * US)  # less work than the limit: the next wait spins again
        self.assertEqual(poll(None, 8), [(7, 1)])
        self.assertEqual(blocking_calls(ep), [-1, -1])

    def test_a_long_gap_means_no_spin(self) -> None:
        ep, poll = make([5e-3, 5e-3 + 2e-3])
        poll(None, 8)
        self.assertFalse(poll.spinning)
        poll(None, 8)
        self.assertEqual(ep.calls, [(-1, True), (-1, True)])

    def test_a_spin_that_finds_nothing_costs_at_most_the_limit_then_sleeps_without_spinning(self) -> None:
        ep, poll = make([10 * US, 10e-3, 30e-3])
        poll(None, 8)
        self.assertTrue(poll.spinning)
        spun_from = ep.now
        self.assertEqual(poll(None, 8), [(7, 1)])  # the traffic paused: nothing within the spin
        spins = [t for t, _ in ep.calls[1:] if t == 0]
        self.assertLessEqual(len(spins) * STEP, LIMIT + STEP)
        self.assertGreaterEqual(len(spins) * STEP, LIMIT)
        self.assertEqual(blocking_calls(ep), [-1, -1])
        self.assertEqual(ep.now, 10e-3)
        self.assertFalse(poll.spinning)
        self.assertGreater(ep.now - spun_from, LIMIT)
        before = len(ep.calls)
        poll(None, 8)  # idle now: straight to sleep
        self.assertEqual(ep.calls[before:], [(-1, True)])

    def test_a_spin_never_passes_the_next_timer(self) -> None:
        ep, poll = make([10 * US, 1.0])
        poll(None, 8)
        start = ep.now
        self.assertEqual(poll(50 * US, 8), [])  # a timer is due in 50 µs
        self.assertLessEqual(ep.now - start, 50 * US + STEP)
        self.assertEqual(blocking_calls(ep), [-1], "the timer's wait was all spin")
        self.assertTrue(poll.spinning, "a timer cut the spin short: no sign the traffic stopped")

    def test_after_a_whole_spin_the_sleep_keeps_to_the_timeout(self) -> None:
        ep, poll = make([10 * US, 5.0])
        poll(None, 8)
        start = ep.now
        self.assertEqual(poll(1e-3, 8), [])  # nothing within the timer's 1 ms
        self.assertLessEqual(abs(ep.now - start - 1e-3), 2 * STEP)
        timeout = blocking_calls(ep)[-1]
        self.assertLessEqual(abs(timeout - (1e-3 - LIMIT)), 2 * STEP)

    def test_a_busy_stream_never_sleeps(self) -> None:
        arrivals = [i * 40 * US for i in range(1, 1001)]
        ep, poll = make(arrivals)
        for _ in range(1000):
            self.assertEqual(poll(None, 8), [(7, 1)])
            ep.work(5 * US)
        self.assertEqual(blocking_calls(ep), [-1], "only the first wait slept")

    def test_each_pass_of_a_spin_first_gives_the_core_away(self) -> None:
        cores: list[Core] = []
        ep, poll = make([10 * US, 10 * US + 30 * US], core=cores)
        poll(None, 8)
        self.assertEqual(cores[0].yields, [], "a wait that sleeps yields nothing")
        self.assertEqual(poll(None, 8), [(7, 1)])
        spins = [t for t, _ in ep.calls[1:] if t == 0]
        self.assertGreater(len(spins), 1)
        self.assertEqual(len(cores[0].yields), len(spins), "one yield before each non-blocking poll")

    def test_a_thread_queued_for_the_core_runs_instead_of_the_spin(self) -> None:
        """The event the spin waits for comes from a thread that needs the spinner's core (a
        client, a replica's owner on a machine of fewer cores): it gets the core at the first
        pass, and the spin finds its event at once instead of holding the core for the limit."""
        cores: list[Core] = []
        ep, poll = make([10 * US], core=cores)
        poll(None, 8)
        cores[0].waiting.append(20 * US)  # nothing arrives until that thread runs
        start = ep.now
        self.assertEqual(poll(None, 8), [(7, 1)])
        self.assertEqual(len(cores[0].yields), 1)
        self.assertEqual(blocking_calls(ep), [-1], "found by the spin, no sleep")
        self.assertLessEqual(ep.now - start, 20 * US + STEP)

    def test_plain_waits_never_yield(self) -> None:
        cores: list[Core] = []
        ep, poll = make([50 * US, 60 * US, 70 * US], limit=0, core=cores)
        poll(None, 8)
        poll(1.0, 8)
        self.assertEqual(cores[0].yields, [])
        cores = []
        ep, poll = make([10 * US, 1.0], core=cores)
        poll(None, 8)
        poll(0, 8)  # work is queued: a zero timeout never spins
        self.assertEqual(cores[0].yields, [])

    def test_the_default_spins_200us(self) -> None:
        """nsqd's ``--busy-poll`` default, 200 µs (docs/performance.md: what it buys and costs),
        spins between events that come that close (0, off, is ``test_limit_zero_is_a_plain_wait``)."""
        self.assertAlmostEqual(DEFAULT_LIMIT, 200 * US)
        ep, poll = make([10 * US, 20 * US, 30 * US], limit=DEFAULT_LIMIT)
        for _ in range(3):
            poll(None, 8)
        self.assertEqual(ep.calls[0], (-1, True), "the first wait sleeps")
        self.assertIn((0, True), ep.calls[1:], "a later one spins and finds the next event")
        self.assertEqual(blocking_calls(ep), [-1], "only the first wait slept")


class InstallTests(SynchronousTestCase):
    def test_nsqtws_reactor_waits_through_a_busy_poll_that_is_off_until_set(self) -> None:
        reactor = NSQTWReactor()
        self.addCleanup(reactor._poller.close)
        poll = busy_poll_of(reactor)
        assert poll is not None
        self.assertIs(poll, reactor.busy_poll)
        self.assertEqual(poll.limit, 0.0)

    def test_other_reactors_have_none(self) -> None:
        self.assertIsNone(busy_poll_of(Clock()))
        reactor: Any = epollreactor.EPollReactor()
        self.addCleanup(reactor._poller.close)
        self.assertIsNone(busy_poll_of(reactor))

    def test_a_spinning_reactor_still_reads_its_sockets(self) -> None:
        from twisted.internet.abstract import FileDescriptor

        reactor = NSQTWReactor()
        self.addCleanup(reactor._poller.close)
        reactor.busy_poll.limit = LIMIT
        a, b = socket.socketpair()
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        a.setblocking(False)
        got: list[bytes] = []

        class Reader(FileDescriptor):
            def fileno(self) -> int:
                return a.fileno()

            def doRead(self) -> None:
                got.append(a.recv(100))

        reactor.addReader(Reader(reactor))
        poll = reactor.busy_poll
        poll.spinning = True
        b.sendall(b"one")
        reactor.doIteration(None)
        self.assertEqual(got, [b"one"])
        reactor.doIteration(0.001)  # spins, then sleeps out the timeout: nothing to read
        self.assertEqual(got, [b"one"])
        self.assertFalse(poll.spinning)
