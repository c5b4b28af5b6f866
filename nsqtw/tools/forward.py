"""Pieces ``to-http`` and ``to-nsq`` share: choosing a destination, and nsq_to_http's status lines."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from nsqtw.tools.common import GoLog

__all__ = ["MODES", "Destinations", "TimerMetrics"]

#: --mode values: round-robin, hostpool (Go's default) and epsilon-greedy (treated as hostpool)
MODES = ("round-robin", "hostpool", "epsilon-greedy")

#: go-hostpool's retry schedule for a host that failed: 30s, doubling, at most 900s
_RETRY_INITIAL = 30.0
_RETRY_MAX = 900.0


class Destinations:
    """Which address gets the next message.

    ``round-robin`` takes them in turn (a counter, first increment then
    index, as nsq_to_http's). ``hostpool``/``epsilon-greedy`` also take
    them in turn but skip a host that failed until its retry time (30s,
    doubling to 900s), as go-hostpool's standard pool; when every host is
    marked down they are all tried again.
    """

    def __init__(self, addresses: Sequence[str], mode: str, clock: Any) -> None:
        self.addresses = list(addresses)
        self.pool = mode in ("hostpool", "epsilon-greedy")
        self.clock = clock
        self.counter = 0
        self._down: dict[str, tuple[float, float]] = {}  # address -> (retry at, current delay)

    def pick(self) -> str:
        n = len(self.addresses)
        if not self.pool:
            self.counter += 1
            return self.addresses[self.counter % n]
        now = self.clock.seconds()
        for _ in range(n):
            address = self.addresses[self.counter % n]
            self.counter += 1
            down = self._down.get(address)
            if down is None or down[0] <= now:
                return address
        self._down.clear()  # all down: try them all again
        return self.pick()

    def mark(self, address: str, ok: bool) -> None:
        """Record the result of a request to ``address`` (hostpool modes only)."""
        if not self.pool:
            return
        if ok:
            self._down.pop(address, None)
            return
        delay = min(self._down.get(address, (0.0, _RETRY_INITIAL / 2))[1] * 2, _RETRY_MAX)
        self._down[address] = (self.clock.seconds() + delay, delay)


class TimerMetrics:
    """nsq_to_http's (bitly/timer_metrics) status: every N requests, their 99th/95th percentile and mean."""

    def __init__(self, every: int, prefix: str, log: GoLog) -> None:
        self.every = every
        self.prefix = prefix
        self.log = log
        self.durations: list[float] = []
        if 0 < every < 100:
            log.printf(f"Warning: use more than 100 status values for accurate percentiles (configured with {every})")

    def status(self, started: float, now: float) -> None:
        if self.every <= 0:
            return
        self.durations.append(now - started)
        if len(self.durations) < self.every:
            return
        values = sorted(self.durations)
        self.durations = []

        def pct(p: float) -> float:
            return values[max(0, min(len(values) - 1, math.ceil(p * len(values)) - 1))] * 1000

        avg = sum(values) / len(values) * 1000
        self.log.printf(f"{self.prefix} finished {len(values)} - 99th: {pct(0.99):.2f}ms - 95th: {pct(0.95):.2f}ms"
                        f" - avg: {avg:.2f}ms")
