"""One stats snapshot of an nsqd node, shaped exactly like Go nsqd's ``/stats``.

The same snapshot feeds ``/stats?format=json``, ``/stats?format=text`` and
(later) statsd, so every consumer sees the same numbers.  Field names, their
order, ``null`` versus ``[]`` and omitted fields follow nsqd v1.3.0
(``nsqd/stats.go``, ``nsqd/http.go``): tools such as nsqadmin and nsq_stat
parse this output.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Generator, Iterable, Mapping
from datetime import datetime
from operator import attrgetter
from typing import Any, TypeVar

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from nsqtw import NSQD_VERSION, version_banner
from nsqtw._go.duration import format_duration_ns
from nsqtw.observe.quantile import aggregate, empty_result

__all__ = [
    "VERSION_BANNER",
    "format_text",
    "go_duration",
    "memory_stats",
    "snapshot",
    "snapshot_steps",
]

#: the first line of nsqd's text stats (``version.String("nsqd")``), naming what built nsqtw
VERSION_BANNER = version_banner("nsqd")

#: client fields Go omits when empty (``omitempty``), in Go's order, after ``user_agent``
_OMITEMPTY_AUTH = ("authed", "auth_identity", "auth_identity_url")


# --- Go's formatting rules ------------------------------------------------------


#: Go's ``time.Duration.String()`` of integer nanoseconds (one implementation, in options)
go_duration = format_duration_ns


# --- memory ---------------------------------------------------------------------


class _GCPauses:
    """The last 256 garbage-collection pauses, as Go's ``MemStats.PauseNs`` ring keeps them."""

    def __init__(self) -> None:
        self.pauses: deque[int] = deque(maxlen=256)
        self._started = 0
        self.installed = False

    def install(self) -> None:
        if not self.installed:
            gc.callbacks.append(self._callback)
            self.installed = True

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter_ns()
        elif self._started:
            self.pauses.append(time.perf_counter_ns() - self._started)
            self._started = 0


_gc_pauses = _GCPauses()


_T = TypeVar("_T")
#: reactor time one slice of a /stats or /metrics snapshot or encoding may take
SLICE_SECONDS = 0.004


def _percentile(perc: float, values: list[int]) -> int:
    """nsqd's percentile: index floor(perc% * n + 0.5), clamped; 0 when empty."""
    n = len(values)
    if n == 0:
        return 0
    index = math.floor(perc / 100.0 * n + 0.5)
    return values[min(index, n - 1)]


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        try:
            import resource

            kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return kb * 1024 if sys.platform != "darwin" else kb
        except (ImportError, OSError):
            return 0


def memory_stats() -> dict[str, int]:
    """nsqd's ``memory`` block, filled with the closest CPython figures.

    heap_objects: memory blocks pymalloc holds (``sys.getallocatedblocks``);
    heap_in_use_bytes: resident set size; heap_idle_bytes and
    heap_released_bytes: 0 (CPython does not report them); gc_pause_usec_*:
    percentiles of the last 256 collection pauses, timed through
    ``gc.callbacks``; next_gc_bytes: allocations left before the next
    generation-0 collection (a count, not bytes); gc_total_runs: collections
    of every generation.
    """
    _gc_pauses.install()
    pauses = sorted(_gc_pauses.pauses)
    threshold0 = gc.get_threshold()[0]
    count0 = gc.get_count()[0]
    return {
        "heap_objects": sys.getallocatedblocks(),
        "heap_idle_bytes": 0,
        "heap_in_use_bytes": _rss_bytes(),
        "heap_released_bytes": 0,
        "gc_pause_usec_100": _percentile(100.0, pauses) // 1000,
        "gc_pause_usec_99": _percentile(99.0, pauses) // 1000,
        "gc_pause_usec_95": _percentile(95.0, pauses) // 1000,
        "next_gc_bytes": max(0, threshold0 - count0),
        "gc_total_runs": sum(s.get("collections", 0) for s in gc.get_stats()),
    }


# --- the snapshot -----------------------------------------------------------------


