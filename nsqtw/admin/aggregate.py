"""Go nsqadmin's JSON shapes, built from the nodes' ``/stats``: per node, and summed over the cluster.

Pure functions over decoded JSON (no I/O), so they can run off the reactor
thread on a big cluster's answers. Field names and order are those of
nsqadmin v1.3.0's ``clusterinfo`` types; whatever a node leaves out (an
older nsqd) reads as Go's zero value.

nsqtw's addition: a node run with ``--replicas=2`` tells, per topic, where the
topic's copies are (``replica``) and, for itself, what it holds for others
(``standby``) and its counters; those become new keys (``replica`` on a node's
topic entry, :func:`node_replication` for the node answer) only where a node
reports them, so answers over Go nsqd or ``--replicas=1`` are Go's.

One deliberate difference: Go's topic answer reuses the first answering
node's channel entry as the cluster total, so that node's own row shows the
totals and the total's ``nodes`` leaves that node out (which node depends on
who answers first). Here totals are always new entries and every node keeps
its own numbers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "channel_entry",
    "client_entry",
    "counter_stats",
    "node_replication",
    "node_topic_entry",
    "replica_entry",
    "sort_by_host",
    "sum_channel",
    "sum_topic",
    "topic_channels",
]

_NS = 1_000_000_000


def _int(d: Mapping[str, Any], key: str) -> int:
    value = d.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0
    return int(value)


def _str(d: Mapping[str, Any], key: str) -> str:
    value = d.get(key)
    return value if isinstance(value, str) else ""


def _bool(d: Mapping[str, Any], key: str) -> bool:
    return d.get(key) is True


def _list(d: Mapping[str, Any], key: str) -> list[Any] | None:
    """A JSON array as Go decodes it into a slice: ``null`` (or missing) stays nil."""
    value = d.get(key)
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else None


def sort_by_host(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Go's sort by hostname; ties (every node on one host) by node address, so answers are stable."""
    return sorted(entries, key=lambda e: (e.get("hostname", ""), e.get("node", "")))


# --- end-to-end latency --------------------------------------------------------


def e2e_node(raw: Any) -> dict[str, Any]:
    """A node's e2e percentiles as nsqadmin decodes them: min, max and average are the value."""
    raw = raw if isinstance(raw, dict) else {}
    count = _int(raw, "count")
    percentiles = None
    if isinstance(raw.get("percentiles"), list):
        percentiles = []
        for p in raw["percentiles"]:
            if not isinstance(p, dict):
                continue
            entry = {k: float(v) for k, v in p.items()
                     if isinstance(v, (int, float)) and not isinstance(v, bool)}
            value = entry.get("value", 0.0)
            entry.update(min=value, max=value, average=value, count=float(count))
            percentiles.append(dict(sorted(entry.items())))  # Go marshals map keys sorted
    return {"count": count, "percentiles": percentiles, "topic": _str(raw, "topic"),
            "channel": _str(raw, "channel"), "host": _str(raw, "host")}


def _e2e_add(total: dict[str, Any], e2: Mapping[str, Any] | None) -> None:
    """nsqadmin's E2eProcessingLatencyAggregate.Add: counts summed, averages weighted."""
    total["host"] = "*"
    if not e2:
        return
    total["count"] += e2.get("count", 0)
    for value in e2.get("percentiles") or ():
        ps = total["percentiles"]
        found = None
        for p in ps or ():
            if p.get("quantile", 0.0) == value.get("quantile", 0.0):
                found = p
                break
        if found is None:
            found = {"quantile": value.get("quantile", 0.0)}
            ps = total["percentiles"] = (ps or []) + [found]
        found["max"] = max(value.get("max", 0.0), found.get("max", 0.0))
        # as nsqadmin: the minimum is taken of the maxima
        found["min"] = min(value.get("max", 0.0), found.get("max", 0.0))
        found["count"] = found.get("count", 0.0) + value.get("count", 0.0)
        if found["count"] == 0:
            found["average"] = 0.0
            continue
        delta = value.get("average", 0.0) - found.get("average", 0.0)
        found["average"] = found.get("average", 0.0) + delta * value.get("count", 0.0) / found["count"]
    if total["percentiles"] is not None:
        total["percentiles"] = [dict(sorted(p.items())) for p in total["percentiles"]]


def _e2e_total(topic: str, channel: str) -> dict[str, Any]:
    return {"count": 0, "percentiles": None, "topic": topic, "channel": channel, "host": "*"}


# --- per node --------------------------------------------------------------------


