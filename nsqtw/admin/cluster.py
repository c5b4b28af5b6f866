"""What nsqadmin asks the cluster: topics, producers and stats from nsqlookupd or nsqd, and actions.

Each query runs against every configured address at once. As in nsqadmin's
``clusterinfo``, a query that fails on *every* address raises
:class:`QueryFailed` (the API answers 502 ``UPSTREAM_ERROR: ...``); one that
fails on some returns what it got plus the errors, which the API shows as
``WARNING: ...`` next to the partial result. Errors are listed in address
order (Go lists them as answers arrive).

Node addresses are data from the registrations, which nobody vouches for: a
node's address is its broadcast address and HTTP port joined as Go joins
them (``[::1]:4151``), and the client checks every URL before asking it, so
an odd registration is one failed request like a dead node, never a failed
answer. Actions report each request they made (:class:`ActionReport`): once
one has changed something, the answer says what happened where instead of
failing as a whole.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote_plus

from twisted.internet.defer import ensureDeferred, gatherResults

from nsqtw.admin.aggregate import node_replication, node_topic_entry, sort_by_host
from nsqtw.admin.client import AdminHTTPClient, UpstreamError
from nsqtw.net.listen import join_host_port

__all__ = ["ActionReport", "ClusterInfo", "Errors", "QueryFailed", "producer_http_address"]

_T = TypeVar("_T")

#: errors of a partial answer, each Go's text for one failed request
Errors = list[str]


class QueryFailed(Exception):
    """Every address failed: ``failed to query any nsqlookupd: ...`` (the API's 502)."""


@dataclass
class ActionReport:
    """What an action did: one result per request (``node``, ``request``, ``ok``, ``error``) and every failure."""

    results: list[dict[str, Any]] = field(default_factory=list)
    errors: Errors = field(default_factory=list)

    def add(self, address: str, request: str, error: str | None) -> None:
        self.results.append({"node": address, "request": request, "ok": error is None,
                             "error": error or ""})
        if error is not None:
            self.errors.append(error)


def _semver(text: str) -> tuple[int, int, int, int]:
    """Enough of semver to order versions: a pre-release sorts before its release."""
    m = re.match(r"^v?(\d+)\.(\d+)\.(\d+)(-)?", text or "")
    if not m:
        return (0, 0, 0, 1)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3)), 0 if m.group(4) else 1)


def producer_http_address(p: dict[str, Any]) -> str:
    """nsqadmin's HTTPAddress: where a producer's HTTP API is, the node's name in answers."""
    return join_host_port(p.get("broadcast_address", ""), p.get("http_port", 0))


def _producer_tcp_address(p: dict[str, Any]) -> str:
    return join_host_port(p.get("broadcast_address", ""), p.get("tcp_port", 0))


def _producer(raw: Any, topics: list[dict[str, Any]] | None) -> dict[str, Any]:
    """nsqadmin's Producer in its JSON field order."""
    raw = raw if isinstance(raw, dict) else {}
    return {
        "remote_addresses": None,
        "remote_address": raw.get("remote_address", "") if isinstance(raw.get("remote_address"), str) else "",
        "hostname": raw.get("hostname", "") if isinstance(raw.get("hostname"), str) else "",
        "broadcast_address": raw.get("broadcast_address", "")
        if isinstance(raw.get("broadcast_address"), str) else "",
        "tcp_port": raw.get("tcp_port", 0) if isinstance(raw.get("tcp_port"), int) else 0,
        "http_port": raw.get("http_port", 0) if isinstance(raw.get("http_port"), int) else 0,
        "version": raw.get("version", "") if isinstance(raw.get("version"), str) else "",
        "topics": topics,
        "out_of_date": False,
    }


def _strings(data: Any, key: str) -> list[str]:
    value = data.get(key) if isinstance(data, dict) else None
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