def _client_stats(client: Any, topic_filter: str) -> dict[str, Any]:
    """One client as nsqd's ClientStats, with the omitempty fields placed where Go puts them."""
    go_stats = getattr(client, "go_stats", None)
    if go_stats is not None:
        result: dict[str, Any] = go_stats(topic_filter)
        return result
    base = client.stats()
    pub_counts = [{"topic": t, "count": n} for t, n in getattr(client, "pub_counts", {}).items()
                  if not topic_filter or t == topic_filter]
    out: dict[str, Any] = {}
    for key, value in base.items():
        if key in _OMITEMPTY_AUTH or key == "pub_counts":
            continue
        out[key] = value
        if key == "user_agent":
            for auth_key in _OMITEMPTY_AUTH:
                auth_value = base.get(auth_key)
                if auth_value:
                    out[auth_key] = auth_value
            if pub_counts:
                out["pub_counts"] = pub_counts
    return out


def _is_producer(client: Any) -> bool:
    return bool(getattr(client, "pub_counts", None))


def _topic_stats(topic: Any, channels: list[Any] | None, now: float) -> dict[str, Any]:
    return _topic_fields(topic.name, channels, topic.depth(), topic.backend.depth(), topic.message_count,
                         topic.message_bytes, bool(topic.paused), _topic_e2e(topic, now))


def _topic_e2e(topic: Any, now: float) -> dict[str, Any]:
    o = topic.options
    if not o.e2e_processing_latency_percentile:
        return empty_result()
    # every channel of the topic counts, whatever the channel filter (as nsqd)
    return aggregate([c.e2e for c in topic.channels.values()], o.e2e_processing_latency_window_time,
                     o.e2e_processing_latency_percentile, now)


def _topic_fields(name: Any, channels: Any, depth: Any, backend_depth: Any, message_count: Any,
                  message_bytes: Any, paused: Any, e2e: Any) -> dict[str, Any]:
    """A topic as nsqd's TopicStats: the one place its fields and their order are written
    (:mod:`nsqtw.observe.stats_json` makes its template from this too)."""
    return {
        "topic_name": name,
        "channels": channels,
        "depth": depth,
        "backend_depth": backend_depth,
        "message_count": message_count,
        "message_bytes": message_bytes,
        "paused": paused,
        "e2e_processing_latency": e2e,
    }


def _channel_stats(channel: Any, clients: list[Any] | None, now: float,
                   extras: bool = False) -> dict[str, Any]:
    counts = channel.stats_counts()
    e2e = channel.e2e.result(now) if channel.e2e is not None else empty_result()
    out = _channel_fields(channel.name, counts["depth"], counts["backend_depth"], counts["in_flight_count"],
                          counts["deferred_count"], counts["message_count"], counts["requeue_count"],
                          counts["timeout_count"], len(channel.clients), clients, bool(channel.paused), e2e)
    if extras:
        out["finish_count"] = counts.get("finish_count", 0)
    return out


def _channel_fields(name: Any, depth: Any, backend_depth: Any, in_flight_count: Any, deferred_count: Any,
                    message_count: Any, requeue_count: Any, timeout_count: Any, client_count: Any,
                    clients: Any, paused: Any, e2e: Any) -> dict[str, Any]:
    """A channel as nsqd's ChannelStats: the one place its fields and their order are written
    (:mod:`nsqtw.observe.stats_json` makes its template from this too)."""
    return {
        "channel_name": name,
        "depth": depth,
        "backend_depth": backend_depth,
        "in_flight_count": in_flight_count,
        "deferred_count": deferred_count,
        "message_count": message_count,
        "requeue_count": requeue_count,
        "timeout_count": timeout_count,
        "client_count": client_count,
        "clients": clients,
        "paused": paused,
        "e2e_processing_latency": e2e,
    }


class _DiskTotals:
    """What the node's disk queues report, added up while the snapshot walks them (``extras``)."""

    def __init__(self, segments_set_aside: int) -> None:
        # the node's own count, not a sum over the queues: those of a deleted topic stay counted
        self.segments_set_aside = segments_set_aside
        self.write_errors = 0
        self.unwritable = 0

    def add(self, backend: Any) -> None:
        self.write_errors += int(getattr(backend, "write_errors", 0))
        if getattr(backend, "write_error", None):
            self.unwritable += 1

    def as_dict(self) -> dict[str, int]:
        return {"segments_set_aside": self.segments_set_aside, "write_errors": self.write_errors,
                "unwritable_queues": self.unwritable}


