"""nsqd's ``/metrics`` families: one finished stats snapshot as Prometheus metric families.

What :class:`nsqtw.observe.metrics.NSQDCollector` yields on each scrape,
on the scrape's worker thread.  A module of its own so that
``prometheus_client`` is imported on the first scrape, not when nsqd
starts: an idle node never loads it (``docs/performance.md``, Memory).
docs/metrics.md lists every metric.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from itertools import chain
from typing import Any, cast

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.utils import floatToGoString

from nsqtw import NSQD_VERSION

__all__ = ["channel_families", "client_families", "families", "node_families", "thread_count", "topic_families"]

_TOPIC = ("topic",)
_CHANNEL = ("topic", "channel")
_CLIENT = ("topic", "channel", "client_id", "hostname", "remote_address")
_PRODUCER = ("topic", "client_id", "hostname", "remote_address")
_NS = 1e9

#: how Prometheus writes a float label (``le``, ``quantile``): Go's formatting (untyped in the library)
_go_float = cast(Callable[[float], str], floatToGoString)


def thread_count() -> int:
    """Threads of this process, Python's and any other (``/proc``), else the ones Python knows."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def families(snap: Mapping[str, Any]) -> Iterator[Metric]:
    """Every family of ``snap``, in the order nsqd's page lists them."""
    yield from node_families(snap)
    topics = snap.get("topics") or []
    found = chain(topic_families(topics), channel_families(topics))
    if (snap.get("nsqtw") or {}).get("per_client"):
        found = chain(found, client_families(topics, snap.get("producers") or []))
    # a family without series (no topic yet, no client) is left out rather than written empty
    yield from (f for f in found if f.samples)
    replication = (snap.get("nsqtw") or {}).get("replication")
    if replication is not None:
        yield from replication_families(replication)


