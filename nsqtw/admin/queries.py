"""nsqadmin's read-only JSON API: topics, channels, nodes, the counter, graphite's rates (and its
``/render`` proxy with ``--proxy-graphite``), and nsqtw's ``/api/history``.

A node or lookupd that fails makes the answer partial (``"message": "WARNING: ..."``), all failing
makes it a 502, as in nsqadmin; big answers are encoded on a worker thread."""

from __future__ import annotations

import base64
from typing import Any
from urllib.parse import unquote, urlencode, urlsplit

from nsqtw.admin.aggregate import counter_stats, sum_channel, sum_topic
from nsqtw.admin.client import UpstreamError
from nsqtw.admin.cluster import QueryFailed, producer_http_address
from nsqtw.admin.routes import ADMIN_APP, AdminBase, admin_route, warn_message
from nsqtw.http.base import APIError, Marshal


class AdminQueries(AdminBase):
    """The JSON API's GET routes, over :class:`~nsqtw.admin.cluster.ClusterInfo`."""

    @admin_route(ADMIN_APP, "/api/topics", ("GET",))
    def topics(self, request: Any) -> Any:
        return self._run(request, self._topics)

    async def _topics(self, request: Any) -> Any:
        params = self._params(request)
        try:
            topics, messages = await self.cluster.topics(self.lookupds, self.nsqds)
        except QueryFailed as e:
            raise self._upstream(e, "get topics") from None
        for m in messages:
            self.log.warn("{message}", message=m)
        if params.get("inactive", [""])[0] == "true":
            inactive: dict[str, list[str]] = {}
            for name in topics if self.lookupds else ():
                try:
                    producers, _ = await self.cluster.lookupd_topic_producers(name, self.lookupds)
                except QueryFailed:
                    producers = []
                if not producers:
                    try:
                        channels, _ = await self.cluster.lookupd_topic_channels(name, self.lookupds)
                    except QueryFailed:
                        channels = []
                    inactive[name] = channels
            return Marshal({"topics": inactive, "message": warn_message(messages)})
        return Marshal({"topics": topics, "message": warn_message(messages)})

    @admin_route(ADMIN_APP, "/api/topics/<topic>", ("GET",))
    def topic(self, request: Any, topic: str) -> Any:
        return self._run(request, self._topic, topic)

    async def _topic(self, request: Any, topic: str) -> Any:
        try:
            producers, messages = await self.cluster.topic_producers(topic, self.lookupds, self.nsqds)
        except QueryFailed as e:
            raise self._upstream(e, "get topic producers") from None
        try:
            entries, errs = await self.cluster.nsqd_stats(producers, topic, include_clients=False)
        except QueryFailed as e:
            raise self._upstream(e, "get topic metadata") from None
        messages += errs
        answer = sum_topic(topic, entries)
        answer["message"] = warn_message(messages)
        return await self._encode(answer)

    @admin_route(ADMIN_APP, "/api/topics/<topic>/<channel>", ("GET",))
    def channel(self, request: Any, topic: str, channel: str) -> Any:
        return self._run(request, self._channel, topic, channel)

    async def _channel(self, request: Any, topic: str, channel: str) -> Any:
        try:
            producers, messages = await self.cluster.topic_producers(topic, self.lookupds, self.nsqds)
        except QueryFailed as e:
            raise self._upstream(e, "get topic producers") from None
        try:
            entries, errs = await self.cluster.nsqd_stats(producers, topic, channel)
        except QueryFailed as e:
            raise self._upstream(e, "get channel metadata") from None
        messages += errs
        per_node = [c for t in entries for c in t["channels"] or () if c["channel_name"] == channel]
        answer: dict[str, Any] = {}
        if per_node:
            answer = sum_channel(topic, channel, per_node)
        answer["message"] = warn_message(messages)
        return await self._encode(answer)

    @admin_route(ADMIN_APP, "/api/nodes", ("GET",))
    def nodes(self, request: Any) -> Any:
        return self._run(request, self._nodes)

    async def _nodes(self, request: Any) -> Any:
        try:
            producers, messages = await self.cluster.producers(self.lookupds, self.nsqds)
        except QueryFailed as e:
            raise self._upstream(e, "get nodes") from None
        return Marshal({"nodes": producers or None, "message": warn_message(messages)})

    @admin_route(ADMIN_APP, "/api/nodes/<node>", ("GET",))
    def node(self, request: Any, node: str) -> Any:
        return self._run(request, self._node, node)

    async def _node(self, request: Any, node: str) -> Any:
        try:
            producers, messages = await self.cluster.producers(self.lookupds, self.nsqds)
        except QueryFailed as e:
            raise self._upstream(e, "get producers") from None
        found = [p for p in producers if producer_http_address(p) == node]
        if not found:
            raise APIError(404, "NODE_NOT_FOUND")
        replication: dict[str, dict[str, Any]] = {}
        try:
            entries, _ = await self.cluster.nsqd_stats(found[:1], replication=replication)
        except QueryFailed as e:
            self.log.error("failed to get nsqd stats - {error}", error=str(e))
            raise APIError(502, f"UPSTREAM_ERROR: {e}") from None
        total_clients = sum(len(c["clients"] or ()) for t in entries for c in t["channels"] or ())
        answer: dict[str, Any] = {
            "node": node,
            "topics": entries or None,
            "total_messages": sum(t["message_count"] for t in entries),
            "total_clients": total_clients,
        }
        if node in replication:  # nsqtw: only from a node run with --replicas=2
            answer["replication"] = replication[node]
        answer["message"] = warn_message(messages)
        return await self._encode(answer)

    @admin_route(ADMIN_APP, "/api/counter", ("GET",))
    def counter(self, request: Any) -> Any:
        return self._run(request, self._counter)

    async def _counter(self, request: Any) -> Any:
        try:
            producers, messages = await self.cluster.producers(self.lookupds, self.nsqds)
        except QueryFailed as e:
            raise self._upstream(e, "get counter producer list") from None
        try:
            entries, errs = await self.cluster.nsqd_stats(producers, include_clients=False)
        except QueryFailed as e:
            raise self._upstream(e, "get nsqd stats") from None
        messages += errs
        return Marshal({"stats": counter_stats(entries), "message": warn_message(messages)})

    @admin_route(ADMIN_APP, "/api/graphite", ("GET",))
    def graphite(self, request: Any) -> Any:
        return self._run(request, self._graphite)

    async def _graphite(self, request: Any) -> Any:
        values = self._params(request)
        if values.get("metric", [""])[0] != "rate":
            raise APIError(400, "INVALID_ARG_METRIC")
        if "target" not in values:
            raise APIError(400, "INVALID_ARG_TARGET")
        interval = int(self.options.statsd_interval)
        query = urlencode(sorted({"from": f"-{interval * 2}sec", "until": f"-{interval}sec",
                                  "format": "json", "target": values["target"][0]}.items()))
        url, headers = self._graphite_url(query)
        self.log.info("GRAPHITE: {url}", url=url)
        try:
            data = await self.client.get_json(url, headers)
            rate = data[0]["datapoints"][0][0]
            rate = float(rate)
        except (UpstreamError, LookupError, TypeError, ValueError) as e:
            self.log.error("graphite request failed - {error}", error=str(e))
            raise APIError(500, "INTERNAL_ERROR") from None
        text = "N/A" if rate < 0 else f"{rate / max(interval, 1):.2f}"
        return Marshal({"rate": text})

    @admin_route(ADMIN_APP, "/api/history", ("GET",))
    def history_route(self, request: Any) -> Any:
        return self._run(request, self._history)

    def _history(self, request: Any) -> Any:
        """nsqtw: the rate and depth series of the cluster, a topic or a channel."""
        values = self._params(request)
        topic = values.get("topic", [""])[0]
        channel = values.get("channel", [""])[0] if topic else ""
        history = self.history
        return Marshal({
            "topic": topic,
            "channel": channel,
            "interval": history.interval if history else 0,
            "window": history.window if history else 0,
            "points": history.get(topic, channel) if history else [],
            "error": history.last_error if history else "",
        })

    @admin_route(ADMIN_APP, "/render", ("GET",))
    def render_proxy(self, request: Any) -> Any:
        return self._run(request, self._render_proxy, logged=True)

    def _graphite_url(self, query: str) -> tuple[str, dict[str, str]]:
        """graphite's /render URL for ``query``, and the basic auth its --graphite-url carries."""
        target = urlsplit(self.options.graphite_url)
        host = target.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        netloc = f"{host}:{target.port}" if target.port else host
        path = target.path.rstrip("/")
        url = f"{target.scheme}://{netloc}{path}/render" + (f"?{query}" if query else "")
        headers = {}
        if target.username is not None:
            pair = f"{unquote(target.username)}:{unquote(target.password or '')}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        return url, headers

    async def _render_proxy(self, request: Any) -> Any:
        """--proxy-graphite: graphite's /render through the admin (with the URL's basic auth)."""
        _, _, query = request.uri.decode("latin-1").partition("?")
        url, headers = self._graphite_url(query)
        try:
            code, body = await self.client._request("Get", url, headers=headers)
        except UpstreamError as e:
            self.log.error("graphite proxy failed - {error}", error=str(e))
            raise APIError(502, "BAD_GATEWAY") from None
        request.setResponseCode(code)
        return body