def snapshot(nsqd: Any, topic: str | None = None, channel: str | None = None,
             include_clients: bool = True, include_mem: bool = True) -> dict[str, Any]:
    """The node's stats as nsqd's ``/stats?format=json`` object (key order included).

    ``topic``/``channel`` narrow the result as nsqd does: an unknown topic
    gives ``"topics": null`` and ``"producers": null``; a topic without that
    channel is left out.  Without ``include_clients`` every channel's
    ``clients`` and the ``producers`` are ``null``; without ``include_mem``
    there is no ``memory`` key.
    """
    return run_to_end(snapshot_steps(nsqd, topic, channel, include_clients, include_mem))


def snapshot_steps(nsqd: Any, topic: str | None = None, channel: str | None = None,
                   include_clients: bool = True, include_mem: bool = True,
                   extras: bool = False) -> Generator[None, None, dict[str, Any]]:
    """:func:`snapshot`, one channel per step: a caller may run the steps over several reactor turns.

    The generator yields after each channel and returns the snapshot.  Run to
    the end without pause it is exactly :func:`snapshot`.  Run in slices, each
    channel's figures are consistent with each other but not with the other
    channels' (the node moves on between slices); a topic or channel deleted
    meanwhile is left out.  The result shares nothing with the live node.

    ``extras`` (``/metrics`` only; ``/stats`` keeps Go's shape) adds each
    channel's ``finish_count`` and an ``nsqtw`` block: the disk queues'
    totals, the node's client count and precise start time, and the time of
    the snapshot.  ``/stats?format=json`` writes the same walk straight as
    text (:func:`nsqtw.observe.stats_json.stats_json_steps`).
    """
    topic = topic or ""
    now = nsqd.clock.seconds()
    disk = _DiskTotals(nsqd.segments_set_aside()) if extras else None
    topics: list[dict[str, Any]] | None = None
    producers: list[dict[str, Any]] | None = None
    chosen = chosen_topics(nsqd, topic)
    if chosen is not None:
        topics = []
        for t in chosen:
            chans = chosen_channels(t, channel or "")
            if chans is None:
                continue
            channel_stats = []
            for c in chans:
                if t.channels.get(c.name) is not c:
                    continue  # deleted between two slices
                clients = [_client_stats(cl, topic) for cl in list(c.clients.values())] if include_clients else None
                channel_stats.append(_channel_stats(c, clients, now, extras))
                if disk is not None:
                    disk.add(c.backend)
                yield None
            if nsqd.topics.get(t.name) is not t:
                continue
            topics.append(_topic_stats(t, channel_stats, now))
            if disk is not None:
                disk.add(t.backend)
        if include_clients:
            chosen_producers = yield from producer_clients(nsqd)
            producers = [_client_stats(cl, topic) for cl in chosen_producers] or None
    out = node_stats(nsqd, topics, producers, include_mem)
    if disk is not None:
        out["nsqtw"] = {
            "disk": disk.as_dict(),
            "clients": len(nsqd.clients),
            "producers": sum(1 for cl in list(nsqd.clients.values()) if _is_producer(cl)),
            "start_time": float(getattr(nsqd, "start_time_precise", nsqd.start_time)),
            "now": now,
        }
        replication = getattr(nsqd, "replication", None)
        if replication is not None:  # --replicas=2
            out["nsqtw"]["replication"] = {
                "node": replication.node_stats(),
                "topics": {t["topic_name"]: replication.topic_stats(t["topic_name"]) for t in topics or ()
                           if t["topic_name"] in nsqd.topics and not nsqd.topics[t["topic_name"]].ephemeral},
            }
    return out


def chosen_topics(nsqd: Any, topic: str) -> list[Any] | None:
    """The topics a snapshot walks, by name; None when ``topic`` names none (Go's ``"topics": null``)."""
    if topic:
        return [nsqd.topics[topic]] if topic in nsqd.topics else None
    return [nsqd.topics[n] for n in sorted(nsqd.topics)]


