"""Rate and depth history for the pages' charts, from the admin's own polling of every node's ``/stats``.

nsqadmin draws history only through graphite; nsqtw-admin keeps a small
window in memory instead: every ``--history-interval`` it asks every node
for its stats (without clients) and records, per topic and per
topic/channel and for the whole cluster, summed over the nodes: the depth
(a topic's is its own queue, what is not yet copied to its channels, as
nsqd's and nsqadmin's topic depth; the cluster's is every topic's), the
backlog (what waits in the channels: a topic's channels' depths, the
cluster's every channel's, a channel's its own depth), the in-flight count
and the message count. Rates are the message count's growth per second
between two polls. Memory is bounded: ``window / interval`` points per
series, at most :data:`MAX_SERIES` series, and series of topics or channels
that are gone are dropped at the next poll.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.task import LoopingCall

from nsqtw.log import Logger

__all__ = ["MAX_SERIES", "History", "Point", "Series"]

#: the most series kept (topics plus channels plus the cluster's own)
MAX_SERIES = 20_000


@dataclass(frozen=True)
class Point:
    """One poll, summed over the nodes: when, depth, message count, in flight and channel backlog."""

    ts: float
    depth: int
    messages: int
    in_flight: int = 0
    backlog: int = 0


@dataclass
class Series:
    """The last points of one topic, channel or the cluster."""

    points: deque[Point] = field(default_factory=deque)

    def as_json(self) -> list[dict[str, Any]]:
        """Points with ``rate`` (messages per second since the previous point; None at first)."""
        out = []
        previous: Point | None = None
        for p in self.points:
            rate = None
            if previous is not None and p.ts > previous.ts:
                # a node restart makes the count go down: no rate across it
                grown = p.messages - previous.messages
                rate = round(grown / (p.ts - previous.ts), 3) if grown >= 0 else None
            out.append({"ts": round(p.ts, 3), "depth": p.depth, "backlog": p.backlog,
                        "in_flight": p.in_flight, "messages": p.messages, "rate": rate})
            previous = p
        return out


#: the key of the cluster-wide series
CLUSTER = ("", "")


class History:
    """The series, and the loop that feeds them.

    ``poll`` is an async callable returning the nodes' per-topic entries
    (``nsqtw.admin.aggregate.node_topic_entry`` shapes); a poll still running
    when the next is due is not doubled.
    """

    log = Logger()

    def __init__(self, clock: Any, interval: float, window: float,
                 poll: Callable[[], Any]) -> None:
        self.clock = clock
        self.interval = interval
        self.window = window
        self.size = max(2, int(window / interval) + 1) if interval > 0 else 0
        self.poll = poll
        self.series: dict[tuple[str, str], Series] = {}
        self._loop: LoopingCall | None = None
        self._running: Deferred[None] | None = None
        self.last_error = ""

    def start(self) -> None:
        if self.interval <= 0:
            return
        self._loop = LoopingCall(self._tick)
        self._loop.clock = self.clock
        self._loop.start(self.interval, now=True).addErrback(
            lambda f: self.log.failure("HISTORY: loop stopped", f))

    def stop(self) -> None:
        if self._loop is not None and self._loop.running:
            self._loop.stop()
        self._loop = None

    def _tick(self) -> None:
        if self._running is not None:
            return
        self._running = ensureDeferred(self._poll_once())

        def done(result: Any) -> None:
            self._running = None

        self._running.addBoth(done)

    async def _poll_once(self) -> None:
        try:
            entries = await self.poll()
        except Exception as e:  # noqa: BLE001 - a failed poll leaves a gap, nothing more
            self.last_error = str(e)
            self.log.warn("HISTORY: poll failed - {error}", error=str(e))
            return
        self.last_error = ""
        self.record(self.clock.seconds(), entries)

    def record(self, now: float, entries: Sequence[dict[str, Any]]) -> None:
        """Add one poll's totals; forget series that are no longer in the cluster."""
        # per series: depth, messages, in flight, backlog
        totals: dict[tuple[str, str], list[int]] = {CLUSTER: [0, 0, 0, 0]}
        cluster = totals[CLUSTER]
        for t in entries:
            name = t["topic_name"]
            tt = totals.setdefault((name, ""), [0, 0, 0, 0])
            for row in (tt, cluster):
                row[0] += t["depth"]
                row[1] += t["message_count"]
            for c in t["channels"] or ():
                ct = totals.setdefault((name, c["channel_name"]), [0, 0, 0, 0])
                ct[0] += c["depth"]
                ct[1] += c["message_count"]
                ct[3] += c["depth"]
                for row in (ct, tt, cluster):
                    row[2] += c["in_flight_count"]
                for row in (tt, cluster):
                    row[3] += c["depth"]
        for key in [k for k in self.series if k not in totals]:
            del self.series[key]
        for key, (depth, messages, in_flight, backlog) in totals.items():
            series = self.series.get(key)
            if series is None:
                if len(self.series) >= MAX_SERIES:
                    continue
                series = self.series[key] = Series(deque(maxlen=self.size))
            series.points.append(Point(now, depth, messages, in_flight, backlog))

    def get(self, topic: str = "", channel: str = "") -> list[dict[str, Any]]:
        series = self.series.get((topic, channel))
        return series.as_json() if series is not None else []
