"""nsqadmin's HTTP server (v1.3.0) on Klein: the pages, their assets and the JSON API under ``/api/``.

Answers are shaped by the Go ``http_api`` helpers nsqd's API uses
(:class:`~nsqtw.http.base.GoHTTPAPI`): ``{"message": ...}`` errors, Go
strings written as they are, httprouter's redirects, 405s and 404s. Every
route lives under ``--base-path``. The cluster is asked through
:class:`~nsqtw.admin.cluster.ClusterInfo`; a node or lookupd that fails
makes the answer partial (``"message": "WARNING: ..."``), all failing makes
it a 502, as in nsqadmin.

nsqtw adds ``GET /api/history`` (the charts' series, see
:mod:`nsqtw.admin.history`), a ``results`` list in every action's answer
(what each request to a node or lookupd did), and refuses requests that
change state when a browser sends them from another site
(:func:`cross_site_refusal`), which Go nsqadmin takes.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import mimetypes
import os
import posixpath
import socket
import time
from collections.abc import Callable
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import unquote, unquote_to_bytes, urlencode, urlsplit

from klein import Klein
from twisted.internet.defer import ensureDeferred
from twisted.internet.threads import deferToThreadPool
from twisted.web.resource import IResource, Resource
from werkzeug.exceptions import MethodNotAllowed, NotFound

from nsqtw import NSQD_VERSION, __version__
from nsqtw._go.json import go_json
from nsqtw._go.path import clean_path
from nsqtw.admin.aggregate import counter_stats, sum_channel, sum_topic
from nsqtw.admin.client import AdminHTTPClient, UpstreamError
from nsqtw.admin.cluster import ActionReport, ClusterInfo, Errors, QueryFailed, producer_http_address
from nsqtw.admin.history import History
from nsqtw.admin.options import FLAGS, AdminOptions, normalize_base_path, origin_of
from nsqtw.http.base import JSON, APIError, GoHTTPAPI, Marshal
from nsqtw.log import LEVELS, level_number, set_level
from nsqtw.names import is_valid_channel_name, is_valid_topic_name

__all__ = ["ROUTES", "AdminHTTPAPI", "cross_site_refusal"]

#: every route nsqadmin v1.3.0 answers, relative to --base-path, with its methods
ROUTES: dict[str, tuple[str, ...]] = {
    "/ping": ("GET",),
    "/": ("GET",),
    "/topics": ("GET",),
    "/topics/:topic": ("GET",),
    "/topics/:topic/:channel": ("GET",),
    "/nodes": ("GET",),
    "/nodes/:node": ("GET",),
    "/counter": ("GET",),
    "/lookup": ("GET",),
    "/static/:asset": ("GET",),
    "/fonts/:asset": ("GET",),
    "/api/topics": ("GET", "POST"),
    "/api/topics/:topic": ("GET", "POST", "DELETE"),
    "/api/topics/:topic/:channel": ("GET", "POST", "DELETE"),
    "/api/nodes": ("GET",),
    "/api/nodes/:node": ("GET", "DELETE"),
    "/api/counter": ("GET",),
    "/api/graphite": ("GET",),
    "/config/:opt": ("GET", "PUT"),
    # nsqtw: the charts' series
    "/api/history": ("GET",),
}

#: the proxied graphite route, present with --proxy-graphite
RENDER_ROUTE = "/render"

_ASSET_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8",
                ".png": "image/png", ".svg": "image/svg+xml", ".html": "text/html; charset=utf-8"}

_Handler = TypeVar("_Handler", bound=Callable[..., Any])


class RawJSON(bytes):
    """An answer already encoded (off the reactor thread) as Go's JSON."""


def _route(app: Klein, path: str, methods: tuple[str, ...]) -> Callable[[_Handler], _Handler]:
    """Klein's route decorator with httprouter's strictness (no slash merging or fixing)."""
    klein_path = "/".join(f"<{s[1:]}>" if s.startswith(":") else s for s in path.split("/"))
    route: Callable[[_Handler], _Handler] = app.route(
        klein_path or "/", methods=list(methods), merge_slashes=False, strict_slashes=True)
    return route


def _match(pattern: str, path: str) -> bool:
    """httprouter's matching of one route: ``:name`` takes one non-empty segment."""
    want, got = pattern.split("/"), path.split("/")
    if len(want) != len(got):
        return False
    return all(w == g or (w.startswith(":") and g != "") for w, g in zip(want, got, strict=True))


