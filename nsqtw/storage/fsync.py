"""How long fsync takes on this node: a histogram filled on the disk threads without a lock.

fsync is the slowest thing a disk queue or journal does and the first to
show a failing or overloaded disk, so ``/metrics`` exports its latency
(``nsqd_fsync_duration_seconds``).  The service hands :meth:`FsyncLatency.fsync`
to every disk queue and journal as their ``fsync_fn``: it times the real
``os.fsync`` on the disk thread that called it and counts the duration in
that thread's own cell.  Each cell is written by one thread only, so
recording takes no lock and never waits for a scrape; a scrape adds the cells
up (copying a list is atomic under the GIL).
"""

from __future__ import annotations

import errno
import os
import threading
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass

from nsqtw.storage.groupsync import load_syncfs

__all__ = ["BUCKETS", "FsyncLatency", "LatencyHistogram"]

_SYNCFS: list[Callable[[int], None]] = []


def _syncfs() -> Callable[[int], None]:
    if not _SYNCFS:
        found = load_syncfs()
        if found is None:
            raise OSError(errno.ENOSYS, "syncfs is not available here")
        _SYNCFS.append(found)
    return _SYNCFS[0]

#: upper bounds (seconds) of the buckets: a healthy SSD is below 5 ms, a struggling disk in seconds
BUCKETS: tuple[float, ...] = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                              1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class LatencyHistogram:
    """A copy of the counts: ``counts[i]`` durations at most ``bounds[i]`` (cumulative), plus the rest."""

    bounds: tuple[float, ...]
    #: cumulative, one per bound, then the total (the ``+Inf`` bucket)
    cumulative: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        return self.cumulative[-1]


class _Cell:
    """One thread's counts; only that thread writes them."""

    __slots__ = ("counts", "sum")

    def __init__(self, size: int) -> None:
        self.counts = [0] * size
        self.sum = 0.0


class FsyncLatency:
    """Times every fsync handed to it; :meth:`histogram` is the node-wide total so far."""

    def __init__(self, bounds: tuple[float, ...] = BUCKETS,
                 timer: Callable[[], float] = time.perf_counter) -> None:
        self.bounds = bounds
        self._timer = timer
        self._local = threading.local()
        self._cells: list[_Cell] = []

    def fsync(self, fd: int) -> None:
        """``os.fsync(fd)``, timed; a failing fsync is counted too (with how long it took to fail)."""
        started = self._timer()
        try:
            os.fsync(fd)  # looked up at each call, so a test that patches os.fsync still reaches it
        finally:
            self.record(self._timer() - started)

    def syncfs(self, fd: int) -> None:
        """``syncfs(fd)``, the one sync of a graceful stop's queues (:mod:`nsqtw.storage.groupsync`), timed
        as an fsync; only where :func:`~nsqtw.storage.groupsync.load_syncfs` finds it."""
        started = self._timer()
        try:
            _syncfs()(fd)
        finally:
            self.record(self._timer() - started)

    def record(self, seconds: float) -> None:
        """Count one duration in the calling thread's cell (no lock: one writer per cell)."""
        cell: _Cell | None = getattr(self._local, "cell", None)
        if cell is None:
            cell = _Cell(len(self.bounds) + 1)
            self._local.cell = cell
            self._cells.append(cell)  # list.append is atomic under the GIL
        cell.counts[bisect_left(self.bounds, seconds)] += 1
        cell.sum += seconds

    def histogram(self) -> LatencyHistogram:
        """Every thread's counts added up (a scrape may miss a duration being recorded right now)."""
        totals = [0] * (len(self.bounds) + 1)
        total_sum = 0.0
        for cell in list(self._cells):
            counts = list(cell.counts)
            total_sum += cell.sum
            for i, n in enumerate(counts):
                totals[i] += n
        cumulative = []
        running = 0
        for n in totals:
            running += n
            cumulative.append(running)
        return LatencyHistogram(self.bounds, tuple(cumulative), total_sum)
