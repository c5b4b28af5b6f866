"""A Deferred-driven loop that drains work in batches, once per reactor turn."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from weakref import WeakKeyDictionary

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.interfaces import IReactorTime

from nsqtw.interfaces import IPauseOwner
from nsqtw.log import Logger

#: pumps run in one reactor turn; the others woken meanwhile wait for the next turns
TURN_SLICE = 256


class _Turn:
    """The pumps woken on one clock, run on its next turn from one call, at most TURN_SLICE a turn.

    A topic that hands a batch to thousands of channels with consumers wakes
    each channel's pump: one delayed call for all of them instead of one
    each, and their deliveries spread over turns instead of holding one.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime) -> None:
        self._clock = clock
        self._pumps: deque[Pump] = deque()
        self._scheduled = False

    def add(self, pump: Pump) -> None:
        self._pumps.append(pump)
        if not self._scheduled:
            self._scheduled = True
            self._clock.callLater(0, self._run)

    def _run(self) -> None:
        self._scheduled = False
        pumps = self._pumps
        for _ in range(min(TURN_SLICE, len(pumps))):  # (those woken meanwhile wait for the next turn)
            pump = pumps.popleft()
            try:
                pump._fire()
            except Exception:
                self.log.failure("{name}: pump failed to run", name=pump._name)
        if pumps and not self._scheduled:
            self._scheduled = True
            self._clock.callLater(0, self._run)


_turns: WeakKeyDictionary[IReactorTime, _Turn] = WeakKeyDictionary()


def _turn_of(clock: IReactorTime) -> _Turn:
    turn = _turns.get(clock)
    if turn is None:
        turn = _turns[clock] = _Turn(clock)
    return turn


class Pump:
    """Waits on one Deferred for "there is work", then calls ``drain()``.

    Any number of :meth:`wake` calls during a reactor turn cost one batch on
    the next turn: producers never pay a Deferred or a call per message. The
    pumps of a clock woken in a turn share one delayed call (:class:`_Turn`).
    ``drain`` returns True when it stopped early (a batch limit) and wants
    another turn. The loop (a coroutine and its Deferred) begins at the
    first wake: a node restarting with 30,000 topics nobody reads makes
    none for them.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, drain: Callable[[], bool], name: str) -> None:
        self._clock = clock
        self._turn = _turn_of(clock)
        self._drain = drain
        self._name = name
        self._waiting: Deferred[None] | None = None
        self._scheduled = False
        self._running = False
        self._done: Deferred[None] | None = None

    def start(self) -> None:
        self._running = True

    def _begin(self) -> None:
        """The loop, at the first wake: it waits on its Deferred before the turn fires it."""
        self._done = ensureDeferred(self._loop())
        self._done.addErrback(lambda f: self.log.failure("{name}: pump stopped", f, name=self._name))

    def stop(self) -> None:
        self._running = False
        self._fire()

    def wake(self) -> None:
        if self._scheduled or not self._running:
            return
        self._scheduled = True
        if self._done is None:
            self._begin()
        self._turn.add(self)

    def _fire(self) -> None:
        waiting, self._waiting = self._waiting, None
        if waiting is not None:
            waiting.callback(None)

    async def _loop(self) -> None:
        while self._running:
            self._waiting = Deferred()
            await self._waiting
            self._scheduled = False
            if not self._running:
                break
            try:
                more = self._drain()
            except Exception:
                self.log.failure("{name}: error while draining", name=self._name)
                more = False
            if more:
                self.wake()


class Pausable:
    """nsqd's pause (``/topic/pause``, ``/channel/pause``), for a topic and a channel alike.

    A paused topic or channel keeps taking messages, but its pump hands none
    on; the state goes up to the node, which persists it in ``nsqd.dat``.
    Unpausing wakes the pump for what gathered meanwhile.
    """

    paused: bool
    owner: IPauseOwner
    _pump: Pump

    def pause(self) -> None:
        self.paused = True
        self.owner.state_changed()

    def unpause(self) -> None:
        self.paused = False
        self.owner.state_changed()
        self._pump.wake()
