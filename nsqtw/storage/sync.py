"""``--sync-timeout`` for every disk queue on one timer, armed only while some queue has work.

go-diskqueue gives each queue a ticker; with 10,000 channels that is
10,000 timers firing every two seconds on an idle node. Here a queue that
wrote or consumed anything marks itself; one timer, armed by the first mark,
syncs the marked queues when it fires and is not re-armed until the next
mark. A queue is still synced at most ``interval`` after its last activity,
and an idle node runs no per-queue work at all.

The same ticks give descriptors back: a queue holding one is *watched*,
and at a tick that finds it idle since the one before it closes its files
(:meth:`nsqtw.storage.diskqueue.DiskQueue.sync_tick`). So a queue's
descriptors are closed two ticks at most after its last read or write.
"""

from __future__ import annotations

from typing import Protocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime

__all__ = ["IDLE_TICK", "SyncSchedule"]

#: seconds between ticks when ``--sync-timeout`` syncs nothing (0): descriptors are still given back
IDLE_TICK = 2.0


class _Syncable(Protocol):
    def sync_tick(self) -> None: ...


class SyncSchedule:
    """One node's (or one queue's) sync timer."""

    def __init__(self, clock: IReactorTime, interval: float) -> None:
        self._clock = clock
        self.interval = interval
        #: whether ticks sync (``--sync-timeout`` above 0) or only give idle descriptors back
        self.syncs = interval > 0
        self._period = interval if interval > 0 else IDLE_TICK
        self._marked: dict[int, _Syncable] = {}
        self._call: IDelayedCall | None = None

    def mark(self, queue: _Syncable) -> None:
        """``queue`` did something since the last sync: sync it within ``interval``."""
        if self.syncs:  # (watch's body, inline: every put marks)
            self._marked[id(queue)] = queue
            if self._call is None:
                self._call = self._clock.callLater(self._period, self._tick)

    def watch(self, queue: _Syncable) -> None:
        """Tick ``queue`` at the next tick (it holds descriptors to give back once it idles)."""
        self._marked[id(queue)] = queue
        if self._call is None:
            self._call = self._clock.callLater(self._period, self._tick)

    def forget(self, queue: _Syncable) -> None:
        """A closed queue needs no more syncs (nor the timer, if it was the last one marked)."""
        self._marked.pop(id(queue), None)
        if not self._marked:
            self.stop()

    def _tick(self) -> None:
        self._call = None
        marked, self._marked = self._marked, {}
        for queue in marked.values():
            queue.sync_tick()

    def stop(self) -> None:
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None
        self._marked.clear()
