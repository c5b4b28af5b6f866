"""nsqlookupd's HTTP API (v1.3.0) on Klein: discovery for consumers, administration for nsqadmin.

Answers are shaped by the same Go ``http_api`` helpers nsqd's API uses
(:class:`~nsqtw.http.base.GoHTTPAPI`): 200 with the JSON (or nothing) from the
handler, anything else ``{"message":"CODE"}``, and httprouter's redirects,
405s and 404s for paths without a route.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from twisted.internet.defer import ensureDeferred

from nsqtw import NSQD_VERSION
from nsqtw.http.base import APIError, GoHTTPAPI, route
from nsqtw.http.metrics import MetricsPage
from nsqtw.lookupd.db import Registration
from nsqtw.lookupd.lookupd import NSQLookupd
from nsqtw.lookupd.metrics import LookupdMetrics
from nsqtw.names import is_valid_channel_name, is_valid_topic_name

__all__ = ["LookupdHTTPAPI", "ROUTES"]

#: every route nsqlookupd v1.3.0 answers (the /debug/pprof ones excepted), with its methods
ROUTES: dict[str, tuple[str, ...]] = {
    "/ping": ("GET",),
    "/info": ("GET",),
    "/debug": ("GET",),
    "/lookup": ("GET",),
    "/topics": ("GET",),
    "/channels": ("GET",),
    "/nodes": ("GET",),
    "/topic/create": ("POST",),
    "/topic/delete": ("POST",),
    "/channel/create": ("POST",),
    "/channel/delete": ("POST",),
    "/topic/tombstone": ("POST",),
    # nsqtw only: Prometheus (docs/metrics.md)
    "/metrics": ("GET",),
}


_Handler = TypeVar("_Handler", bound=Callable[..., Any])


def _route(path: str) -> Callable[[_Handler], _Handler]:
    """:func:`nsqtw.http.base.route` with the methods of :data:`ROUTES`."""
    return route(path, ROUTES[path])


class LookupdHTTPAPI(GoHTTPAPI):
    """nsqlookupd's HTTP API over one :class:`~nsqtw.lookupd.lookupd.NSQLookupd`."""

    routes = ROUTES
    direct_routes = {b"/ping": "ping"}

    def __init__(self, lookupd: NSQLookupd, metrics: MetricsPage | None = None) -> None:
        self.lookupd = lookupd
        if metrics is None:
            counts = LookupdMetrics(lookupd)
            metrics = MetricsPage(counts.collector, counts.prepare)
        self.metrics_page = metrics

    # -- arguments (Go's ReqParams.Get and GetTopicChannelArgs) ----------------------

    def _arg(self, request: Any, name: str) -> str:
        values = self._params(request)
        if name not in values:
            raise APIError(400, f"MISSING_ARG_{name.upper()}")
        return values[name][0]

    def _topic_channel(self, request: Any) -> tuple[str, str]:
        topic = self._arg(request, "topic")
        if not is_valid_topic_name(topic):
            raise APIError(400, "INVALID_ARG_TOPIC")
        channel = self._arg(request, "channel")
        if not is_valid_channel_name(channel):
            raise APIError(400, "INVALID_ARG_CHANNEL")
        return topic, channel

    # -- routes -------------------------------------------------------------------------

    @_route("/ping")
    def ping(self, request: Any) -> bytes:
        """Go's PlainText answer: ``OK``, sniffed as text, without nsq's content-type header."""
        self._log_request(request, 200)
        return self._write(request, 200, b"OK", b"text/plain; charset=utf-8")

    @_route("/info")
    def info(self, request: Any) -> Any:
        return self._run(request, lambda _: {"version": NSQD_VERSION})

    @_route("/metrics")
    def metrics(self, request: Any) -> Any:
        """Prometheus text (or OpenMetrics, by ``Accept``); see :mod:`nsqtw.lookupd.metrics`."""
        return ensureDeferred(self._serve_metrics(request, self.metrics_page))

    @_route("/debug")
    def debug(self, request: Any) -> Any:
        return self._run(request, self._debug)

    def _debug(self, request: Any) -> dict[str, Any]:
        """Every registration with its producers, as nsqlookupd dumps its map (keys sorted)."""
        out: dict[str, list[dict[str, Any]]] = {}
        for k, producers in self.lookupd.db.registrations.items():
            for p in producers.values():
                peer = p.peer
                out.setdefault(f"{k.category}:{k.key}:{k.subkey}", []).append({
                    "broadcast_address": peer.broadcast_address,
                    "hostname": peer.hostname,
                    "http_port": peer.http_port,
                    "id": peer.id,
                    "last_update": peer.last_update,
                    "tcp_port": peer.tcp_port,
                    "tombstoned": p.tombstoned,
                    "tombstoned_at": p.tombstoned_at,
                    "version": peer.version,
                })
        return dict(sorted(out.items()))

    @_route("/lookup")
    def lookup(self, request: Any) -> Any:
        return self._run(request, self._lookup)

    def _lookup(self, request: Any) -> dict[str, Any]:
        topic = self._arg(request, "topic")
        db = self.lookupd.db
        if not db.find_registrations("topic", topic, ""):
            raise APIError(404, "TOPIC_NOT_FOUND")
        channels = [k.subkey for k in db.find_registrations("channel", topic, "*")]
        producers = self.lookupd.active(db.find_producers("topic", topic, ""))
        return {"channels": channels, "producers": [p.peer.json() for p in producers]}

    @_route("/topics")
    def topics(self, request: Any) -> Any:
        return self._run(request, self._topics)

    def _topics(self, request: Any) -> dict[str, Any]:
        return {"topics": [k.key for k in self.lookupd.db.find_registrations("topic", "*", "")]}

    @_route("/channels")
    def channels(self, request: Any) -> Any:
        return self._run(request, self._channels)

    def _channels(self, request: Any) -> dict[str, Any]:
        topic = self._arg(request, "topic")
        found = self.lookupd.db.find_registrations("channel", topic, "*")
        return {"channels": [k.subkey for k in found]}

    @_route("/nodes")
    def nodes(self, request: Any) -> Any:
        return self._run(request, self._nodes)

    def _nodes(self, request: Any) -> dict[str, Any]:
        """Every active node with its topics and, per topic, whether it is tombstoned."""
        lookupd = self.lookupd
        db = lookupd.db
        lifetime = lookupd.options.tombstone_lifetime
        now = lookupd.now_ns()
        nodes = []
        # tombstoned nodes are listed too (with their tombstones)
        for client in lookupd.active(db.find_producers("client", "", ""), tombstone_lifetime=0):
            peer = client.peer
            topics = [k.key for k in db.lookup_registrations(peer.id) if k.category == "topic"]
            tombstones = []
            for t in topics:
                p = db.registrations.get(Registration("topic", t, ""), {}).get(peer.id)
                tombstones.append(p is not None and p.is_tombstoned(now, lifetime))
            nodes.append({
                "remote_address": peer.remote_address,
                "hostname": peer.hostname,
                "broadcast_address": peer.broadcast_address,
                "tcp_port": peer.tcp_port,
                "http_port": peer.http_port,
                "version": peer.version,
                "tombstones": tombstones,
                "topics": topics,
            })
        return {"producers": nodes}

    @_route("/topic/create")
    def topic_create(self, request: Any) -> Any:
        return self._run(request, self._topic_create)

    def _topic_create(self, request: Any) -> None:
        topic = self._arg(request, "topic")
        if not is_valid_topic_name(topic):
            raise APIError(400, "INVALID_ARG_TOPIC")
        self.lookupd.create_topic(topic)

    @_route("/topic/delete")
    def topic_delete(self, request: Any) -> Any:
        return self._run(request, lambda r: self.lookupd.delete_topic(self._arg(r, "topic")))

    @_route("/topic/tombstone")
    def topic_tombstone(self, request: Any) -> Any:
        return self._run(request, self._topic_tombstone)

    def _topic_tombstone(self, request: Any) -> None:
        topic = self._arg(request, "topic")
        node = self._arg(request, "node")
        self.lookupd.tombstone(topic, node)

    @_route("/channel/create")
    def channel_create(self, request: Any) -> Any:
        return self._run(request, lambda r: self.lookupd.create_channel(*self._topic_channel(r)))

    @_route("/channel/delete")
    def channel_delete(self, request: Any) -> Any:
        return self._run(request, self._channel_delete)

    def _channel_delete(self, request: Any) -> None:
        if not self.lookupd.delete_channel(*self._topic_channel(request)):
            raise APIError(404, "CHANNEL_NOT_FOUND")
