"""nsqd's ``/metrics``: the stats snapshot as Prometheus metric families (nsqtw only).

Two halves, so a scrape never stalls the reactor however many channels the
node has:

* :class:`NSQDMetrics` takes the snapshot on the reactor in slices
  (:func:`~nsqtw.observe.stats.snapshot_steps`, a few milliseconds of work
  per reactor turn, see :func:`run_in_slices`).  The result is plain data
  that shares nothing with the live node.
* :class:`NSQDCollector` turns that finished snapshot into metric families
  (:mod:`nsqtw.observe.families`, imported on the first scrape: a node
  nobody scrapes never loads ``prometheus_client``).  It only reads the
  snapshot, so ``prometheus_client`` can run it (and write the exposition
  text) on a worker thread; see :mod:`nsqtw.http.metrics`.

Series are per node, per topic and per channel, so their number is bounded by
topics × channels; per-client series exist only with ``--metrics-per-client``.
docs/metrics.md lists every metric.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from nsqtw.observe.stats import SLICE_SECONDS, run_in_slices, snapshot_steps

if TYPE_CHECKING:
    from prometheus_client.core import Metric

__all__ = ["SLICE_SECONDS", "NSQDCollector", "NSQDMetrics", "run_in_slices"]

class NSQDMetrics:
    """Takes the node's snapshot for a scrape and hands it to :attr:`collector`.

    ``fsync`` returns the disk threads' fsync latency histogram
    (:meth:`nsqtw.storage.fsync.FsyncLatency.histogram`), None on a node
    without one; ``per_client`` is ``--metrics-per-client``.
    """

    def __init__(self, nsqd: Any, clock: IReactorTime, per_client: bool = False,
                 fsync: Callable[[], Any] | None = None, budget: float = SLICE_SECONDS) -> None:
        self.nsqd = nsqd
        self.clock = clock
        self.per_client = per_client
        self.fsync = fsync
        self.budget = budget
        self.collector = NSQDCollector()

    def prepare(self) -> Deferred[None]:
        """Take a fresh snapshot (in slices) and make it the one the collector reads."""
        steps = snapshot_steps(self.nsqd, include_clients=self.per_client, include_mem=False,
                               extras=True)
        d = run_in_slices(steps, self.clock, self.budget)
        return d.addCallback(self._taken)

    def _taken(self, snap: dict[str, Any]) -> None:
        extras = snap["nsqtw"]
        extras["per_client"] = self.per_client
        hist = self.fsync() if self.fsync is not None else None
        if hist is not None:
            extras["fsync"] = {"bounds": list(hist.bounds), "cumulative": list(hist.cumulative),
                               "sum": float(hist.sum)}
        self.collector.snapshot = snap


class NSQDCollector:
    """The metric families of one finished snapshot (:attr:`snapshot`); reads nothing else.

    ``snapshot`` is what :func:`~nsqtw.observe.stats.snapshot_steps` returns
    with ``extras=True``, plus ``nsqtw.per_client`` (per-client series
    wanted) and (optionally) ``nsqtw.fsync``; ``nsqtw.threads`` stands in for
    the live thread count (tests).  Before the first one it yields nothing.
    """

    def __init__(self) -> None:
        self.snapshot: Mapping[str, Any] | None = None

    def describe(self) -> list[Metric]:
        # the names depend on the snapshot; nothing to check for clashes at registration
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot
        if snap is None:
            return
        # imported at the first scrape, on its worker thread: prometheus_client stays out of an idle node
        from nsqtw.observe.families import families

        yield from families(snap)
