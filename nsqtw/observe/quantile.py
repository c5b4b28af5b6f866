"""End-to-end processing latency percentiles, computed the way nsqd does.

nsqd keeps, per channel, two rotating windows of a targeted-quantile stream
(Cormode, Korn, Muthukrishnan and Srivastava's biased quantiles, as in the
``perks`` library nsqd uses), each covering half of
``--e2e-processing-latency-window-time``; a topic's figures merge those of
its channels. The same algorithm here gives the same answers within the
algorithm's error (1% of rank around each requested percentile).

The per-message cost is one comparison and one list append: samples wait
in a buffer of :data:`BUFFER_SIZE` and are folded into the bounded summary
in one sorted batch, so memory stays bounded however many messages pass.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from nsqtw._go.json import go_number

__all__ = ["BUFFER_SIZE", "EPSILON", "Quantile", "Stream", "aggregate", "empty_result"]

#: allowed rank error around each target quantile (perks' default)
EPSILON = 0.01
#: samples buffered before they are folded into the summary (perks' buffer size)
BUFFER_SIZE = 500

_INF = math.inf


def _number(value: float) -> int | float:
    """A figure as /stats writes it: Go's float64 (``1`` not ``1.0``), so the fast JSON path applies."""
    try:
        return go_number(value)
    except ValueError:
        return value


def empty_result() -> dict[str, Any]:
    """What nsqd reports where no latency is tracked."""
    return {"count": 0, "percentiles": None}


class _Summary:
    """The compressed, sorted list of ``[value, width, delta]`` samples (CKMS)."""

    __slots__ = ("targets", "items", "n")

    def __init__(self, targets: Sequence[float]) -> None:
        self.targets = tuple(targets)
        self.items: list[list[float]] = []
        self.n = 0.0

    def allowed(self, r: float) -> float:
        """The invariant: how much rank uncertainty is tolerated at rank ``r``."""
        n = self.n
        m = _INF
        for q in self.targets:
            if q * n <= r:
                f = 2 * EPSILON * r / q
            elif q < 1:
                f = 2 * EPSILON * (n - r) / (1 - q)
            else:  # q == 1 puts no bound below the maximum (Go divides by zero: +Inf)
                f = _INF
            if f < m:
                m = f
        return m

    def merge(self, samples: Iterable[Sequence[float]]) -> None:
        """Insert sorted ``(value, width, delta)`` samples, then compress."""
        old = self.items
        out: list[list[float]] = []
        i = 0
        r = 0.0
        for value, width, delta in samples:
            while i < len(old) and old[i][0] <= value:
                out.append(old[i])
                r += old[i][1]
                i += 1
            if i < len(old):
                f = self.allowed(r)
                d = max(delta, math.floor(f) - 1) if f != _INF else _INF
            else:
                d = 0.0  # a new maximum is known exactly
            out.append([value, width, d])
            self.n += width
            r += width
        out.extend(old[i:])
        self.items = out
        self._compress()

    def _compress(self) -> None:
        items = self.items
        if len(items) < 2:
            return
        x = items[-1]
        kept = [x]
        r = self.n - 1 - x[1]
        for c in reversed(items[:-1]):
            if c[1] + x[1] + x[2] <= self.allowed(r):
                x[1] += c[1]  # c folds into its larger neighbour
            else:
                x = c
                kept.append(c)
            r -= c[1]
        kept.reverse()
        self.items = kept

    def query(self, q: float) -> float:
        items = self.items
        if not items:
            return 0.0
        t = float(math.ceil(q * self.n))
        f = self.allowed(t)
        t = _INF if f == _INF else t + math.ceil(f / 2)
        p = items[0]
        r = 0.0
        for c in items[1:]:
            r += p[1]
            if r + c[1] + c[2] > t:
                return p[0]
            p = c
        return p[0]