def chosen_channels(topic: Any, channel: str) -> list[Any] | None:
    """A topic's channels a snapshot walks, by name; None when the topic lacks ``channel`` (left out)."""
    if channel:
        return [topic.channels[channel]] if channel in topic.channels else None
    return [topic.channels[n] for n in sorted(topic.channels)]


#: clients looked at per step when looking for the producers (a node may hold tens of thousands)
_CLIENTS_PER_STEP = 2048
#: a client's publish counts (true when it published)
_pub_counts = attrgetter("pub_counts")


def producer_clients(nsqd: Any) -> Generator[None, None, list[Any]]:
    """The node's clients that published, a few thousand looked at per step."""
    clients = list(nsqd.clients.values())
    chosen: list[Any] = []
    for start in range(0, len(clients), _CLIENTS_PER_STEP):
        some = clients[start:start + _CLIENTS_PER_STEP]
        try:
            # at C speed: at 15,000 consumers a Python call per client was a tenth of /stats
            found = list(filter(_pub_counts, some))
        except AttributeError:  # a client kind without pub_counts
            found = [cl for cl in some if _is_producer(cl)]
        chosen += found
        yield None
    return chosen


def node_stats(nsqd: Any, topics: Any, producers: Any, include_mem: bool) -> dict[str, Any]:
    """The snapshot's top level around its ``topics`` and ``producers``, in nsqd's order."""
    out: dict[str, Any] = {
        "version": NSQD_VERSION,
        "health": nsqd.health(),
        "start_time": int(nsqd.start_time),
        "topics": topics,
    }
    if include_mem:
        out["memory"] = memory_stats()
    out["producers"] = producers
    set_aside = nsqd.segments_set_aside()
    if set_aside:
        # nsqtw only, present only when nonzero so a healthy node's /stats stays Go's shape
        out["segments_set_aside"] = set_aside
    return out


# --- the text format ----------------------------------------------------------------


def _rfc3339(ts: float) -> str:
    """Go's ``time.Format(time.RFC3339)`` in local time (``Z`` when local time is UTC)."""
    local = datetime.fromtimestamp(int(ts)).astimezone()
    offset = local.utcoffset()
    text = local.strftime("%Y-%m-%dT%H:%M:%S")
    if not offset:
        return text + "Z"
    minutes = int(offset.total_seconds()) // 60
    sign = "+" if minutes >= 0 else "-"
    minutes = abs(minutes)
    return f"{text}{sign}{minutes // 60:02d}:{minutes % 60:02d}"


def _nanoseconds_to_human(value: float) -> str:
    """nsqd's ``stringy.NanoSecondToHuman``: one decimal in the largest unit below the value."""
    if value > 1e9:
        return f"{value / 1e9:0.1f}s"
    if value > 1e6:
        return f"{value / 1e6:0.1f}ms"
    if value > 1e3:
        return f"{value / 1e3:0.1f}us"
    return f"{value:0.1f}ns"


def _e2e_text(e2e: Mapping[str, Any] | None) -> str:
    percentiles = (e2e or {}).get("percentiles") or []
    return ", ".join(_nanoseconds_to_human(float(p.get("value", 0))) for p in percentiles)


def _port(remote_address: str) -> str:
    host, sep, port = remote_address.rpartition(":")
    return port if sep and host else ""


def _client_line(client: Mapping[str, Any], now: float) -> str:
    """A client as Go's ``ClientV2Stats.String()``: producer form when it has pub_counts."""
    connected = go_duration(max(0, int(now - client["connect_ts"])) * 1_000_000_000)
    ident = f"{client['hostname']}:{_port(client['remote_address'])} {client['user_agent']}"
    pub_counts: Iterable[Mapping[str, Any]] = client.get("pub_counts") or []
    if pub_counts:
        total = sum(p["count"] for p in pub_counts)
        topics = ",".join(f"{p['topic']}={p['count']}" for p in pub_counts)
        return (f"[{client['version']} {ident:<21}] msgs: {total:<8} topics: {topics} "
                f"connected: {connected}")
    return (f"[{client['version']} {ident:<21}] state: {client['state']} "
            f"inflt: {client['in_flight_count']:<4} rdy: {client['ready_count']:<4} "
            f"fin: {client['finish_count']:<8} re-q: {client['requeue_count']:<8} "
            f"msgs: {client['message_count']:<8} connected: {connected}")


