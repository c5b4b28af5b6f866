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
from twisted.web.http import HTTPChannel, HTTPFactory
from twisted.web.resource import IResource, Resource

from nsqtw._go.json import go_json
from nsqtw._go.path import clean_path
from nsqtw._go.query import parse_query
from nsqtw.http.direct import MAX_DIRECT_HEAD, DirectRequest, parse_simple_get
from nsqtw.log import Logger
from nsqtw.net.twisted_privates import (
    drop_transfer_decoder,
    handling_request,
    on_request_line,
    received_header_size,
    transfer_decoder,
    waiting_for_transport,
)

if TYPE_CHECKING:
    from klein import Klein
    from twisted.web.server import Site

__all__ = ["JSON", "TEXT", "APIError", "RawJSON", "GoHTTPAPI", "GoHTTPChannel", "GoSite", "Marshal",
           "route", "sniff"]

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


# --- body bounding -----------------------------------------------------------------


#: Go's net/http reads at most this much request line and headers (DefaultMaxHeaderBytes
#: plus the 4 KiB its reader allows on top)
MAX_HEADER_BYTES = (1 << 20) + 4096
#: after answering, Go's server reads and discards up to this much of an unread body to
#: keep the connection; past it, it closes the connection instead
DISCARD_LIMIT = 256 * 1024
#: how long Go's server keeps reading (and dropping) a cut-off upload after its answer
RST_AVOIDANCE_DELAY = 0.5
#: pipelined plain GETs of direct routes answered on one connection per reactor turn
DIRECT_PER_TURN = 16
_GO_ERROR_HEADERS = b"\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
_TOO_LARGE = b"HTTP/1.1 431 Request Header Fields Too Large" + _GO_ERROR_HEADERS + \
    b"431 Request Header Fields Too Large"
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request" + _GO_ERROR_HEADERS + b"400 Bad Request"


def _escape_target(line: bytes) -> bytes:
    """Percent-encode the raw non-ASCII bytes of a request line's target.

    Go's server takes such a target as it is (and its query parser keeps
    the bytes); twisted.web refuses it with 400. ``%XX`` decodes to the
    same bytes, so routing and query parsing see what Go sees.
    """
    method, sep, rest = line.partition(b" ")
    target, sep2, version = rest.rpartition(b" ")
    if not sep or not sep2:
        return line
    escaped = b"".join(b"%%%02X" % c if c >= 0x80 else bytes((c,)) for c in target)
    return method + b" " + escaped + b" " + version