class Stream:
    """A targeted quantile stream: a buffer of raw samples in front of a summary."""

    __slots__ = ("buffer", "summary")

    def __init__(self, targets: Sequence[float]) -> None:
        self.buffer: list[float] = []
        self.summary = _Summary(targets)

    def insert(self, value: float) -> None:
        buffer = self.buffer
        buffer.append(value)
        if len(buffer) >= BUFFER_SIZE:
            self._flush()

    def _flush(self) -> None:
        buffer = self.buffer
        buffer.sort()
        self.summary.merge([(v, 1.0, 0.0) for v in buffer])
        buffer.clear()

    def count(self) -> int:
        return len(self.buffer) + int(self.summary.n)

    def samples(self) -> list[tuple[float, float, float]]:
        """Everything seen, as ``(value, width, delta)`` (raw while nothing was folded yet)."""
        if not self.summary.items:
            return [(v, 1.0, 0.0) for v in self.buffer]
        if self.buffer:
            self._flush()
        return [(v, w, d) for v, w, d in self.summary.items]

    def merge(self, samples: list[tuple[float, float, float]]) -> None:
        self.summary.merge(sorted(samples))

    def query(self, q: float) -> float:
        if not self.summary.items:
            # nothing folded yet: the exact answer from the raw samples
            n = len(self.buffer)
            if n == 0:
                return 0.0
            self.buffer.sort()
            i = math.ceil(n * q)
            return self.buffer[i - 1 if i > 0 else 0]
        if self.buffer:
            self._flush()
        return self.summary.query(q)

    def reset(self) -> None:
        self.buffer.clear()
        self.summary = _Summary(self.summary.targets)


class Quantile:
    """Latencies of the last ``window`` seconds, in two halves that take turns.

    ``insert`` is called once per finished message; every ``window / 2``
    seconds the older half is dropped and starts again, so a result always
    covers between half a window and a whole one.
    """

    __slots__ = ("percentiles", "move_every", "last_move", "_next_move", "streams", "index",
                 "current")

    def __init__(self, window: float, percentiles: Sequence[float], now: float) -> None:
        self.percentiles = tuple(percentiles)
        self.move_every = window / 2
        self.last_move = now
        self._next_move = now + self.move_every
        self.streams = (Stream(self.percentiles), Stream(self.percentiles))
        self.index = 0
        self.current = self.streams[0]

    def insert(self, now: float, start_ns: int) -> None:
        """Record a message published at ``start_ns`` (ns) and finished at ``now`` (s)."""
        if now > self._next_move:
            self._move(now)
        self.current.insert(now * 1e9 - start_ns)

    def _move(self, now: float) -> None:
        """nsqd's moveWindow, once for every half window that has passed.

        Each move makes the older half current and empties it; after two
        moves both halves are empty, so a long idle spell costs no more.
        """
        step = self.move_every
        if step <= 0:  # a zero window never moves (nsqd would spin forever)
            return
        moves = max(0, math.ceil((now - self.last_move) / step) - 1)
        if moves >= 2:
            for stream in self.streams:
                stream.reset()
            self.index ^= moves % 2
        else:
            for _ in range(moves):
                self.index ^= 1
                self.streams[self.index].reset()
        self.current = self.streams[self.index]
        self.last_move += moves * step
        self._next_move = self.last_move + step

    def merge(self, other: Quantile) -> None:
        """Fold another channel's halves into this one's, half for half (nsqd's Merge)."""
        mine, theirs = self.index, other.index
        self.streams[mine].merge(other.streams[theirs].samples())
        self.streams[mine ^ 1].merge(other.streams[theirs ^ 1].samples())
        if self.last_move < other.last_move:
            self.last_move = other.last_move
            self._next_move = self.last_move + self.move_every

    def result(self, now: float) -> dict[str, Any]:
        """``{"count": n, "percentiles": [{"quantile": q, "value": ns}, ...]}`` as nsqd's /stats."""
        if now > self._next_move:
            self._move(now)
        merged = Stream(self.percentiles)
        merged.merge(self.streams[0].samples())
        merged.merge(self.streams[1].samples())
        return {
            "count": merged.count(),
            "percentiles": [{"quantile": _number(float(q)), "value": _number(float(merged.query(q)))}
                            for q in self.percentiles],
        }


def aggregate(quantiles: Iterable[Quantile | None], window: float,
              percentiles: Sequence[float], now: float) -> dict[str, Any]:
    """A topic's latency: its channels' windows merged (nsqd's AggregateChannelE2eProcessingLatency)."""
    total: Quantile | None = None
    for q in quantiles:
        if q is None:
            continue
        if total is None:
            total = Quantile(window, percentiles, now)
        total.merge(q)
    if total is None:
        return empty_result()
    return total.result(now)
