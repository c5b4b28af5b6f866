"""nsqlookupd's ``/metrics`` (nsqtw only): its registrations as Prometheus metric families.

:meth:`LookupdMetrics.prepare` counts the registration DB on the reactor in
one pass over it (linear in registrations: a plain dictionary walk, a few
milliseconds for 10,000 channels; the figure is in docs/metrics.md) and
keeps the counts as plain data; :class:`LookupdCollector` turns them into
metric families on the scrape's worker thread (:mod:`nsqtw.http.metrics`).
A producer counts as nsqlookupd's ``/lookup`` counts it: pinged within
``--inactive-producer-timeout`` and, for a topic, not tombstoned.

``prometheus_client`` is imported by the first scrape's ``collect``, not
with this module: a lookupd that is never scraped never loads it
(``docs/performance.md``, Memory).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from nsqtw import NSQD_VERSION
from nsqtw.lookupd.lookupd import NSQLookupd

if TYPE_CHECKING:
    from prometheus_client.core import Metric

__all__ = ["LookupdCollector", "LookupdMetrics"]


class LookupdMetrics:
    """Counts one nsqlookupd's registrations for a scrape and hands them to :attr:`collector`."""

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.collector = LookupdCollector()

    def prepare(self) -> None:
        self.collector.snapshot = self.counts()

    def counts(self) -> dict[str, Any]:
        """Nodes, topics and channels as plain numbers (one pass over the registrations)."""
        lookupd = self.lookupd
        now = lookupd.now_ns()
        o = lookupd.options
        timeout_ns = round(o.inactive_producer_timeout * 1e9)
        lifetime = o.tombstone_lifetime
        nodes = 0
        topic_producers: dict[str, int] = {}
        topic_channels: dict[str, int] = {}
        for k, producers in lookupd.db.registrations.items():
            if k.category == "client":
                nodes += sum(1 for p in producers.values() if now - p.peer.last_update <= timeout_ns)
            elif k.category == "topic":
                topic_producers[k.key] = sum(
                    1 for p in producers.values()
                    if now - p.peer.last_update <= timeout_ns and not p.is_tombstoned(now, lifetime))
            elif k.category == "channel":
                topic_channels[k.key] = topic_channels.get(k.key, 0) + 1
        return {
            "start_time": lookupd.start_time,
            "now": lookupd.clock.seconds(),
            "producers": nodes,
            "topic_producers": topic_producers,
            "topic_channels": topic_channels,
        }


class LookupdCollector:
    """The metric families of the last counts (:attr:`snapshot`); reads nothing else."""

    def __init__(self) -> None:
        self.snapshot: Mapping[str, Any] | None = None

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

        snap = self.snapshot
        if snap is None:
            return
        info = InfoMetricFamily("nsqlookupd", "This nsqlookupd's version (always 1).", labels=["version"])
        info.add_metric([NSQD_VERSION], {})
        yield info
        start = float(snap["start_time"])
        topic_producers: Mapping[str, int] = snap["topic_producers"]
        topic_channels: Mapping[str, int] = snap["topic_channels"]
        for name, doc, value in (
            ("nsqlookupd_start_time_seconds", "When nsqlookupd started, in seconds since the epoch.", start),
            ("nsqlookupd_uptime_seconds", "Seconds since nsqlookupd started.", max(0.0, snap["now"] - start)),
            ("nsqlookupd_producers", "nsqd nodes registered and pinging within --inactive-producer-timeout.",
             snap["producers"]),
            ("nsqlookupd_topics", "Topics registered (as /topics lists them).", len(topic_producers)),
            ("nsqlookupd_channels", "Channels registered, all topics together.", sum(topic_channels.values())),
        ):
            gauge = GaugeMetricFamily(name, doc)
            gauge.add_metric([], float(value))
            yield gauge
        producers = GaugeMetricFamily("nsqlookupd_topic_producers",
                                      "Active, not tombstoned nsqd nodes of the topic (as /lookup lists them).",
                                      labels=["topic"])
        for topic, n in sorted(topic_producers.items()):
            producers.add_metric([topic], float(n))
        channels = GaugeMetricFamily("nsqlookupd_topic_channels", "Channels registered for the topic.",
                                     labels=["topic"])
        for topic in sorted(topic_producers.keys() | topic_channels.keys()):
            channels.add_metric([topic], float(topic_channels.get(topic, 0)))
        yield from (f for f in (producers, channels) if f.samples)
