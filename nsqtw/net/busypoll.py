"""Busy polling: while traffic is brisk, look for the next event for a moment before sleeping.

On this project's machines a one-message round trip over loopback spent
more time waking the reactor's thread than handling the command: the
thread sleeps in ``epoll_wait``, the client's next command arrives 20-40 µs
later, and the wake-up (the scheduler, a halted virtual CPU, cold caches)
costs about as much again, on every command. Go nsqd does not pay it: Go's
scheduler keeps a thread spinning for new work for a while before it
parks. :class:`BusyPoll` does the same for the epoll reactor: after an
event, the next wait first asks ``epoll`` without blocking, again and
again, for up to ``limit`` seconds, and only then sleeps.

It adapts, so an idle node, or one whose events are far apart (heartbeats
of many idle clients), does not spin: a wait spins only when the last
gap between events was at most ``limit``. A spin that finds nothing
ends spinning until a gap that short is seen again, so at most one
``limit`` of CPU is spent per burst of traffic that stops. A wait never
spins past the reactor's next timer, and a timeout of 0 (work is queued)
never spins.

A spinning thread gives its core away at each pass (``sched_yield``)
to any other thread that waits for that core. On a machine with fewer
cores than busy threads (two cores shared by the reactor, its clients, a
replica's peer node) the thread that would send the next event may be the
one queued behind the spin; Linux's own socket busy polling stops at
``need_resched()`` for the same reason. Where a core is free, the yield
returns at once and the spin goes on.

Nor does a wait spin after the reactor worked longer than ``limit`` since
its last wait. Spinning pays when the work per event is small against the
wake-up it saves: one-message round trips. Under a throughput load
(MPUBs of 200, a consumer at RDY 2500) each event brings hundreds of
microseconds of work, the wake-up is a small share of it, and a spinning
reactor only takes a core from the clients it shares the machine with
(measured: docs/performance.md, "Busy polling"). The cost that remains:
while short commands keep coming less than ``limit`` apart, the reactor
thread is busy between them: the core shows as used, though any thread
waiting for it gets it at the next pass. Measured side by side, that pays where nsqtw is weakest: on
2 cores (with the clients on the same 2 cores) one-message round trips
rise by about half and the reactor's CPU per round trip falls (a spin is
cheaper than the wake-up it saves), with no loss on batches; on 16 cores
round trips rise by a sixth to a quarter, MPUB writes fall by 6-13%. So
nsqd's ``--busy-poll`` is :data:`DEFAULT_LIMIT`, and ``--busy-poll=0``
turns it off (docs/performance.md, "Busy polling").

Only nsqtw's reactor (:mod:`nsqtw.net.epollreactor`) waits through a
:class:`BusyPoll`; :func:`busy_poll_of` finds it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

__all__ = ["BusyPoll", "DEFAULT_LIMIT", "busy_poll_of"]

#: nsqd's ``--busy-poll`` default, in seconds (KVM's default halt-polling window is the same 200 µs)
DEFAULT_LIMIT = 0.0002

Events = list[tuple[int, int]]
#: ``select.epoll.poll``'s shape: (timeout in seconds, -1 for none; most events)
Poll = Callable[[float, int], Events]


class BusyPoll:
    """``poll(timeout, maxevents)`` for a reactor's poll step, spinning before it sleeps (see the module)."""

    __slots__ = ("_poll", "_clock", "_yield", "limit", "spinning", "_returned")

    def __init__(self, poll: Poll, limit: float = DEFAULT_LIMIT,
                 clock: Callable[[], float] = time.perf_counter,
                 yield_core: Callable[[], None] = os.sched_yield) -> None:
        self._poll = poll
        self._clock = clock
        #: called before each pass of a spin: lets a thread waiting for this core run first
        self._yield = yield_core
        #: the longest spin, in seconds; 0: never spin (a plain ``poll``)
        self.limit = limit
        #: the last gap between events was at most ``limit``: the next wait spins first
        self.spinning = False
        #: when the last wait that found events returned (the reactor's work since is the gap's other half)
        self._returned = 0.0

    def __call__(self, timeout: float | None, maxevents: int) -> Events:
        """The ready events, waiting at most ``timeout`` seconds (None: until there is one)."""
        poll = self._poll
        limit = self.limit
        if limit <= 0 or (timeout is not None and timeout <= 0):
            return poll(-1 if timeout is None else timeout, maxevents)
        clock = self._clock
        start = clock()
        if self.spinning and start - self._returned <= limit:
            window = limit if timeout is None or timeout > limit else timeout
            end = start + window
            yield_core = self._yield
            while True:
                yield_core()
                events = poll(0, maxevents)
                now = clock()
                if events:
                    self._returned = now
                    return events
                if now >= end:
                    break
            if window < limit:
                # a timer is due before the spin would have ended: the reactor runs it and
                # the next wait spins again (nothing says the traffic stopped)
                return []
            # a whole spin found nothing: the traffic paused; sleep, and spin again only
            # after a gap as short as ``limit`` is seen
            self.spinning = False
        left = -1.0 if timeout is None else max(0.0, timeout - (clock() - start))
        events = poll(left, maxevents)
        if events:
            now = self._returned = clock()
            self.spinning = now - start <= limit
        return events


def busy_poll_of(reactor: Any) -> BusyPoll | None:
    """The reactor's :class:`BusyPoll` wait; None for a reactor that is not nsqtw's (its waits are Twisted's)."""
    poll = getattr(reactor, "busy_poll", None)
    return poll if isinstance(poll, BusyPoll) else None