def client_entry(node: str, raw: Mapping[str, Any], now: float) -> dict[str, Any]:
    """One consumer connection, in nsqadmin's ClientStats order; ``connected`` in nanoseconds."""
    connect_ts = _int(raw, "connect_ts")
    return {
        "node": node,
        "remote_address": _str(raw, "remote_address"),
        "version": _str(raw, "version"),
        "client_id": _str(raw, "client_id"),
        "hostname": _str(raw, "hostname"),
        "user_agent": _str(raw, "user_agent"),
        "connect_ts": connect_ts,
        "connected": (int(now) - connect_ts) * _NS,
        "in_flight_count": _int(raw, "in_flight_count"),
        "ready_count": _int(raw, "ready_count"),
        "finish_count": _int(raw, "finish_count"),
        "requeue_count": _int(raw, "requeue_count"),
        "message_count": _int(raw, "message_count"),
        "sample_rate": _int(raw, "sample_rate"),
        "deflate": _bool(raw, "deflate"),
        "snappy": _bool(raw, "snappy"),
        "authed": _bool(raw, "authed"),
        "auth_identity": _str(raw, "auth_identity"),
        "auth_identity_url": _str(raw, "auth_identity_url"),
        "tls": _bool(raw, "tls"),
        "tls_cipher_suite": _str(raw, "tls_cipher_suite"),
        "tls_version": _str(raw, "tls_version"),
        "tls_negotiated_protocol": _str(raw, "tls_negotiated_protocol"),
        "tls_negotiated_protocol_is_mutual": _bool(raw, "tls_negotiated_protocol_is_mutual"),
    }


def channel_entry(node: str, hostname: str, topic: str, raw: Mapping[str, Any],
                  now: float) -> dict[str, Any]:
    """One node's channel, as nsqadmin shows it (memory depth is depth minus backend depth)."""
    depth, backend = _int(raw, "depth"), _int(raw, "backend_depth")
    clients = _list(raw, "clients")
    return {
        "node": node,
        "hostname": hostname,
        "topic_name": topic,
        "channel_name": _str(raw, "channel_name"),
        "depth": depth,
        "memory_depth": depth - backend,
        "backend_depth": backend,
        "in_flight_count": _int(raw, "in_flight_count"),
        "deferred_count": _int(raw, "deferred_count"),
        "requeue_count": _int(raw, "requeue_count"),
        "timeout_count": _int(raw, "timeout_count"),
        "message_count": _int(raw, "message_count"),
        "client_count": _int(raw, "client_count"),
        "nodes": None,
        "clients": None if clients is None else [client_entry(node, c, now) for c in clients],
        "paused": _bool(raw, "paused"),
        "e2e_processing_latency": e2e_node(raw.get("e2e_processing_latency")),
    }


def node_topic_entry(node: str, hostname: str, raw: Mapping[str, Any], now: float) -> dict[str, Any]:
    """One node's topic with its channels (and, from a ``--replicas=2`` node, its ``replica``)."""
    depth, backend = _int(raw, "depth"), _int(raw, "backend_depth")
    name = _str(raw, "topic_name")
    channels = _list(raw, "channels")
    entry: dict[str, Any] = {
        "node": node,
        "hostname": hostname,
        "topic_name": name,
        "depth": depth,
        "memory_depth": depth - backend,
        "backend_depth": backend,
        "message_count": _int(raw, "message_count"),
        "nodes": None,
        "channels": None if channels is None else [
            channel_entry(node, hostname, name, c, now) for c in channels],
        "paused": _bool(raw, "paused"),
        "e2e_processing_latency": e2e_node(raw.get("e2e_processing_latency")),
    }
    if isinstance(raw.get("replica"), dict):
        entry["replica"] = replica_entry(raw["replica"])
    return entry


# --- replication (nsqtw's --replicas=2; Go nsqd and --replicas=1 report none of it) -------------

#: the states a topic's replica can be in (anything else a node says reads as "none")
REPLICA_STATES = ("in_sync", "catching_up", "connecting", "none")

_NODE_REPLICATION = ("replica_refused", "unreplicated", "takeovers", "standby")


def replica_entry(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A topic's ``replica`` as a node reports it: the peer holding its copies (``host:http_port``
    or None), its state, the publishes it has not acknowledged and the oldest one's lag."""
    peer = raw.get("peer")
    state = raw.get("state")
    return {"peer": peer if isinstance(peer, str) and peer else None,
            "state": state if state in REPLICA_STATES else "none",
            "unacked": _int(raw, "unacked"), "lag_ms": _int(raw, "lag_ms")}


