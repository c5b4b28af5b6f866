"""A Deferred-driven loop that drains work in batches, once per reactor turn."""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.interfaces import IReactorTime

from nsqtw.log import Logger


class Pump:
    """Waits on one Deferred for "there is work", then calls ``drain()``.

    Any number of :meth:`wake` calls during a reactor turn cost one batch on
    the next turn: producers never pay a Deferred or a call per message.
    ``drain`` returns True when it stopped early (a batch limit) and wants
    another turn.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, drain: Callable[[], bool], name: str) -> None:
        self._clock = clock
        self._drain = drain
        self._name = name
        self._waiting: Deferred[None] | None = None
        self._scheduled = False
        self._running = False
        self._done: Deferred[None] | None = None

    def start(self) -> None:
        if self._running:
            return
        self._running = True
        self._done = ensureDeferred(self._loop())
        self._done.addErrback(lambda f: self.log.failure("{name}: pump stopped", f, name=self._name))

    def stop(self) -> None:
        self._running = False
        self._fire()

    def wake(self) -> None:
        if self._scheduled or not self._running:
            return
        self._scheduled = True
        self._clock.callLater(0, self._fire)

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