def _gauge(name: str, doc: str, labels: Sequence[str] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _counter(name: str, doc: str, labels: Sequence[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


#: per-channel families: (name, help, snapshot key, kind); paused is a bool (1 while paused)
_CHANNEL_FAMILIES: tuple[tuple[str, str, str, Callable[[str, str, Sequence[str]],
                                                  GaugeMetricFamily | CounterMetricFamily]], ...] = (
    ("nsqd_channel_depth", "Messages queued in the channel (memory and disk).", "depth", _gauge),
    ("nsqd_channel_backend_depth", "Messages of the channel's queue that are on disk.", "backend_depth", _gauge),
    ("nsqd_channel_in_flight", "Messages sent to clients and not yet FINished, requeued or timed out.",
     "in_flight_count", _gauge),
    ("nsqd_channel_deferred", "Messages waiting for their defer or REQ delay.", "deferred_count", _gauge),
    ("nsqd_channel_clients", "Clients subscribed to the channel.", "client_count", _gauge),
    ("nsqd_channel_paused", "1 while the channel is paused.", "paused", _gauge),
    ("nsqd_channel_messages", "Messages the channel received from its topic.", "message_count", _counter),
    ("nsqd_channel_finished", "Messages FINished by the channel's clients.", "finish_count", _counter),
    ("nsqd_channel_requeued", "Messages REQueued by the channel's clients.", "requeue_count", _counter),
    ("nsqd_channel_timed_out", "Messages requeued because their timeout passed.", "timeout_count", _counter),
)


def _e2e(e2e: Mapping[str, Any] | None) -> list[tuple[str, float]]:
    """(quantile label, seconds) of a snapshot's e2e_processing_latency."""
    percentiles = (e2e or {}).get("percentiles") or []
    return [(_go_float(p["quantile"]), float(p["value"]) / _NS) for p in percentiles]


# -- the node ---------------------------------------------------------------

def node_families(snap: Mapping[str, Any]) -> Iterator[Metric]:
    extras = snap.get("nsqtw") or {}
    disk = extras.get("disk") or {}
    topics = snap.get("topics") or []
    info = InfoMetricFamily("nsqd", "This nsqd's version (always 1).", labels=["version"])
    info.add_metric([str(snap.get("version", NSQD_VERSION))], {})
    yield info
    healthy = _gauge("nsqd_healthy", "1 while /ping answers OK, 0 while the node reports an error.")
    healthy.add_metric([], 1.0 if snap["health"] == "OK" else 0.0)
    yield healthy
    start = float(extras.get("start_time", snap["start_time"]))
    started = _gauge("nsqd_start_time_seconds", "When the node started, in seconds since the epoch.")
    started.add_metric([], start)
    yield started
    uptime = _gauge("nsqd_uptime_seconds", "Seconds since the node started.")
    uptime.add_metric([], max(0.0, float(extras.get("now", start)) - start))
    yield uptime
    for name, doc, value in (
        ("nsqd_topics", "Topics on the node.", len(topics)),
        ("nsqd_channels", "Channels on the node, all topics together.",
         sum(len(t["channels"]) for t in topics)),
        ("nsqd_clients", "Connected TCP clients (consumers and producers).", extras.get("clients", 0)),
        ("nsqd_producers", "Connected TCP clients that have published.", extras.get("producers", 0)),
        # counted when the page is written (the writing thread included), unless the snapshot says
        ("nsqd_threads", "Threads of the nsqd process (the reactor, disk threads, others).",
         extras["threads"] if "threads" in extras else thread_count()),
        ("nsqd_disk_unwritable_queues", "Disk queues refusing writes right now (the node is unhealthy).",
         disk.get("unwritable_queues", 0)),
    ):
        gauge = _gauge(name, doc)
        gauge.add_metric([], float(value))
        yield gauge
    errors = _counter("nsqd_disk_write_errors",
                      "Failed writes of the disk queues that exist now, retries included.")
    errors.add_metric([], float(disk.get("write_errors", 0)))
    yield errors
    set_aside = _counter("nsqd_disk_segments_set_aside",
                         "Corrupt disk queue segments renamed to .bad and skipped since the node started.")
    set_aside.add_metric([], float(disk.get("segments_set_aside", snap.get("segments_set_aside", 0))))
    yield set_aside
    fsync = extras.get("fsync")
    if fsync is not None:
        hist = HistogramMetricFamily("nsqd_fsync_duration_seconds",
                                     "fsync calls of the disk queues and journals, timed on the disk threads.")
        bounds = [_go_float(b) for b in fsync["bounds"]] + ["+Inf"]
        hist.add_metric([], list(zip(bounds, (float(n) for n in fsync["cumulative"]), strict=True)),
                        float(fsync["sum"]))
        yield hist

# -- topics and channels ------------------------------------------------------

def topic_families(topics: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
    depth = _gauge("nsqd_topic_depth", "Messages queued in the topic (memory and disk).", _TOPIC)
    backend = _gauge("nsqd_topic_backend_depth", "Messages of the topic's queue that are on disk.", _TOPIC)
    channels = _gauge("nsqd_topic_channels", "Channels of the topic.", _TOPIC)
    paused = _gauge("nsqd_topic_paused", "1 while the topic is paused.", _TOPIC)
    messages = _counter("nsqd_topic_messages", "Messages published to the topic.", _TOPIC)
    nbytes = _counter("nsqd_topic_message_bytes", "Bytes of message bodies published to the topic.", _TOPIC)
    for t in topics:
        labels = [t["topic_name"]]
        depth.add_metric(labels, float(t["depth"]))
        backend.add_metric(labels, float(t["backend_depth"]))
        channels.add_metric(labels, float(len(t["channels"])))
        paused.add_metric(labels, 1.0 if t["paused"] else 0.0)
        messages.add_metric(labels, float(t["message_count"]))
        nbytes.add_metric(labels, float(t["message_bytes"]))
    yield from (depth, backend, channels, paused, messages, nbytes)
    yield from _e2e_families(
        "topic", "End-to-end latency (publish to FIN) over the window, all channels together, per quantile.",
        "FINs the topic's latency quantiles are computed over (the window's).", _TOPIC,
        (([t["topic_name"]], t.get("e2e_processing_latency")) for t in topics))

def channel_families(topics: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
    """One family at a time: each is built, written and dropped before the next.

    With 10,000 channels a family is 10,000 samples; holding them all at
    once would be half a million live objects for the garbage collector to
    walk (the long collections show up as reactor stalls).
    """
    for name, doc, key, make in _CHANNEL_FAMILIES:
        family = make(name, doc, _CHANNEL)
        for t in topics:
            topic = t["topic_name"]
            for c in t["channels"]:
                value = c.get(key, 0)
                family.add_metric([topic, c["channel_name"]], float(1 if value is True else value))
        yield family
    yield from _e2e_families(
        "channel", "End-to-end latency (publish to FIN) over the window, per quantile.",
        "FINs the channel's latency quantiles are computed over (the window's).", _CHANNEL,
        (([t["topic_name"], c["channel_name"]], c.get("e2e_processing_latency"))
         for t in topics for c in t["channels"]))


def _e2e_families(scope: str, latency_doc: str, samples_doc: str, labels: Sequence[str],
                  rows: Iterable[tuple[list[str], Mapping[str, Any] | None]]) -> tuple[Metric, Metric]:
    """The end-to-end latency quantiles of topics or channels, and how many FINs they cover."""
    e2e = _gauge(f"nsqd_{scope}_e2e_processing_latency_seconds", latency_doc, (*labels, "quantile"))
    samples = _gauge(f"nsqd_{scope}_e2e_processing_latency_samples", samples_doc, labels)
    for values, latency in rows:
        quantiles = _e2e(latency)
        for q, seconds in quantiles:
            e2e.add_metric([*values, q], seconds)
        if quantiles and latency is not None:
            samples.add_metric(values, float(latency["count"]))
    return e2e, samples

# -- clients (--metrics-per-client) -------------------------------------------

def client_families(topics: Sequence[Mapping[str, Any]],
             producers: Sequence[Mapping[str, Any]]) -> Iterator[Metric]:
    ready = _gauge("nsqd_client_ready", "The client's RDY count.", _CLIENT)
    in_flight = _gauge("nsqd_client_in_flight", "Messages in flight to the client.", _CLIENT)
    messages = _counter("nsqd_client_messages", "Messages sent to the client.", _CLIENT)
    finished = _counter("nsqd_client_finished", "Messages the client FINished.", _CLIENT)
    requeued = _counter("nsqd_client_requeued", "Messages the client REQueued.", _CLIENT)
    published = _counter("nsqd_client_published", "Messages the client published to the topic.", _PRODUCER)
    for t in topics:
        topic = t["topic_name"]
        for c in t["channels"]:
            for cl in c.get("clients") or []:
                labels = [topic, c["channel_name"], str(cl["client_id"]), cl["hostname"],
                          cl["remote_address"]]
                ready.add_metric(labels, float(cl["ready_count"]))
                in_flight.add_metric(labels, float(cl["in_flight_count"]))
                messages.add_metric(labels, float(cl["message_count"]))
                finished.add_metric(labels, float(cl["finish_count"]))
                requeued.add_metric(labels, float(cl["requeue_count"]))
    for p in producers:
        for pub in p.get("pub_counts") or []:
            published.add_metric([pub["topic"], str(p["client_id"]), p["hostname"], p["remote_address"]],
                                 float(pub["count"]))
    yield from (ready, in_flight, messages, finished, requeued, published)


# -- replication (--replicas=2) --------------------------------------------------

def replication_families(replication: Mapping[str, Any]) -> Iterator[Metric]:
    """``--replicas=2``: what the node refused or took over, each topic's replica, the copies it holds."""
    node = replication["node"]
    for name, doc, key in (
        ("nsqtw_replica_refused", "Publishes refused because no replica acknowledged their copy in time.",
         "replica_refused"),
        ("nsqtw_replica_unreplicated", "Publishes no replica could be chosen for: held by this node alone.",
         "unreplicated"),
        ("nsqtw_replica_takeovers", "Topics of lost nodes whose copies this node delivered.", "takeovers"),
        ("nsqtw_replica_taken_elsewhere", "Messages of this node a replica said it delivered while this node was"
         " away: not delivered here.", "taken_elsewhere"),
    ):
        counter = _counter(name, doc)
        counter.add_metric([], float(node.get(key, 0)))
        yield counter
    waiting = _gauge("nsqtw_replica_notes_waiting", "Messages taken over here whose owner, once back on its disk,"
                     " is still to be told of them.", ())
    waiting.add_metric([], float(node.get("notes_waiting", 0)))
    yield waiting
    in_sync = _gauge("nsqtw_topic_replica_in_sync", "1 while the topic's replica is connected and acking.",
                     ("topic", "peer"))
    unacked = _gauge("nsqtw_topic_replica_unacked", "Publishes of the topic its replica has not acked yet.",
                     _TOPIC)
    lag = _gauge("nsqtw_topic_replica_lag_seconds", "Age of the topic's oldest publish its replica has not acked.",
                 _TOPIC)
    for topic, r in sorted(replication["topics"].items()):
        in_sync.add_metric([topic, r["peer"] or ""], 1.0 if r["state"] == "in_sync" else 0.0)
        unacked.add_metric([topic], float(r["unacked"]))
        lag.add_metric([topic], float(r["lag_ms"]) / 1000)
    messages = _gauge("nsqtw_standby_messages", "Copies this node holds for another node's topic.",
                      ("owner", "topic"))
    nbytes = _gauge("nsqtw_standby_bytes", "Body bytes of the copies this node holds for another node's topic.",
                    ("owner", "topic"))
    for s in node.get("standby", ()):
        messages.add_metric([s["owner"], s["topic"]], float(s["messages"]))
        nbytes.add_metric([s["owner"], s["topic"]], float(s["bytes"]))
    yield from (f for f in (in_sync, unacked, lag, messages, nbytes) if f.samples)