def node_replication(raw: Any) -> dict[str, Any] | None:
    """A ``--replicas=2`` node's own replication: its counters and what it holds for other nodes
    (``standby``: owner, topic, messages, bytes, disk bytes, taken over), or None when the node's
    ``/stats`` has none of it (Go nsqd, ``--replicas=1``)."""
    if not isinstance(raw, dict) or not any(k in raw for k in _NODE_REPLICATION):
        return None
    standby = [{"owner": _str(s, "owner"), "topic": _str(s, "topic"), "messages": _int(s, "messages"),
                "bytes": _int(s, "bytes"), "disk_bytes": _int(s, "disk_bytes"),
                "taken_over": _bool(s, "taken_over")}
               for s in _list(raw, "standby") or ()]
    return {"replica_refused": _int(raw, "replica_refused"), "unreplicated": _int(raw, "unreplicated"),
            "takeovers": _int(raw, "takeovers"),
            "standby": sorted(standby, key=lambda s: (s["owner"], s["topic"]))}


# --- cluster totals -----------------------------------------------------------------

_CHANNEL_SUMS = ("depth", "memory_depth", "backend_depth", "in_flight_count", "deferred_count",
                 "requeue_count", "timeout_count", "message_count", "client_count")


def sum_channel(topic: str, channel: str, per_node: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A channel over every node (nsqadmin's channel answer): sums, each node, every client."""
    total: dict[str, Any] = {
        "node": "*" if per_node else "", "hostname": "", "topic_name": topic,
        "channel_name": channel}
    for key in _CHANNEL_SUMS:
        total[key] = sum(n[key] for n in per_node)
    clients: list[dict[str, Any]] = []
    for n in per_node:
        clients.extend(n["clients"] or ())
    e2e = _e2e_total(topic, channel)
    for n in per_node:
        _e2e_add(e2e, n["e2e_processing_latency"])
    total.update(
        nodes=sort_by_host(list(per_node)) or None,
        clients=sorted(clients, key=lambda c: c["hostname"]) or None,
        paused=any(n["paused"] for n in per_node),
        e2e_processing_latency=e2e if per_node else None,
    )
    return total


def topic_channels(node_topics: Sequence[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The topic answer's channel totals, in the order nodes first show them.

    A channel on one node only is that node's entry, as in Go; on several, a
    total whose ``hostname`` and latency entry start from the first node's (as
    Go's, which adds the others into that entry).
    """
    order: list[str] = []
    by_name: dict[str, list[dict[str, Any]]] = {}
    for t in node_topics:
        for c in t["channels"] or ():
            if c["channel_name"] not in by_name:
                order.append(c["channel_name"])
                by_name[c["channel_name"]] = []
            by_name[c["channel_name"]].append(c)
    out = []
    for name in order:
        entries = by_name[name]
        if len(entries) == 1:
            out.append(entries[0])
            continue
        total = sum_channel(entries[0]["topic_name"], name, entries)
        total["hostname"] = entries[0]["hostname"]
        total["clients"] = None
        # Go's total starts from the first node's latency entry (its topic and channel are empty)
        e2e = dict(entries[0]["e2e_processing_latency"])
        e2e["percentiles"] = [dict(p) for p in e2e["percentiles"]] \
            if e2e["percentiles"] is not None else None
        for other in entries[1:]:
            _e2e_add(e2e, other["e2e_processing_latency"])
        total["e2e_processing_latency"] = e2e
        out.append(total)
    return out or None


def sum_topic(topic: str, node_topics: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A topic over every node (nsqadmin's topic answer, without its ``message``)."""
    total: dict[str, Any] = {"node": "*" if node_topics else "", "hostname": "", "topic_name": topic}
    for key in ("depth", "memory_depth", "backend_depth", "message_count"):
        total[key] = sum(t[key] for t in node_topics)
    e2e = _e2e_total(topic, "")
    for t in node_topics:
        _e2e_add(e2e, t["e2e_processing_latency"])
    total.update(
        nodes=sort_by_host(list(node_topics)) or None,
        channels=topic_channels(sort_by_host(list(node_topics))),
        paused=any(t["paused"] for t in node_topics),
        e2e_processing_latency=e2e if node_topics else None,
    )
    return total


def counter_stats(node_topics: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``/api/counter``: messages per topic:channel:node, keys sorted as Go marshals a map."""
    stats: dict[str, dict[str, Any]] = {}
    for t in node_topics:
        for c in t["channels"] or ():
            key = f"{t['topic_name']}:{c['channel_name']}:{c['node']}"
            entry = stats.setdefault(key, {"node": c["node"], "topic_name": t["topic_name"],
                                           "channel_name": c["channel_name"], "message_count": 0})
            entry["message_count"] += c["message_count"]
    return dict(sorted(stats.items()))
