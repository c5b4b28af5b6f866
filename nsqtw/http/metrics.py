"""``/metrics`` for nsqd and nsqlookupd: one CollectorRegistry per daemon, written off the reactor.

Each daemon has one :class:`MetricsPage` (its HTTP and HTTPS listeners share
it): a ``prometheus_client`` registry of its own (never the library's global
one) holding the daemon's collector and the library's process, platform and
garbage-collector collectors.  A scrape runs in two steps, one scrape at a
time:

1. ``prepare()`` on the reactor: the daemon's collector takes its snapshot
   (nsqd's in bounded slices, see :mod:`nsqtw.observe.metrics`);
2. on a worker thread: ``prometheus_client`` collects the registry and writes
   the Prometheus text format, or OpenMetrics when the ``Accept`` header asks
   for it (its own ``choose_encoder`` decides).

The reactor thread never formats a sample, so a node with 10,000 channels
keeps serving clients during a scrape (docs/metrics.md has the figures).

The registry is made, and ``prometheus_client`` imported, on the first
scrape: a node nobody scrapes never loads the library (its exposition module
pulls in snappy, gzip and wsgiref), see ``docs/performance.md``, Memory.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred, DeferredLock, ensureDeferred, maybeDeferred

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.registry import Collector

__all__ = ["MetricsPage", "in_reactor_thread_pool"]

#: runs a function on a worker thread; fires with its result
ThreadRunner = Callable[[Callable[[], Any]], Deferred[Any]]


def in_reactor_thread_pool(fn: Callable[[], Any]) -> Deferred[Any]:
    """Twisted's ``deferToThread`` (the reactor's thread pool, started on first use)."""
    from twisted.internet.threads import deferToThread

    return deferToThread(fn)


class MetricsPage:
    """One daemon's ``/metrics``: its registry, and a scrape that formats off the reactor.

    ``prepare`` (called on the reactor before each scrape, may return a
    Deferred) brings ``collector`` up to date; ``run_in_thread`` runs the
    formatting (tests pass one that runs it at once).
    """

    def __init__(self, collector: Collector, prepare: Callable[[], Deferred[None] | None],
                 run_in_thread: ThreadRunner = in_reactor_thread_pool) -> None:
        self._collector = collector
        self._registry: CollectorRegistry | None = None
        self._prepare = prepare
        self._run_in_thread = run_in_thread
        # one scrape at a time: the collector holds the snapshot of the scrape in progress
        self._lock = DeferredLock()

    @property
    def registry(self) -> CollectorRegistry:
        """The daemon's registry: made at the first scrape (or first look), then kept."""
        if self._registry is None:
            from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector

            registry = CollectorRegistry(auto_describe=False)
            ProcessCollector(registry=registry)
            PlatformCollector(registry=registry)
            GCCollector(registry=registry)
            registry.register(self._collector)
            self._registry = registry
        return self._registry

    def render(self, accept: str) -> Deferred[tuple[bytes, str]]:
        """The exposition for an ``Accept`` header: (body, Content-Type)."""
        return self._lock.run(lambda: ensureDeferred(self._render(accept)))

    async def _render(self, accept: str) -> tuple[bytes, str]:
        from prometheus_client.exposition import choose_encoder

        await maybeDeferred(self._prepare)
        encoder, content_type = choose_encoder(accept)
        registry = self.registry
        body: bytes = await self._run_in_thread(lambda: encoder(registry))
        return body, content_type