def _warn(messages: Errors) -> str:
    """nsqadmin's maybeWarnMsg."""
    return "WARNING: " + "; ".join(messages) if messages else ""


#: methods that change nothing: never checked for their origin
_SAFE_METHODS = frozenset({"GET", "HEAD"})
#: what ``Sec-Fetch-Site`` says of a request the admin's own page (or a typed URL) made
_OWN_SITE = frozenset({"same-origin", "none"})


def cross_site_refusal(method: str, api_route: bool, headers: dict[str, str],
                       allowed_origins: frozenset[str]) -> APIError | None:
    """nsqtw: why a request that changes state looks sent by another site's page, or None.

    A browser tells where a request comes from: ``Sec-Fetch-Site`` where it
    sends it (HTTPS and loopback), ``Origin`` otherwise; either naming another
    origin than the admin's (``Host``) or an ``--allow-origin`` is refused
    (403 ``CROSS_ORIGIN_REQUEST``). An API action must also be one a page of
    another site cannot send without the admin's consent, a CORS preflight the
    admin never grants: JSON (``Content-Type: application/json``) or an
    ``X-Requested-With`` header (415 ``JSON_CONTENT_TYPE_REQUIRED``). Scripts
    send neither ``Origin`` nor ``Sec-Fetch-Site``; they only add the header.
    ``headers`` are the request's, names in lower case.
    """
    if method in _SAFE_METHODS:
        return None
    origin = headers.get("origin")
    seen = origin_of(origin) if origin is not None else ""
    if origin is None or seen not in allowed_origins:
        site = headers.get("sec-fetch-site")
        if site is not None:
            if site.strip().lower() not in _OWN_SITE:
                return APIError(403, "CROSS_ORIGIN_REQUEST")
        elif origin is not None:
            # the admin's own origin, as far as the Host header tells it (``Origin: null``: never)
            scheme = seen.partition("://")[0]
            if not seen or origin_of(f"{scheme}://{headers.get('host', '')}") != seen:
                return APIError(403, "CROSS_ORIGIN_REQUEST")
    if api_route:
        media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type != "application/json" and "x-requested-with" not in headers:
            return APIError(415, "JSON_CONTENT_TYPE_REQUIRED")
    return None


def _go_decode_error(body: bytes, e: ValueError) -> str:
    """The text Go's json.Decoder gives for a body it cannot read into a struct."""
    stripped = body.strip()
    if not stripped:
        return "EOF"
    pos = getattr(e, "pos", 0)
    if pos >= len(body.rstrip()):
        return "unexpected EOF"
    ch = body[pos:pos + 1].decode("latin-1")
    return f"invalid character {ch!r} looking for beginning of value"


def _decode_struct(body: bytes, fields: tuple[str, ...]) -> dict[str, str]:
    """Read a JSON object's string fields as Go decodes the request into a struct (ValueError: Go's text)."""
    text = body.decode("utf-8", "replace")
    try:
        value, _ = json.JSONDecoder().raw_decode(text.lstrip())
    except json.JSONDecodeError as e:
        raise ValueError(_go_decode_error(body, e)) from None
    if value is None:
        return {f: "" for f in fields}
    if not isinstance(value, dict):
        kind = {list: "array", str: "string", bool: "bool", int: "number", float: "number"}
        raise ValueError(f"json: cannot unmarshal {kind.get(type(value), 'value')} into Go value"
                         " of type struct")
    out = {}
    # Go matches keys case-insensitively; the exact match wins
    lowered = {k.lower(): v for k, v in value.items()}
    for f in fields:
        v = value.get(f, lowered.get(f))
        if v is None:
            out[f] = ""
        elif not isinstance(v, str):
            raise ValueError(f"json: cannot unmarshal {type(v).__name__} into Go struct field"
                             f" .{f} of type string")
        else:
            out[f] = v
    return out