class ClusterInfo:
    """nsqadmin's view of one cluster, through its lookupds or directly through its nodes."""

    def __init__(self, client: AdminHTTPClient, clock: Any) -> None:
        self.client = client
        self.clock = clock

    # -- plumbing ------------------------------------------------------------------

    async def _each(self, items: Sequence[_T],
                    fn: Callable[[_T], Awaitable[Any]]) -> list[tuple[_T, Any, str | None]]:
        """Run ``fn`` on every item at once: (item, result, error text or None), in item order."""
        async def one(item: _T) -> tuple[_T, Any, str | None]:
            try:
                return item, await fn(item), None
            except UpstreamError as e:
                return item, None, str(e)

        return list(await gatherResults([ensureDeferred(one(i)) for i in items]))

    @staticmethod
    def _check(what: str, results: Sequence[tuple[Any, Any, str | None]]) -> Errors:
        errors = [e for _, _, e in results if e is not None]
        if len(errors) == len(results):
            raise QueryFailed(f"failed to query any {what}: " + "\n".join(errors))
        return errors

    # -- lookupd queries ---------------------------------------------------------------

    async def lookupd_topics(self, lookupds: Sequence[str]) -> tuple[list[str], Errors]:
        results = await self._each(lookupds, lambda a: self.client.get_json(f"http://{a}/topics"))
        errors = self._check("nsqlookupd", results)
        topics = {t for _, data, e in results if e is None for t in _strings(data, "topics")}
        return sorted(topics), errors

    async def lookupd_topic_channels(self, topic: str,
                                     lookupds: Sequence[str]) -> tuple[list[str], Errors]:
        q = quote_plus(topic)
        results = await self._each(
            lookupds, lambda a: self.client.get_json(f"http://{a}/channels?topic={q}"))
        errors = self._check("nsqlookupd", results)
        channels = {c for _, data, e in results if e is None for c in _strings(data, "channels")}
        return sorted(channels), errors

    async def lookupd_producers(self, lookupds: Sequence[str]) -> tuple[list[dict[str, Any]], Errors]:
        """Every node any lookupd knows, merged by TCP address; older versions marked out of date."""
        results = await self._each(lookupds, lambda a: self.client.get_json(f"http://{a}/nodes"))
        errors = self._check("nsqlookupd", results)
        by_addr: dict[str, dict[str, Any]] = {}
        producers: list[dict[str, Any]] = []
        for addr, data, e in results:
            if e is not None:
                continue
            raw_list = data.get("producers") if isinstance(data, dict) else None
            for raw in raw_list if isinstance(raw_list, list) else ():
                if not isinstance(raw, dict):
                    continue
                names = _strings(raw, "topics")
                tomb: list[Any] = raw.get("tombstones") or []
                if not isinstance(tomb, list):
                    tomb = []
                topics = [{"topic": t, "tombstoned": bool(tomb[i]) if i < len(tomb) else False}
                          for i, t in enumerate(names)] or None
                p = _producer(raw, topics)
                key = _producer_tcp_address(p)
                known = by_addr.get(key)
                if known is None:
                    if p["topics"]:
                        p["topics"].sort(key=lambda t: t["topic"])
                    by_addr[key] = known = p
                    producers.append(p)
                remote = p["remote_address"] or "N/A"
                known["remote_addresses"] = (known["remote_addresses"] or []) + [f"{addr}/{remote}"]
        newest = max((_semver(p["version"]) for p in producers), default=(0, 0, 0, 1))
        for p in producers:
            p["out_of_date"] = _semver(p["version"]) < newest
        return sort_by_host_producers(producers), errors

    async def lookupd_topic_producers(self, topic: str,
                                      lookupds: Sequence[str]) -> tuple[list[dict[str, Any]], Errors]:
        q = quote_plus(topic)
        results = await self._each(
            lookupds, lambda a: self.client.get_json(f"http://{a}/lookup?topic={q}"))
        errors = self._check("nsqlookupd", results)
        producers: list[dict[str, Any]] = []
        seen: set[str] = set()
        for _, data, e in results:
            if e is not None:
                continue
            raw_list = data.get("producers") if isinstance(data, dict) else None
            for raw in raw_list if isinstance(raw_list, list) else ():
                p = _producer(raw, None)
                if producer_http_address(p) not in seen:
                    seen.add(producer_http_address(p))
                    producers.append(p)
        return producers, errors

    # -- nsqd queries --------------------------------------------------------------------

    async def _nsqd_producer(self, addr: str) -> dict[str, Any]:
        """One node as a producer, as nsqadmin's GetNSQDProducers asks: /info, then /stats."""
        info = await self.client.get_json(f"http://{addr}/info")
        stats = await self.client.get_json(f"http://{addr}/stats?format=json&include_clients=false")
        return self._as_producer(addr, info, stats)

    async def _nsqd_topic_producer(self, addr: str, topic: str) -> dict[str, Any] | None:
        """GetNSQDTopicProducers: /stats of the topic, then /info only where the topic is."""
        q = quote_plus(topic)
        stats = await self.client.get_json(
            f"http://{addr}/stats?format=json&topic={q}&include_clients=false")
        raw_topics = stats.get("topics") if isinstance(stats, dict) else None
        if not any(isinstance(t, dict) and t.get("topic_name") == topic for t in raw_topics or ()):
            return None
        info = await self.client.get_json(f"http://{addr}/info")
        return self._as_producer(addr, info, stats)

    @staticmethod
    def _as_producer(addr: str, info: Any, stats: Any) -> dict[str, Any]:
        info = dict(info) if isinstance(info, dict) else {}
        raw_topics = stats.get("topics") if isinstance(stats, dict) else None
        names = [t.get("topic_name", "") for t in raw_topics or () if isinstance(t, dict)]
        host, _, port = addr.rpartition(":")
        # a node too old to tell its broadcast address is reached where it was asked
        if not info.get("broadcast_address"):
            info["broadcast_address"] = host.strip("[]")
            info["http_port"] = int(port) if port.isdigit() else 0
        if not info.get("hostname"):
            info["hostname"] = host.strip("[]")
        return _producer(info, [{"topic": n, "tombstoned": False} for n in names] or None)

    async def nsqd_topics(self, nsqds: Sequence[str]) -> tuple[list[str], Errors]:
        results = await self._each(nsqds, lambda a: self.client.get_json(
            f"http://{a}/stats?format=json"))
        errors = self._check("nsqd", results)
        names: set[str] = set()
        for _, data, e in results:
            raw_topics = data.get("topics") if e is None and isinstance(data, dict) else None
            names.update(t["topic_name"] for t in raw_topics or ()
                         if isinstance(t, dict) and isinstance(t.get("topic_name"), str))
        return sorted(names), errors

    async def nsqd_producers(self, nsqds: Sequence[str],
                             topic: str | None = None) -> tuple[list[dict[str, Any]], Errors]:
        if topic is None:
            results = await self._each(nsqds, self._nsqd_producer)
        else:
            results = await self._each(nsqds, lambda a: self._nsqd_topic_producer(a, topic))
        errors = self._check("nsqd", results)
        return [p for _, p, e in results if e is None and p is not None], errors

    async def producers(self, lookupds: Sequence[str],
                        nsqds: Sequence[str]) -> tuple[list[dict[str, Any]], Errors]:
        if lookupds:
            return await self.lookupd_producers(lookupds)
        return await self.nsqd_producers(nsqds)

    async def topic_producers(self, topic: str, lookupds: Sequence[str],
                              nsqds: Sequence[str]) -> tuple[list[dict[str, Any]], Errors]:
        if lookupds:
            return await self.lookupd_topic_producers(topic, lookupds)
        return await self.nsqd_producers(nsqds, topic)

    async def topics(self, lookupds: Sequence[str], nsqds: Sequence[str]) -> tuple[list[str], Errors]:
        if lookupds:
            return await self.lookupd_topics(lookupds)
        return await self.nsqd_topics(nsqds)

    async def nsqd_stats(self, producers: Sequence[dict[str, Any]], topic: str = "",
                         channel: str = "", include_clients: bool = True,
                         replication: dict[str, dict[str, Any]] | None = None
                         ) -> tuple[list[dict[str, Any]], Errors]:
        """Every producer's topics (only ``topic``'s when given) as per-node entries.

        With ``replication``, each node that reports its own replication (``--replicas=2``)
        gets it there under its address (:func:`~nsqtw.admin.aggregate.node_replication`)."""
        query = "format=json"
        if topic:
            query += f"&topic={quote_plus(topic)}"
            if channel:
                query += f"&channel={quote_plus(channel)}"
        if not include_clients:
            query += "&include_clients=false"

        async def fetch(p: dict[str, Any]) -> Any:
            return await self.client.get_json(f"http://{producer_http_address(p)}/stats?{query}")

        results = await self._each(producers, fetch)
        errors = self._check("nsqd", results)
        now = self.clock.seconds()
        entries = []
        for p, data, e in results:
            if replication is not None and e is None:
                replicated = node_replication(data)
                if replicated is not None:
                    replication[producer_http_address(p)] = replicated
            raw_topics = data.get("topics") if e is None and isinstance(data, dict) else None
            for raw in raw_topics or ():
                if not isinstance(raw, dict) or (topic and raw.get("topic_name") != topic):
                    continue
                entry = node_topic_entry(producer_http_address(p), p["hostname"], raw, now)
                if channel and entry["channels"]:
                    entry["channels"] = [c for c in entry["channels"]
                                         if c["channel_name"] == channel]
                entries.append(entry)
        return sort_by_host(entries), errors

    # -- actions ---------------------------------------------------------------------

    async def _post_all(self, report: ActionReport, addrs: Sequence[str], path: str,
                        query: str) -> None:
        """POST ``path`` to every address at once; each outcome goes into ``report``."""
        done = await self._each(addrs, lambda a: self.client.post(f"http://{a}/{path}?{query}"))
        for addr, _, e in done:
            report.add(addr, path, e)

    async def tombstone_node_for_topic(self, topic: str, node: str,
                                       lookupds: Sequence[str]) -> ActionReport:
        """Tombstone ``node`` for ``topic`` on every lookupd, then delete the topic on the node."""
        report = ActionReport()
        q = f"topic={quote_plus(topic)}&node={quote_plus(node)}"
        await self._post_all(report, lookupds, "topic/tombstone", q)
        # the tombstones stand whatever the node says: a node that cannot be asked is reported
        [(_, producer, e)] = await self._each([node], self._nsqd_producer)
        if e is not None:
            report.add(node, "info", e)
        else:
            await self._post_all(report, [producer_http_address(producer)], "topic/delete",
                                 f"topic={quote_plus(topic)}")
        return report

    async def create_topic_channel(self, topic: str, channel: str,
                                   lookupds: Sequence[str]) -> ActionReport:
        report = ActionReport()
        await self._post_all(report, lookupds, "topic/create", f"topic={quote_plus(topic)}")
        if channel:
            q = f"topic={quote_plus(topic)}&channel={quote_plus(channel)}"
            await self._post_all(report, lookupds, "channel/create", q)
            try:
                producers, errs = await self.lookupd_topic_producers(topic, lookupds)
            except QueryFailed as e:  # after the creations above: say so, do not fail them
                producers, errs = [], [str(e)]
            report.errors += errs
            await self._post_all(report, [producer_http_address(p) for p in producers],
                                 "channel/create", q)
        return report

    async def delete_topic(self, topic: str, lookupds: Sequence[str],
                           nsqds: Sequence[str]) -> ActionReport:
        report = ActionReport()
        producers, report.errors = await self.topic_producers(topic, lookupds, nsqds)
        q = f"topic={quote_plus(topic)}"
        await self._post_all(report, lookupds, "topic/delete", q)
        await self._post_all(report, [producer_http_address(p) for p in producers], "topic/delete", q)
        return report

    async def delete_channel(self, topic: str, channel: str, lookupds: Sequence[str],
                             nsqds: Sequence[str]) -> ActionReport:
        report = ActionReport()
        producers, report.errors = await self.topic_producers(topic, lookupds, nsqds)
        q = f"topic={quote_plus(topic)}&channel={quote_plus(channel)}"
        await self._post_all(report, lookupds, "channel/delete", q)
        await self._post_all(report, [producer_http_address(p) for p in producers],
                             "channel/delete", q)
        return report

    async def topic_channel_action(self, action: str, topic: str, channel: str,
                                   lookupds: Sequence[str], nsqds: Sequence[str]) -> ActionReport:
        """pause, unpause or empty a topic (``channel`` empty) or channel on every node that has it."""
        report = ActionReport()
        producers, report.errors = await self.topic_producers(topic, lookupds, nsqds)
        what = "channel" if channel else "topic"
        q = f"topic={quote_plus(topic)}"
        if channel:
            q += f"&channel={quote_plus(channel)}"
        await self._post_all(report, [producer_http_address(p) for p in producers],
                             f"{what}/{action}", q)
        return report


def sort_by_host_producers(producers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Go sorts producers by hostname; ties by HTTP address, so answers are stable."""
    return sorted(producers, key=lambda p: (p["hostname"], producer_http_address(p)))

