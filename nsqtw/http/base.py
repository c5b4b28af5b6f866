"""What nsqd's and nsqlookupd's HTTP APIs share: Go's ``http_api`` answers and httprouter's routing.

Every answer is shaped like Go's ``http_api.RespondV1``: a 200 carries the
handler's text as is (``OK``, or nothing at all for the admin routes),
anything else is ``{"message":"CODE"}`` as JSON. Go's net/http picks a
``Content-Type`` by sniffing when the handler sets none; :func:`sniff` does
the same, and an empty body gets no ``Content-Type`` at all. Unroutable
requests get httprouter's redirects, 405s and 404s.

Request bodies are bounded while they arrive (:class:`nsqtw.http.server.BoundedRequest`): at
most one byte more than the route's limit is kept, which is all Go's
``io.LimitReader(body, max+1)`` checks need. A body far past the limit is
not read to its end: the request is answered with what was kept and the
connection closed (:class:`GoHTTPChannel`), as Go's server does. Request
lines and headers are bounded as Go's net/http bounds them (1 MiB, answered
431), and a raw non-ASCII request target is accepted as Go accepts it.

Routes are marked with :func:`route` and handed to Klein when the API first
routes a request (:meth:`GoHTTPAPI.klein_app`): a node whose only HTTP
request so far is a health check (``/ping``, a direct route) never imports
Klein and werkzeug, about 4 MB of RSS, nor twisted.web's server
(:class:`GoSite`; ``docs/performance.md``, Memory).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, unquote_to_bytes

from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.http import HTTPFactory
from twisted.web.resource import IResource, Resource
from zope.interface import implementer

from nsqtw._go.json import go_json
from nsqtw._go.path import clean_path
from nsqtw._go.query import parse_query
from nsqtw.http.channel import DIRECT_PER_TURN, DISCARD_LIMIT, MAX_HEADER_BYTES, RST_AVOIDANCE_DELAY, GoHTTPChannel
from nsqtw.http.origin import CROSS_ORIGIN, UNCHECKED_METHODS, browser_refusal
from nsqtw.interfaces import IHTTPAPI
from nsqtw.log import Logger

if TYPE_CHECKING:
    from klein import Klein
    from twisted.web.server import Site

__all__ = ["DIRECT_PER_TURN", "DISCARD_LIMIT", "JSON", "MAX_HEADER_BYTES", "RST_AVOIDANCE_DELAY", "TEXT", "APIError",
           "GoHTTPAPI", "GoHTTPChannel", "GoSite", "Marshal", "RawJSON", "route", "sniff"]

JSON = b"application/json; charset=utf-8"
TEXT = b"text/plain; charset=utf-8"
HTML = b"text/html; charset=utf-8"

_STATUSTEXT = {301: "Moved Permanently", 307: "Temporary Redirect"}


class Marshal:
    """A value RespondV1 must JSON-encode even when it is a string or None."""

    def __init__(self, value: Any) -> None:
        self.value = value


class RawJSON:
    """A 200 answer already encoded as Go's JSON (``/stats``, encoded in slices)."""

    def __init__(self, body: bytes) -> None:
        self.body = body


class APIError(Exception):
    """An answer other than 200: nsqd's ``http_api.Err{Code, Text}``."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(code, text)
        self.code = code
        self.text = text


# --- Go's content sniffing ------------------------------------------------------


_HTML_SIGS = (b"<!DOCTYPE HTML", b"<HTML", b"<HEAD", b"<SCRIPT", b"<IFRAME", b"<H1", b"<DIV",
              b"<FONT", b"<TABLE", b"<A", b"<STYLE", b"<TITLE", b"<B", b"<BODY", b"<BR", b"<P",
              b"<!--")
_BINARY = frozenset(list(range(0x09)) + [0x0B] + list(range(0x0E, 0x1B)) + list(range(0x1C, 0x20)))


def sniff(body: bytes) -> bytes | None:
    """The ``Content-Type`` Go's net/http would pick for a body (nothing for an empty one)."""
    if not body:
        return None
    head = body[:512]
    stripped = head.lstrip(b"\t\n\x0c\r ")
    upper = stripped.upper()
    for sig in _HTML_SIGS:
        if upper.startswith(sig) and len(stripped) > len(sig) and stripped[len(sig)] in b" >":
            return HTML
    if stripped.startswith(b"<?xml"):
        return b"text/xml; charset=utf-8"
    if any(b in _BINARY for b in head):
        return b"application/octet-stream"
    return TEXT