class _AdminRoot(Resource):
    """Checks the path against the routes (httprouter's 404/405/redirects), then hands over to Klein."""

    isLeaf = True

    def __init__(self, api: AdminHTTPAPI, klein_resource: Any) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.api = api
        self.klein_resource = klein_resource

    def render(self, request: Any) -> Any:
        request.responseHeaders.removeHeader(b"server")
        api = self.api
        try:
            path = unquote_to_bytes(request.path).decode("utf-8")
        except UnicodeDecodeError:
            return api._unrouted(request)
        method = request.method.decode("latin-1")
        if clean_path(path) != path or not api._route_for(method, path):
            return api._unrouted(request)
        refusal = api.refuse_cross_site(request, method, path)
        if refusal is not None:
            return api._answer(request, refusal)
        base = api.base_path
        if base != "/":
            # Klein sees the base path as where it is mounted (its script name)
            depth = base.count("/")
            request.prepath = request.postpath[:depth]
            request.postpath = request.postpath[depth:] or [b""]
        return self.klein_resource.render(request)


class AdminHTTPAPI(GoHTTPAPI):
    """nsqadmin's routes over one cluster; ``options`` may change at run time (PUT /config)."""

    app = Klein()
    app.handle_errors(NotFound, MethodNotAllowed)(GoHTTPAPI._route_error)

    def __init__(self, options: AdminOptions, client: AdminHTTPClient, cluster: ClusterInfo,
                 history: History | None, reactor: Any, hostname: str | None = None) -> None:
        self.options = options
        self.client = client
        self.cluster = cluster
        self.history = history
        self.reactor = reactor
        self.hostname = hostname if hostname is not None else socket.gethostname()
        self.lookupds: list[str] = list(options.lookupd_http_address)
        self.base_path = normalize_base_path(options.base_path)
        routes = dict(ROUTES)
        if options.proxy_graphite and options.graphite_url:
            routes[RENDER_ROUTE] = ("GET",)
        self.routes = {self._full(r): m for r, m in routes.items()}
        self._cidr = (ipaddress.ip_network(options.allow_config_from_cidr, strict=False)
                      if options.allow_config_from_cidr else None)
        self.allowed_origins = frozenset(origin_of(o) for o in options.allow_origin)
        self._api_prefix = self._full("/api") + "/"

    def _full(self, route: str) -> str:
        """A route under the base path, as Go's path.Join(base, route)."""
        return posixpath.normpath(posixpath.join(self.base_path, route.lstrip("/"))) \
            if route != "/" else self.base_path

    def resource(self) -> IResource:
        root: IResource = _AdminRoot(self, self.app.resource())
        return root

    # -- routing (httprouter with :params) ------------------------------------------

    def _route_for(self, method: str, path: str) -> bool:
        return any(method in methods and _match(route, path) for route, methods in self.routes.items())

    def body_limit(self, target: bytes) -> int:
        return 1024 * 1024 + 1

    def _v1(self, request: Any, code: int, data: Any) -> bytes:
        if code == 200 and isinstance(data, RawJSON):
            request.setHeader(b"X-NSQ-Content-Type", b"nsq; version=1.0")
            return self._write(request, 200, bytes(data), JSON)
        return super()._v1(request, code, data)

    async def _encode(self, value: Any) -> RawJSON:
        """Go's JSON of a (possibly big) answer, encoded on a worker thread."""
        body = await deferToThreadPool(self.reactor, self.reactor.getThreadPool(), go_json, value)
        return RawJSON(body)

    # -- helpers ------------------------------------------------------------------------

    @property
    def nsqds(self) -> list[str]:
        return list(self.options.nsqd_http_address)

    def _upstream(self, e: QueryFailed, what: str) -> APIError:
        self.log.error("failed to {what} - {error}", what=what, error=str(e))
        return APIError(502, f"UPSTREAM_ERROR: {e}")

    def _user(self, request: Any) -> str:
        header = self.options.acl_http_header.encode("latin-1", "replace")
        value = request.getHeader(header)
        return value.decode("latin-1") if value is not None else ""

    def is_admin(self, request: Any) -> bool:
        """nsqadmin's isAuthorizedAdminRequest: no --admin-user means everyone."""
        users = self.options.admin_user
        return not users or self._user(request) in users

    def refuse_cross_site(self, request: Any, method: str, path: str) -> APIError | None:
        """:func:`cross_site_refusal` of one request, logged when it refuses."""
        if method in _SAFE_METHODS:
            return None
        headers = {k.decode("latin-1").lower(): b", ".join(v).decode("latin-1")
                   for k, v in request.requestHeaders.getAllRawHeaders()}
        refusal = cross_site_refusal(method, path.startswith(self._api_prefix), headers,
                                     self.allowed_origins)
        if refusal is not None:
            self.log.warn("refused {method} {path} as cross-site ({reason}): Origin {origin},"
                          " Sec-Fetch-Site {site}, Content-Type {ctype}", method=method, path=path,
                          reason=refusal.text, origin=headers.get("origin", "-"),
                          site=headers.get("sec-fetch-site", "-"),
                          ctype=headers.get("content-type", "-"))
        return refusal

    def _require_admin(self, request: Any) -> None:
        if not self.is_admin(request):
            raise APIError(403, "FORBIDDEN")

    def _json_body(self, request: Any, fields: tuple[str, ...]) -> dict[str, str]:
        try:
            return _decode_struct(self._body(request, 1024 * 1024), fields)
        except ValueError as e:
            raise APIError(400, str(e)) from None

    # -- plain routes -------------------------------------------------------------

    @_route(app, "/ping", ("GET",))
    def ping(self, request: Any) -> bytes:
        self._log_request(request, 200)
        return self._write(request, 200, b"OK", b"text/plain; charset=utf-8")

    @_route(app, "/", ("GET",))
    @_route(app, "/topics", ("GET",))
    @_route(app, "/topics/<topic>", ("GET",))
    @_route(app, "/topics/<topic>/<channel>", ("GET",))
    @_route(app, "/nodes", ("GET",))
    @_route(app, "/nodes/<node>", ("GET",))
    @_route(app, "/counter", ("GET",))
    @_route(app, "/lookup", ("GET",))
    def index(self, request: Any, **_: str) -> bytes:
        """The one page: it reads the path and draws the view, from the JSON API."""
        opts = self.options
        settings = {
            "version": NSQD_VERSION,
            "nsqtw_version": __version__,
            "base_path": self.base_path,
            "graphite_url": opts.graphite_url,
            "graph_enabled": bool(opts.graphite_url),
            "proxy_graphite": opts.proxy_graphite,
            "statsd_interval": int(opts.statsd_interval),
            "statsd_counter_format": opts.statsd_counter_format,
            "statsd_gauge_format": opts.statsd_gauge_format,
            "statsd_prefix": opts.statsd_prefix,
            "nsqlookupd": self.lookupds,
            "is_admin": self.is_admin(request),
            "history_interval": opts.history_interval if self.history is not None else 0,
        }
        page = self._asset("index.html").decode("utf-8")
        static = self._full("/static")
        page = page.replace("{{STATIC}}", static).replace(
            "{{SETTINGS}}", go_json(settings).decode("utf-8"))
        self._log_request(request, 200)
        return self._write(request, 200, page.encode("utf-8"), b"text/html")

    def _asset(self, name: str) -> bytes:
        if self.options.dev_static_dir:
            with open(os.path.join(self.options.dev_static_dir, name), "rb") as f:
                return f.read()
        return resources.files("nsqtw.admin").joinpath("static", name).read_bytes()

    @_route(app, "/static/<asset>", ("GET",))
    @_route(app, "/fonts/<asset>", ("GET",))
    def static(self, request: Any, asset: str) -> bytes:
        try:
            if asset.startswith(".") or "/" in asset or "\\" in asset or asset == "index.html":
                raise FileNotFoundError(asset)
            body = self._asset(asset)
        except OSError:
            # nsqadmin's PlainText answers: the error code as text
            self._log_request(request, 404)
            return self._write(request, 404, b"NOT_FOUND", b"text/plain; charset=utf-8")
        ext = os.path.splitext(asset)[1]
        ctype = _ASSET_TYPES.get(ext) or mimetypes.guess_type(asset)[0] or ""
        self._log_request(request, 200)
        request.setHeader(b"Cache-Control", b"no-cache")
        return self._write(request, 200, body, ctype.encode() or None)

    @_route(app, "/render", ("GET",))
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

    # -- the JSON API ---------------------------------------------------------------

    @_route(app, "/api/topics", ("GET",))
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
            return Marshal({"topics": inactive, "message": _warn(messages)})
        return Marshal({"topics": topics, "message": _warn(messages)})

    @_route(app, "/api/topics/<topic>", ("GET",))
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
        answer["message"] = _warn(messages)
        return await self._encode(answer)

    @_route(app, "/api/topics/<topic>/<channel>", ("GET",))
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
        answer["message"] = _warn(messages)
        return await self._encode(answer)

    @_route(app, "/api/nodes", ("GET",))
    def nodes(self, request: Any) -> Any:
        return self._run(request, self._nodes)

    async def _nodes(self, request: Any) -> Any:
        try:
            producers, messages = await self.cluster.producers(self.lookupds, self.nsqds)
        except QueryFailed as e:
            raise self._upstream(e, "get nodes") from None
        return Marshal({"nodes": producers or None, "message": _warn(messages)})

    @_route(app, "/api/nodes/<node>", ("GET",))
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
        try:
            entries, _ = await self.cluster.nsqd_stats(found[:1])
        except QueryFailed as e:
            self.log.error("failed to get nsqd stats - {error}", error=str(e))
            raise APIError(502, f"UPSTREAM_ERROR: {e}") from None
        total_clients = sum(len(c["clients"] or ()) for t in entries for c in t["channels"] or ())
        return await self._encode({
            "node": node,
            "topics": entries or None,
            "total_messages": sum(t["message_count"] for t in entries),
            "total_clients": total_clients,
            "message": _warn(messages),
        })

    @_route(app, "/api/counter", ("GET",))
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
        return Marshal({"stats": counter_stats(entries), "message": _warn(messages)})

    @_route(app, "/api/graphite", ("GET",))
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

    @_route(app, "/api/history", ("GET",))
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

    # -- actions ---------------------------------------------------------------------

    def _notify(self, request: Any, action: str, topic: str, channel: str = "",
                node: str = "") -> None:
        """POST nsqadmin's AdminAction JSON to --notification-http-endpoint, never waiting for it."""
        endpoint = self.options.notification_http_endpoint
        if not endpoint:
            return
        host = request.getHeader(b"host")
        scheme = "https" if request.isSecure() or request.getHeader(b"x-scheme") == b"https" \
            else "http"
        peer = request.getClientAddress()
        user = _basic_auth_user(request) or self._user(request)
        event: dict[str, Any] = {"action": action, "topic": topic}
        if channel:
            event["channel"] = channel
        if node:
            event["node"] = node
        event["timestamp"] = int(time.time())
        if user:
            event["user"] = user
        event.update(
            remote_ip=f"{getattr(peer, 'host', '')}:{getattr(peer, 'port', '')}",
            user_agent=(request.getHeader(b"user-agent") or b"").decode("latin-1"),
            url=f"{scheme}://{(host or b'').decode('latin-1')}{request.uri.decode('latin-1')}",
            via=self.hostname,
        )
        d = self.client.post(endpoint, go_json(event), {"Content-Type": "application/json"})
        ensureDeferred(d).addErrback(
            lambda f: self.log.error("failed to POST notification - {error}",
                                     error=f.getErrorMessage()))

    @_route(app, "/api/topics", ("POST",))
    def create(self, request: Any) -> Any:
        return self._run(request, self._create)

    async def _create(self, request: Any) -> Any:
        self._require_admin(request)
        body = self._json_body(request, ("topic", "channel"))
        topic, channel = body["topic"], body["channel"]
        if not is_valid_topic_name(topic):
            raise APIError(400, "INVALID_TOPIC")
        if channel and not is_valid_channel_name(channel):
            raise APIError(400, "INVALID_CHANNEL")
        report = await self.cluster.create_topic_channel(topic, channel, self.lookupds)
        self._notify(request, "create_topic", topic)
        if channel:
            self._notify(request, "create_channel", topic, channel)
        return self._reported(report)

    def _reported(self, report: ActionReport) -> Marshal:
        """An action's answer: nsqadmin's ``message``, and nsqtw's ``results``, one per request made."""
        for m in report.errors:
            self.log.warn("{message}", message=m)
        return Marshal({"message": _warn(report.errors), "results": report.results})

    @_route(app, "/api/topics/<topic>", ("POST",))
    def topic_action(self, request: Any, topic: str) -> Any:
        return self._run(request, self._action, topic, "")

    @_route(app, "/api/topics/<topic>/<channel>", ("POST",))
    def channel_action(self, request: Any, topic: str, channel: str) -> Any:
        return self._run(request, self._action, topic, channel)

    async def _action(self, request: Any, topic: str, channel: str) -> Any:
        self._require_admin(request)
        action = self._json_body(request, ("action",))["action"]
        if action not in ("pause", "unpause", "empty"):
            raise APIError(400, "INVALID_ACTION")
        try:
            report = await self.cluster.topic_channel_action(
                action, topic, channel, self.lookupds, self.nsqds)
        except QueryFailed as e:
            self.log.error("failed to {action} topic/channel - {error}", action=action, error=str(e))
            raise APIError(502, f"UPSTREAM_ERROR: {e}") from None
        self._notify(request, f"{action}_{'channel' if channel else 'topic'}", topic, channel)
        return self._reported(report)

    @_route(app, "/api/topics/<topic>", ("DELETE",))
    def delete_topic(self, request: Any, topic: str) -> Any:
        return self._run(request, self._delete, topic, "")

    @_route(app, "/api/topics/<topic>/<channel>", ("DELETE",))
    def delete_channel(self, request: Any, topic: str, channel: str) -> Any:
        return self._run(request, self._delete, topic, channel)

    async def _delete(self, request: Any, topic: str, channel: str) -> Any:
        self._require_admin(request)
        try:
            if channel:
                report = await self.cluster.delete_channel(topic, channel, self.lookupds, self.nsqds)
            else:
                report = await self.cluster.delete_topic(topic, self.lookupds, self.nsqds)
        except QueryFailed as e:
            what = "channel" if channel else "topic"
            self.log.error("failed to delete {what} - {error}", what=what, error=str(e))
            raise APIError(502, f"UPSTREAM_ERROR: {e}") from None
        self._notify(request, "delete_channel" if channel else "delete_topic", topic, channel)
        return self._reported(report)

    @_route(app, "/api/nodes/<node>", ("DELETE",))
    def tombstone(self, request: Any, node: str) -> Any:
        return self._run(request, self._tombstone, node)

    async def _tombstone(self, request: Any, node: str) -> Any:
        self._require_admin(request)
        try:
            topic = _decode_struct(self._body(request, 1024 * 1024), ("topic",))["topic"]
        except ValueError:
            raise APIError(400, "INVALID_BODY") from None
        if not is_valid_topic_name(topic):
            raise APIError(400, "INVALID_TOPIC")
        report = await self.cluster.tombstone_node_for_topic(topic, node, self.lookupds)
        self._notify(request, "tombstone_topic_producer", topic, node=node)
        return self._reported(report)

    # -- /config ---------------------------------------------------------------------

    @_route(app, "/config/<opt>", ("GET", "PUT"))
    def config(self, request: Any, opt: str) -> Any:
        return self._run(request, self._config, opt)

    def _config(self, request: Any, opt: str) -> Any:
        if self._cidr is not None:
            peer = request.getClientAddress()
            try:
                ip = ipaddress.ip_address(getattr(peer, "host", ""))
            except ValueError:
                self.log.error("failed to parse RemoteAddr {peer}", peer=str(peer))
                raise APIError(400, "INVALID_REMOTE_ADDR") from None
            if ip not in self._cidr:
                raise APIError(403, "FORBIDDEN")
        if request.method == b"PUT":
            read_max = 1024 * 1024 + 1
            body = self._body(request, read_max)
            if len(body) == read_max or not body:
                raise APIError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_http_addresses":
                try:
                    addresses = json.loads(body)
                except ValueError:
                    raise APIError(400, "INVALID_VALUE") from None
                if addresses is None:
                    addresses = []
                if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
                    raise APIError(400, "INVALID_VALUE")
                self.lookupds = addresses
            elif opt == "log_level":
                level = body.decode("utf-8", "replace").lower()
                if level not in LEVELS:
                    raise APIError(400, "INVALID_VALUE")
                set_level(level)
            else:
                raise APIError(400, "INVALID_OPTION")
        return self._config_value(opt)

    def _config_value(self, opt: str) -> Any:
        if opt == "nsqlookupd_http_addresses":
            return Marshal(list(self.lookupds))
        if opt == "log_level":
            return Marshal(level_number())
        for flag in FLAGS:
            if flag.toml_key != opt:
                continue
            value = getattr(self.options, flag.attribute)
            if flag.kind == "string":
                return str(value)  # RespondV1 writes Go strings as they are
            if flag.kind == "duration":
                return Marshal(round(value * 1_000_000_000))
            if flag.kind == "strings":
                return Marshal(list(value))
            return Marshal(value)
        raise APIError(400, "INVALID_OPTION")


def _basic_auth_user(request: Any) -> str:
    header = request.getHeader(b"authorization") or b""
    scheme, _, token = header.partition(b" ")
    if scheme != b"Basic":
        return ""
    try:
        user, sep, _ = base64.b64decode(token, validate=True).partition(b":")
    except ValueError:
        return ""
    return user.decode("utf-8", "replace") if sep else ""