class GoHTTPChannel(HTTPChannel):
    """twisted.web's HTTP/1.1 parser held to Go net/http's limits and answers.

    Request line plus headers may take :data:`MAX_HEADER_BYTES` (twisted's
    default stops at 16 KiB and 500 headers and hangs up without a word);
    past that the answer is Go's 431, and a malformed request gets Go's 400
    text. A body streamed far past its route's limit stops being read: the
    request runs on what was kept and the connection closes after the
    answer (Go's "413 and close", not a drain of an endless upload).

    The overrides read twisted.web internals (the body decoder, the
    first-line flag, the header byte count) through
    :mod:`nsqtw.net.twisted_privates`, and override its private
    ``_respondToBadRequestAndDisconnect``; ``tests/unit/test_twisted_privates.py``
    fails if a Twisted release changes them.
    """

    MAX_LENGTH = MAX_HEADER_BYTES
    totalHeadersSize = MAX_HEADER_BYTES
    #: Go limits the bytes of the headers, not their number
    maxHeaders = MAX_HEADER_BYTES
    _refused = False
    _cut_off = False
    #: nothing has reached twisted.web's parser on this connection yet: a plain GET of a
    #: direct route may be answered without it (:meth:`_answer_directly`)
    _pristine = True
    #: the start of a pipelined request not yet answered directly: a head cut between reads,
    #: or the requests past this turn's :data:`DIRECT_PER_TURN`
    _direct_buffer = b""
    _direct_call: Any = None
    _closing_call: Any = None
    callLater: Any  # set by HTTPFactory.buildProtocol

    def cut_off(self) -> None:
        """Read no more from this connection: the request is answered without the rest of it.

        The transport stops reading (as twisted pauses a client that sends
        ahead), and whatever was already read is dropped; the answer still
        goes out, then the connection closes (``persistent`` is false).
        """
        self._cut_off = True
        self.transport.pauseProducing()  # type: ignore[union-attr]

    def dataReceived(self, data: bytes) -> None:
        if self._cut_off:
            return
        # the answers made while this input is handled (twisted.web writes a response's
        # head and body separately) leave in one send (nsqtw.net.eager)
        transport: Any = self.transport
        cork = getattr(transport, "cork", None)
        if cork is not None:
            cork()
        try:
            if self._pristine:
                self._direct_input(data)
            else:
                super().dataReceived(data)  # type: ignore[no-untyped-call]
        finally:
            if cork is not None:
                transport.uncork()

    def _direct_input(self, data: bytes) -> None:
        """Answer the plain GETs of direct routes the input starts with, :data:`DIRECT_PER_TURN` a turn.

        Pipelined requests (a client sending many without waiting) are
        answered in order, each without twisted.web (:meth:`_answer_directly`);
        past :data:`DIRECT_PER_TURN` the connection stops reading and the
        rest waits for the next reactor turn. A head cut between reads waits
        for its end. From the first request that is not a plain GET of a
        direct route on, everything goes to twisted.web, as it arrived.
        """
        buf = self._direct_buffer + data if self._direct_buffer else data
        self._direct_buffer = b""
        pos = 0
        answered = 0
        size = len(buf)
        while pos < size:
            end = buf.find(b"\r\n\r\n", pos)
            if end < 0:
                rest = buf[pos:]
                if len(rest) <= MAX_DIRECT_HEAD and (rest.startswith(b"GET /") or b"GET /".startswith(rest)):
                    self.resetTimeout()  # type: ignore[no-untyped-call]
                    self._direct_buffer = rest  # the rest of a head still to come
                    return
                break
            if answered == DIRECT_PER_TURN:
                self._direct_buffer = buf[pos:]
                self._direct_later()
                return
            if not self._answer_directly(buf[pos:end + 4]):
                break
            answered += 1
            pos = end + 4
            if not self._pristine:
                return  # answered and closing: what follows is dropped, as twisted.web drops it
        if pos < size:
            self._pristine = False
            super().dataReceived(buf[pos:])  # type: ignore[no-untyped-call]

    def _direct_later(self) -> None:
        """Read nothing more until the next reactor turn, then go on with the buffered requests."""
        self.transport.pauseProducing()  # type: ignore[union-attr]
        self._direct_call = self.callLater(0, self._direct_next)

    def _direct_next(self) -> None:
        self._direct_call = None
        if waiting_for_transport(self):
            return  # the client is not reading its answers: go on when it does (resumeProducing)
        self.transport.resumeProducing()  # type: ignore[union-attr]
        self.dataReceived(b"")

    def resumeProducing(self) -> None:
        super().resumeProducing()  # type: ignore[no-untyped-call]
        if self._pristine and self._direct_buffer and self._direct_call is None and not self._cut_off:
            self._direct_later()

    def _answer_directly(self, data: bytes) -> bool:
        """Answer a plain GET of a direct route without twisted.web's Request (:mod:`nsqtw.http.direct`)."""
        api = getattr(getattr(self, "factory", None), "api", None)
        if not isinstance(api, GoHTTPAPI) or not api.direct_routes or (api.tls_required and not api.tls_enabled):
            return False  # TLS_REQUIRED is _Root's answer to give
        simple = parse_simple_get(data, api.direct_routes)
        if simple is None:
            return False
        self.resetTimeout()  # type: ignore[no-untyped-call]
        request = DirectRequest(self, simple)
        request.answer(getattr(api, api.direct_routes[simple.target])(request))
        if not simple.persistent:
            self._pristine = False
            self.loseConnection()
        return True

    def loseConnection(self) -> None:
        """Close; after a cut-off body, first let the client read the answer, as Go does.

        Closing a socket with unread input makes the kernel send a reset,
        which can destroy the answer before the client reads it. Go's server
        half-closes, discards input for up to :data:`RST_AVOIDANCE_DELAY`,
        then closes; so does this.
        """
        half_close = getattr(self.transport, "loseWriteConnection", None)
        if not self._cut_off or half_close is None or self._closing_call is not None:
            super().loseConnection()  # type: ignore[no-untyped-call]
            return
        transport: Any = self.transport
        transport.unregisterProducer()
        half_close()
        transport.resumeProducing()
        self._closing_call = self.callLater(RST_AVOIDANCE_DELAY, transport.loseConnection)

    def connectionLost(self, reason: Failure) -> None:  # type: ignore[override]
        if self._closing_call is not None and self._closing_call.active():
            self._closing_call.cancel()
        if self._direct_call is not None and self._direct_call.active():
            self._direct_call.cancel()
        super().connectionLost(reason)  # type: ignore[no-untyped-call]

    def lineReceived(self, line: bytes) -> None:
        if received_header_size(self) + len(line) > self.totalHeadersSize:
            self._refuse(_TOO_LARGE)
            return
        if on_request_line(self) and not line.isascii():
            line = _escape_target(line)
        super().lineReceived(line)  # type: ignore[no-untyped-call]

    def lineLengthExceeded(self, line: bytes) -> None:
        self._refuse(_TOO_LARGE)

    def _respondToBadRequestAndDisconnect(self) -> None:
        self._refuse(_BAD_REQUEST)

    def _refuse(self, answer: bytes) -> None:
        if not self._refused and not handling_request(self):
            self._refused = True
            self.transport.write(answer)  # type: ignore[union-attr]
        self.loseConnection()

    def rawDataReceived(self, data: bytes) -> None:
        super().rawDataReceived(data)
        request = self.requests[-1] if self.requests else None
        if transfer_decoder(self) is not None and getattr(request, "over_limit", False):  # a BoundedRequest's
            drop_transfer_decoder(self)
            self.persistent = False
            self.cut_off()
            self.allContentReceived()  # type: ignore[no-untyped-call]


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
    """Checks nsqd's TLS requirement and unroutable paths, then hands over to Klein."""

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
        if request.method == b"GET":
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