_MEMORY_KEYS = ("heap_objects", "heap_idle_bytes", "heap_in_use_bytes", "heap_released_bytes",
                "gc_pause_usec_100", "gc_pause_usec_99", "gc_pause_usec_95", "next_gc_bytes",
                "gc_total_runs")


def format_text(snap: Mapping[str, Any], now: float, start_time: float | None = None) -> str:
    """The snapshot laid out as nsqd's ``/stats?format=text`` (column widths included).

    ``now`` is the current time; ``start_time`` (float seconds, defaults to the
    snapshot's whole-second ``start_time``) gives the ``uptime`` line its precision.
    """
    return run_to_end(text_steps(snap, now, start_time))


def text_steps(snap: Mapping[str, Any], now: float,
               start_time: float | None = None) -> Generator[None, None, str]:
    """:func:`format_text`, one channel per step (see :func:`run_in_slices`)."""
    start = snap["start_time"] if start_time is None else start_time
    uptime_ns = max(0, round((now - start) * 1e9))
    lines = [
        f"{VERSION_BANNER}\n",
        f"start_time {_rfc3339(snap['start_time'])}\n",
        f"uptime {go_duration(uptime_ns)}\n",
        f"\nHealth: {snap['health']}\n",
    ]
    memory = snap.get("memory")
    if memory is not None:
        lines.append("\nMemory:\n")
        for key in _MEMORY_KEYS:
            lines.append(f"   {key:<25}\t{memory[key]}\n")
    topics = snap.get("topics") or []
    lines.append("\nTopics:" if topics else "\nTopics: None\n")
    for t in topics:
        prefix = "*P " if t["paused"] else "   "
        lines.append(f"\n{prefix}[{t['topic_name']:<15}] depth: {t['depth']:<5} "
                     f"be-depth: {t['backend_depth']:<5} msgs: {t['message_count']:<8} "
                     f"e2e%: {_e2e_text(t['e2e_processing_latency'])}\n")
        for c in t["channels"]:
            prefix = "   *P " if c["paused"] else "      "
            lines.append(f"{prefix}[{c['channel_name']:<25}] depth: {c['depth']:<5} "
                         f"be-depth: {c['backend_depth']:<5} inflt: {c['in_flight_count']:<4} "
                         f"def: {c['deferred_count']:<4} re-q: {c['requeue_count']:<5} "
                         f"timeout: {c['timeout_count']:<5} msgs: {c['message_count']:<8} "
                         f"e2e%: {_e2e_text(c['e2e_processing_latency'])}\n")
            for client in c["clients"] or []:
                lines.append(f"        {_client_line(client, now)}\n")
            yield None
    producers = snap.get("producers") or []
    if not producers:
        lines.append("\nProducers: None\n")
    else:
        lines.append("\nProducers:\n")
        for i, client in enumerate(producers):
            lines.append(f"   {_client_line(client, now)}\n")
            if i % 64 == 63:
                yield None
    return "".join(lines)


def run_to_end(steps: Generator[None, None, _T]) -> _T:
    """Run a step generator without pause (the unsliced form of the same work)."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: _T = done.value
            return result


def run_in_slices(steps: Generator[None, None, _T], clock: IReactorTime,
                  budget: float = SLICE_SECONDS,
                  timer: Callable[[], float] = time.perf_counter) -> Deferred[_T]:
    """Run a generator's steps on the reactor, at most ``budget`` seconds per turn; fires with its result.

    Between two slices the reactor serves everything else (a ``callLater(0)``
    puts the next slice behind the events already waiting).  The first slice
    runs at once.
    """
    done: Deferred[_T] = Deferred()

    def turn() -> None:
        deadline = timer() + budget
        try:
            while True:
                next(steps)
                if timer() >= deadline:
                    break
        except StopIteration as finished:
            done.callback(finished.value)
            return
        except Exception:  # noqa: BLE001 - handed to the caller's errback
            done.errback()
            return
        clock.callLater(0, turn)

    turn()
    return done