class GoSite(HTTPFactory):
    """The HTTP listener's factory: Go's limits on every connection, nsqd-style logging only.

    Its channels answer a plain GET of a direct route (``/ping``) themselves;
    twisted.web's server side (:mod:`nsqtw.http.server`: ``twisted.web.server``
    with ``twisted.spread``, templates, ``xml.sax`` and hyperlink, about 3 MB
    of RSS) is imported and made when a request first needs it
    (:meth:`request_site`), so a node whose HTTP so far is health checks does
    without it (``docs/performance.md``, Memory).
    """

    protocol = GoHTTPChannel  # type: ignore[assignment]  # no HTTP/2 wrapper: nsqd speaks HTTP/1.1
    #: the request class of :meth:`request_site` (None: ``nsqtw.http.server.BoundedRequest``)
    requestFactory: Any = None

    def __init__(self, api: GoHTTPAPI, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.api = api
        self._kwargs = kwargs
        self._site: Site | None = None

    def buildProtocol(self, addr: Any) -> Any:
        channel: Any = super().buildProtocol(addr)
        if self._site is None:
            channel.requestFactory = self._first_request
        else:
            channel.site = self._site
            channel.requestFactory = self._site.requestFactory
        return channel

    def request_site(self) -> Site:
        """twisted.web's Site the requests are processed against: made (and imported) on the first call."""
        if self._site is None:
            from nsqtw.http.server import RequestSite

            self._site = RequestSite(self.api, self.requestFactory, **self._kwargs)
        return self._site

    def _first_request(self, channel: Any, queued: int) -> Any:
        # a channel made before the site was: its first request makes the site and joins it
        site = self.request_site()
        channel.site = site
        channel.requestFactory = site.requestFactory
        return site.requestFactory(channel, queued)

    def log(self, request: Any) -> None:
        # HTTPAPI logs each request as nsqd does; no common-log-format lines
        return None


# --- the API -------------------------------------------------------------------------


_Handler = TypeVar("_Handler", bound=Callable[..., Any])

#: the attribute :func:`route` marks a handler with: (Klein path, methods)
_ROUTE_MARK = "_go_http_route"


def route(path: str, methods: tuple[str, ...]) -> Callable[[_Handler], _Handler]:
    """Mark a :class:`GoHTTPAPI` method as the handler of ``path`` (Klein's syntax) for ``methods``.

    :meth:`GoHTTPAPI.klein_app` gives the marked methods to Klein, with
    httprouter's strictness (no slash merging or fixing), when the API first
    routes a request.
    """

    def mark(handler: _Handler) -> _Handler:
        setattr(handler, _ROUTE_MARK, (path, methods))
        return handler

    return mark


class _Root(Resource):
    """Checks nsqd's TLS requirement, requests a browser sent from a web page, unroutable paths; then Klein."""

    isLeaf = True

    def __init__(self, api: GoHTTPAPI, klein_resource: Any = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.api: Any = api  # nsqd's or nsqlookupd's (only nsqd's can require TLS)
        #: Klein's resource over the API, made at the first request that needs routing
        self.klein_resource = klein_resource

    def render(self, request: Any) -> Any:
        request.responseHeaders.removeHeader(b"server")
        api = self.api
        if api.tls_required and not api.tls_enabled:
            body = (f'{{"message": "TLS_REQUIRED", "https_port": {api.https_port()}}}').encode()
            request.setHeader(b"X-NSQ-Content-Type", b"nsq; version=1.0")
            return api._write(request, 403, body, JSON)
        method = request.method
        if method not in UNCHECKED_METHODS and api.browser_origins is not None:
            # every request that may change state, routed or not: two lookups for one without
            # Origin or Sec-Fetch-Site (curl, every NSQ client), the rest only from browsers
            headers = request.requestHeaders
            origin = headers.getRawHeaders(b"origin")
            site = headers.getRawHeaders(b"sec-fetch-site")
            if origin is not None or site is not None:
                refused = api._refuse_browser(request, origin, site)
                if refused is not None:
                    return refused
        if method == b"GET":
            # a direct route's path is clean and has no escapes: the checks below pass it
            direct = api.direct_routes.get(request.path)
            if direct is not None:
                return getattr(api, direct)(request)
        try:
            path = unquote_to_bytes(request.path).decode("utf-8")
        except UnicodeDecodeError:
            return api._unrouted(request)
        if clean_path(path).rstrip("/") != path.rstrip("/") or request.method == b"HEAD":
            # httprouter redirects unclean paths (//, /./, /../) to their clean form and
            # registers no HEAD routes (GET routes answer HEAD with 405)
            return api._unrouted(request)
        if self.klein_resource is None:
            self.klein_resource = api.klein_resource()
        return self.klein_resource.render(request)


@implementer(IHTTPAPI)
class GoHTTPAPI:
    """What nsqd's and nsqlookupd's HTTP APIs share: Go's ``http_api`` and httprouter.

    Subclasses mark their handlers with :func:`route` (or set :attr:`app`,
    their Klein routes, with :meth:`_route_error` registered for NotFound and
    MethodNotAllowed) and set :attr:`routes` (every route with its methods,
    for httprouter's redirects, 405s and 404s).
    """

    app: Klein
    routes: dict[str, tuple[str, ...]] = {}
    #: GET routes with a fixed path and a handler that answers at once, served ahead of Klein:
    #: path -> handler name. A load balancer's health check comes often, and Klein's and
    #: werkzeug's routing were a fifth of a ``/ping``'s cost. A path here must be clean
    #: (``clean_path``) and unescaped: it skips those checks too. The handlers are the routes' own,
    #: so the answer is the same (tests/integration/test_http_live.py compares with Go's).
    direct_routes: dict[bytes, str] = {}
    log = Logger()
    tls_enabled = False
    tls_required = False
    #: nsqtw: the origins whose pages may send requests that change state (nsqd's
    #: ``--http-allow-origin``); None: no such check (nsqlookupd)
    browser_origins: frozenset[str] | None = None

    def https_port(self) -> int:
        """The HTTPS port a ``TLS_REQUIRED`` answer points to (only nsqd can require TLS)."""
        return 0

    def resource(self) -> IResource:
        root: IResource = _Root(self)
        return root

    @classmethod
    def klein_app(cls) -> Klein:
        """The class's Klein app (:attr:`app`): made from its :func:`route` handlers on first use.

        Klein and werkzeug are imported here, at the first request a direct
        route does not answer.
        """
        app: Klein | None = cls.__dict__.get("app")
        if app is None:
            from klein import Klein
            from werkzeug.exceptions import MethodNotAllowed, NotFound

            app = Klein()
            app.handle_errors(NotFound, MethodNotAllowed)(GoHTTPAPI._route_error)
            for handler in list(vars(cls).values()):
                mark = getattr(handler, _ROUTE_MARK, None)
                if mark is not None:
                    path, methods = mark
                    app.route(path, methods=list(methods), merge_slashes=False, strict_slashes=True)(handler)
            cls.app = app
        return app

    def klein_resource(self) -> IResource:
        """Klein's resource over this API (the class's app bound to it)."""
        type(self).klein_app()
        resource: IResource = self.app.resource()
        return resource

    def site(self, **kwargs: Any) -> GoSite:
        """The factory to listen with: bounds request bodies as they arrive."""
        return GoSite(self, **kwargs)

    # -- plumbing -------------------------------------------------------

    def body_limit(self, target: bytes) -> int:
        """How many body bytes a request to ``target`` may keep (none: no route reads one)."""
        return 0

    @staticmethod
    def _body(request: Any, limit: int) -> bytes:
        content = request.content
        if content is None:
            return b""
        content.seek(0)
        return bytes(content.read(limit))

    @staticmethod
    def _query(request: Any) -> tuple[dict[str, list[str]], bool]:
        uri = request.uri.decode("latin-1")
        _, sep, raw = uri.partition("?")
        return parse_query(raw.partition("#")[0]) if sep else ({}, False)

    def _params(self, request: Any) -> dict[str, list[str]]:
        """Go's NewReqParams: the query, or 400 INVALID_REQUEST when it is malformed."""
        values, bad = self._query(request)
        if bad:
            raise APIError(400, "INVALID_REQUEST")
        return values

    def _write(self, request: Any, code: int, body: bytes, content_type: bytes | None) -> bytes:
        request.setResponseCode(code)
        request.defaultContentType = None
        if content_type is not None:
            request.setHeader(b"Content-Type", content_type)
        request.setHeader(b"Content-Length", str(len(body)).encode())
        return body

    def _v1(self, request: Any, code: int, data: Any) -> bytes:
        """nsqd's RespondV1: raw text on 200, JSON otherwise."""
        request.setHeader(b"X-NSQ-Content-Type", b"nsq; version=1.0")
        if code != 200:
            return self._write(request, code, go_json({"message": str(data)}), JSON)
        if isinstance(data, Marshal):
            return self._write(request, 200, go_json(data.value), JSON)
        if isinstance(data, RawJSON):
            return self._write(request, 200, data.body, JSON)
        if data is None:
            return self._write(request, 200, b"", None)
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        if isinstance(data, bytes):
            return self._write(request, 200, data, sniff(data))
        return self._write(request, 200, go_json(data), JSON)

    def _log_request(self, request: Any, code: int) -> None:
        peer = request.getClientAddress()
        self.log.info("{status} {method} {uri} ({peer})", status=code,
                      method=request.method.decode("latin-1"),
                      uri=request.uri.decode("latin-1"),
                      peer=f"{getattr(peer, 'host', '')}:{getattr(peer, 'port', '')}")

    def _answer(self, request: Any, result: Any, logged: bool = True) -> bytes:
        if isinstance(result, APIError):
            code, data = result.code, result.text
        else:
            code, data = 200, result
        if logged:
            self._log_request(request, code)
        return self._v1(request, code, data)

    async def _run(self, request: Any, handler: Any, *args: Any, logged: bool = True) -> bytes:
        try:
            result = handler(request, *args)
            if isinstance(result, Deferred) or hasattr(result, "__await__"):
                result = await result
        except APIError as e:
            result = e
        except Exception:  # noqa: BLE001 - nsqd's PanicHandler: any failure is a 500
            self.log.failure("panic in HTTP handler")
            result = APIError(500, "INTERNAL_ERROR")
        return self._answer(request, result, logged)

    async def _serve_metrics(self, request: Any, page: Any) -> bytes:
        """``GET /metrics`` (nsqtw only): the page's exposition, its own Content-Type; 500 on failure."""
        accept = (request.getHeader(b"accept") or b"").decode("latin-1")
        try:
            body, content_type = await page.render(accept)
        except Exception:  # noqa: BLE001 - a broken scrape is a 500, never a dead connection
            self.log.failure("failed to render /metrics")
            return self._answer(request, APIError(500, "INTERNAL_ERROR"))
        self._log_request(request, 200)
        return self._write(request, 200, body, content_type.encode("latin-1"))

    def _refuse_browser(self, request: Any, origin: list[bytes] | None, site: list[bytes] | None) -> bytes | None:
        """403 ``CROSS_ORIGIN_REQUEST`` for a state-changing request from a page not allowed, logged; else None."""
        assert self.browser_origins is not None
        origin_value = b", ".join(origin) if origin is not None else None
        site_value = b", ".join(site) if site is not None else None
        reason = browser_refusal(origin_value, site_value, self.browser_origins)
        if reason is None:
            return None
        self.log.warn("refused {method} {uri} from a web page ({reason}): Origin {origin}, Sec-Fetch-Site {site};"  # noqa: G010 - twisted Logger
                      " --http-allow-origin names the origins allowed", method=request.method.decode("latin-1"),
                      uri=request.uri.decode("latin-1"), reason=reason,
                      origin=(origin_value or b"-").decode("latin-1"), site=(site_value or b"-").decode("latin-1"))
        return self._answer(request, APIError(403, CROSS_ORIGIN), logged=False)

    # -- unrouted: redirects, 405, 404 (httprouter's rules) -------------------

    def _route_for(self, method: str, path: str) -> bool:
        if path.startswith("/config/") and "/config/:opt" in self.routes:
            opt = path[len("/config/"):]
            return bool(opt) and "/" not in opt and method in self.routes["/config/:opt"]
        return method in self.routes.get(path, ())

    def _fixed_path(self, method: str, path: str) -> str | None:
        """httprouter's RedirectFixedPath: cleaned, case-insensitive, slash-toggled."""
        cleaned = clean_path(path)
        for candidate in (cleaned, cleaned.rstrip("/") if cleaned != "/" else cleaned, cleaned + "/"):
            low = candidate.lower()
            if low.startswith("/config/") and "/config/:opt" in self.routes:
                opt = candidate[len("/config/"):]
                if opt and "/" not in opt and method in self.routes["/config/:opt"]:
                    return "/config/" + opt
            for route, methods in self.routes.items():
                if method in methods and ":" not in route and route == low:
                    return route
        return None

    def _unrouted(self, request: Any) -> bytes:
        method = request.method.decode("latin-1")
        path = unquote_to_bytes(request.path).decode("utf-8", "surrogateescape")
        methods_with_routes = {m for ms in self.routes.values() for m in ms}
        if method in methods_with_routes and method != "CONNECT" and path != "/":
            target: str | None = None
            toggled = path[:-1] if path.endswith("/") else path + "/"
            if len(path) > 1 and self._route_for(method, toggled):
                target = toggled
            else:
                target = self._fixed_path(method, path)
            if target is not None and target != path:
                return self._redirect(request, method, target)
        allowed = sorted({m for m in methods_with_routes if self._route_for(m, path)})
        if method == "OPTIONS" and allowed:
            request.setHeader(b"Allow", ", ".join(sorted(allowed + ["OPTIONS"])).encode())
            return self._write(request, 200, b"", None)
        if allowed and method not in allowed:
            request.setHeader(b"Allow", ", ".join(sorted(allowed + ["OPTIONS"])).encode())
            return self._answer(request, APIError(405, "METHOD_NOT_ALLOWED"))
        return self._answer(request, APIError(404, "NOT_FOUND"))

    def _redirect(self, request: Any, method: str, target: str) -> bytes:
        code = 301 if method == "GET" else 307
        _, sep, query = request.uri.decode("latin-1").partition("?")
        url = quote(target, safe="/:@!$&'()*+,;=-._~") + (sep + query if sep else "")
        request.setHeader(b"Location", url.encode("latin-1", "replace"))
        if method in ("GET", "HEAD"):
            body = b""
            if method == "GET":
                escaped = (url.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
                           .replace('"', "&#34;").replace("'", "&#39;"))
                body = f'<a href="{escaped}">{_STATUSTEXT[code]}</a>.\n\n'.encode()
            return self._write(request, code, body, HTML)
        return self._write(request, code, b"", None)

    def _route_error(self, request: Any, failure: Failure) -> bytes:
        """Klein found no route (NotFound, MethodNotAllowed): answer as httprouter."""
        return self._unrouted(request)
