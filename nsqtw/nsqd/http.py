"""nsqd's HTTP API (v1.3.0) on Klein: same routes, arguments, status codes and bodies.

Every answer is shaped like Go nsqd's ``http_api.RespondV1``: a 200 carries
the handler's text as is (``OK``, or nothing at all for the admin routes),
anything else is ``{"message":"CODE"}`` as JSON.  Go's net/http picks a
``Content-Type`` by sniffing when the handler sets none; :func:`_sniff` does
the same, and an empty body gets no ``Content-Type`` at all.

Request bodies are bounded while they arrive (:class:`BoundedRequest`): at
most one byte more than the route's limit is kept, which is all nsqd's
``io.LimitReader(body, max+1)`` checks need.

Runtime-changeable settings (``PUT /config/...``) live on the NSQD object as
``nsqd.runtime_lookupd_tcp_addresses`` (list of ``host:port``) and
``nsqd.runtime_log_level`` (``"debug"``...``"fatal"``); when NSQD has a
``config_changed(name)`` method it is called after each change.
"""

from __future__ import annotations

import json
import socket
import struct
from io import BytesIO
from typing import Any
from urllib.parse import quote, unquote_to_bytes

from klein import Klein
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure
from twisted.web.resource import IResource, Resource
from twisted.web.server import Request, Site
from werkzeug.exceptions import MethodNotAllowed, NotFound

from nsqtw import NSQD_VERSION
from nsqtw.core.nsqd import NSQD
from nsqtw.errors import BackendError, ExitingError
from nsqtw.log import Logger
from nsqtw.names import is_valid_channel_name, is_valid_topic_name
from nsqtw.observe.stats import format_text, go_json, snapshot

__all__ = ["HTTPAPI", "APIError", "BoundedRequest", "GoHTTPAPI", "NSQDSite", "parse_query"]

_NS = 1_000_000_000
_JSON = b"application/json; charset=utf-8"
_TEXT = b"text/plain; charset=utf-8"
_HTML = b"text/html; charset=utf-8"
_LOG_LEVELS = {"debug": 1, "info": 2, "warn": 3, "error": 4, "fatal": 5}
#: nsqd's boolParams: anything else means "true" for these flags
_BOOL_PARAMS = {"true": True, "1": True, "false": False, "0": False}
_TLS_REQUIRED = 1

#: every route nsqd v1.3.0 answers (the /debug/pprof ones excepted), with its methods
ROUTES: dict[str, tuple[str, ...]] = {
    "/ping": ("GET",),
    "/info": ("GET",),
    "/pub": ("POST",),
    "/mpub": ("POST",),
    "/stats": ("GET",),
    "/topic/create": ("POST",),
    "/topic/delete": ("POST",),
    "/topic/empty": ("POST",),
    "/topic/pause": ("POST",),
    "/topic/unpause": ("POST",),
    "/channel/create": ("POST",),
    "/channel/delete": ("POST",),
    "/channel/empty": ("POST",),
    "/channel/pause": ("POST",),
    "/channel/unpause": ("POST",),
    "/config/:opt": ("GET", "PUT"),
}
_STATUS_TEXT = {301: "Moved Permanently", 307: "Temporary Redirect"}


class _Marshal:
    """A value RespondV1 must JSON-encode even when it is a string or None."""

    def __init__(self, value: Any) -> None:
        self.value = value


class APIError(Exception):
    """An answer other than 200: nsqd's ``http_api.Err{Code, Text}``."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(code, text)
        self.code = code
        self.text = text


# --- Go's query parsing and content sniffing ------------------------------------


def _query_unescape(text: str) -> str:
    """Go's ``url.QueryUnescape``: ``+`` is a space; a bad ``%`` escape is an error."""
    if "%" in text:
        i = text.find("%")
        while i != -1:
            pair = text[i + 1:i + 3]
            if len(pair) != 2 or any(c not in "0123456789abcdefABCDEF" for c in pair):
                raise ValueError("invalid URL escape")
            i = text.find("%", i + 3)
    raw = unquote_to_bytes(text.replace("+", " "))
    return raw.decode("utf-8", "surrogateescape")


def parse_query(raw: str) -> tuple[dict[str, list[str]], bool]:
    """Go's ``url.ParseQuery``: the values, and whether any part was malformed.

    Like Go, a malformed pair (bad escape, ``;`` separator) is skipped and the
    rest is still parsed.
    """
    values: dict[str, list[str]] = {}
    bad = False
    for pair in raw.split("&"):
        if ";" in pair:
            bad = True
            continue
        if not pair:
            continue
        key, _, value = pair.partition("=")
        try:
            key = _query_unescape(key)
            value = _query_unescape(value)
        except ValueError:
            bad = True
            continue
        values.setdefault(key, []).append(value)
    return values, bad


_HTML_SIGS = (b"<!DOCTYPE HTML", b"<HTML", b"<HEAD", b"<SCRIPT", b"<IFRAME", b"<H1", b"<DIV",
              b"<FONT", b"<TABLE", b"<A", b"<STYLE", b"<TITLE", b"<B", b"<BODY", b"<BR", b"<P",
              b"<!--")
_BINARY = frozenset(list(range(0x09)) + [0x0B] + list(range(0x0E, 0x1B)) + list(range(0x1C, 0x20)))


def _sniff(body: bytes) -> bytes | None:
    """The ``Content-Type`` Go's net/http would pick for a body (nothing for an empty one)."""
    if not body:
        return None
    head = body[:512]
    stripped = head.lstrip(b"\t\n\x0c\r ")
    upper = stripped.upper()
    for sig in _HTML_SIGS:
        if upper.startswith(sig) and len(stripped) > len(sig) and stripped[len(sig)] in b" >":
            return _HTML
    if stripped.startswith(b"<?xml"):
        return b"text/xml; charset=utf-8"
    if any(b in _BINARY for b in head):
        return b"application/octet-stream"
    return _TEXT


def _go_json_value(kind: str, value: Any) -> Any:
    """An option's value as nsqd's ``GET /config/:opt`` marshals it."""
    if kind == "duration":
        return round(value * _NS)
    if kind == "log-level":
        return _LOG_LEVELS.get(str(value).lower(), 2)
    if kind in ("strings", "floats"):
        return None if value is None else list(value)
    if kind == "bool":
        return bool(value)
    if kind == "string":
        return str(value)
    return int(value)


# --- body bounding -----------------------------------------------------------------


class BoundedRequest(Request):
    """A request that keeps at most ``limit`` body bytes, dropping the rest as it arrives.

    twisted.web buffers a whole body before any handler runs; this keeps
    only what nsqd would read (its limit plus one byte, so "too big" can
    still be told apart) and counts the rest in ``body_received``.
    """

    body_limit = 0
    body_received = 0
    declared_length: int | None = None
    _hidden_content_type: list[bytes] | None = None

    def _limit(self) -> int:
        api = getattr(getattr(self.channel, "site", None), "api", None)
        target = getattr(self.channel, "_path", b"") or b""
        if isinstance(api, GoHTTPAPI):
            return api.body_limit(target)
        return 5 * 1024 * 1024 + 1

    def gotLength(self, length: int | None) -> None:
        self.declared_length = length
        self.body_limit = self._limit()
        self.body_received = 0
        self._kept = BytesIO()
        self.content = self._kept  # type: ignore[assignment]

    def handleContentChunk(self, data: bytes) -> None:
        self.body_received += len(data)
        room = self.body_limit - self._kept.tell()
        if room > 0:
            self._kept.write(data[:room] if len(data) > room else data)

    def requestReceived(self, command: bytes, path: bytes, version: bytes) -> None:
        # nsqd never reads form fields; keep twisted from parsing (possibly
        # large or malformed) form bodies into request.args
        hidden = self.requestHeaders.getRawHeaders(b"content-type")
        self._hidden_content_type = None if hidden is None else list(hidden)
        if self._hidden_content_type is not None:
            self.requestHeaders.removeHeader(b"content-type")
        super().requestReceived(command, path, version)

    def process(self) -> None:
        if self._hidden_content_type is not None:
            self.requestHeaders.setRawHeaders(b"content-type", self._hidden_content_type)
            self._hidden_content_type = None
        super().process()


class NSQDSite(Site):
    """The HTTP listener's factory: bounded request bodies, nsqd-style logging only."""

    requestFactory = BoundedRequest

    def __init__(self, api: GoHTTPAPI, **kwargs: Any) -> None:
        super().__init__(api.resource(), **kwargs)
        self.api = api

    def log(self, request: Any) -> None:
        # HTTPAPI logs each request as nsqd does; no common-log-format lines
        return None


# --- the API -------------------------------------------------------------------------


class _Root(Resource):
    """Checks nsqd's TLS requirement and unroutable paths, then hands over to Klein."""

    isLeaf = True

    def __init__(self, api: GoHTTPAPI, klein_resource: Any) -> None:
        super().__init__()
        self.api: Any = api  # nsqd's or nsqlookupd's (only nsqd's can require TLS)
        self.klein_resource = klein_resource

    def render(self, request: Any) -> Any:
        request.responseHeaders.removeHeader(b"server")
        api = self.api
        if api.tls_required and not api.tls_enabled:
            body = (f'{{"message": "TLS_REQUIRED", "https_port": {api.nsqd.https_port}}}').encode()
            request.setHeader(b"X-NSQ-Content-Type", b"nsq; version=1.0")
            return api._write(request, 403, body, _JSON)
        try:
            unquote_to_bytes(request.path).decode("utf-8")
        except UnicodeDecodeError:
            return api._unrouted(request)
        path = unquote_to_bytes(request.path).decode("utf-8")
        if _clean_path(path).rstrip("/") != path.rstrip("/") or request.method == b"HEAD":
            # httprouter redirects unclean paths (//, /./, /../) to their clean form and
            # registers no HEAD routes (GET routes answer HEAD with 405)
            return api._unrouted(request)
        return self.klein_resource.render(request)


class GoHTTPAPI:
    """What nsqd's and nsqlookupd's HTTP APIs share: Go's ``http_api`` and httprouter.

    Subclasses set :attr:`app` (their Klein routes, with :meth:`_route_error`
    registered for NotFound and MethodNotAllowed) and :attr:`routes` (every
    route with its methods, for httprouter's redirects, 405s and 404s).
    """

    app: Klein
    routes: dict[str, tuple[str, ...]] = {}
    log = Logger()
    tls_enabled = False
    tls_required = False

    def resource(self) -> IResource:
        root: IResource = _Root(self, self.app.resource())
        return root

    def site(self, **kwargs: Any) -> Site:
        """The factory to listen with: bounds request bodies as they arrive."""
        return NSQDSite(self, **kwargs)

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
            return self._write(request, code, go_json({"message": str(data)}), _JSON)
        if isinstance(data, _Marshal):
            return self._write(request, 200, go_json(data.value), _JSON)
        if data is None:
            return self._write(request, 200, b"", None)
        if isinstance(data, str):
            data = data.encode("utf-8", "surrogateescape")
        if isinstance(data, bytes):
            return self._write(request, 200, data, _sniff(data))
        return self._write(request, 200, go_json(data), _JSON)

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

    # -- unrouted: redirects, 405, 404 (httprouter's rules) -------------------

    def _route_for(self, method: str, path: str) -> bool:
        if path.startswith("/config/") and "/config/:opt" in self.routes:
            opt = path[len("/config/"):]
            return bool(opt) and "/" not in opt and method in self.routes["/config/:opt"]
        return method in self.routes.get(path, ())

    def _fixed_path(self, method: str, path: str) -> str | None:
        """httprouter's RedirectFixedPath: cleaned, case-insensitive, slash-toggled."""
        cleaned = _clean_path(path)
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
                body = f'<a href="{escaped}">{_STATUS_TEXT[code]}</a>.\n\n'.encode()
            return self._write(request, code, body, _HTML)
        return self._write(request, code, b"", None)

    def _route_error(self, request: Any, failure: Failure) -> bytes:
        """Klein found no route (NotFound, MethodNotAllowed): answer as httprouter."""
        return self._unrouted(request)


class HTTPAPI(GoHTTPAPI):
    """nsqd's HTTP API over one :class:`~nsqtw.core.nsqd.NSQD`."""

    app = Klein()
    routes = ROUTES
    app.handle_errors(NotFound, MethodNotAllowed)(GoHTTPAPI._route_error)

    def __init__(self, nsqd: NSQD, tls_enabled: bool = False) -> None:
        self.nsqd = nsqd
        self.tls_enabled = tls_enabled
        options = nsqd.options
        self.tls_required = getattr(options, "tls_required", 0) == _TLS_REQUIRED

    def body_limit(self, target: bytes) -> int:
        """How many body bytes a request to ``target`` may keep: nsqd's limit + 1."""
        o = self.nsqd.options
        path = target.split(b"?", 1)[0]
        if path == b"/pub" or path.startswith(b"/config/"):
            return int(o.max_msg_size) + 1
        return int(o.max_body_size) + 1

    # -- /ping and /info ---------------------------------------------------

    @app.route("/ping", methods=["GET"], merge_slashes=False, strict_slashes=True)
    def ping(self, request: Any) -> bytes:
        """nsqd's PlainText answer: the health text, 500 when unhealthy."""
        health = self.nsqd.health()
        code = 200 if self.nsqd.is_healthy() else 500
        self._log_request(request, code)
        body = health.encode("utf-8", "surrogateescape")
        return self._write(request, code, body, _sniff(body))

    @app.route("/info", methods=["GET"], merge_slashes=False, strict_slashes=True)
    def info(self, request: Any) -> Any:
        return self._run(request, self._info)

    def _info(self, request: Any) -> dict[str, Any]:
        o = self.nsqd.options
        return {
            "version": NSQD_VERSION,
            "broadcast_address": o.broadcast_address,
            "hostname": socket.gethostname(),
            "http_port": self.nsqd.http_port,
            "tcp_port": self.nsqd.tcp_port,
            "start_time": int(self.nsqd.start_time),
            "max_heartbeat_interval": round(o.max_heartbeat_interval * _NS),
            "max_output_buffer_size": int(o.max_output_buffer_size),
            "max_output_buffer_timeout": round(o.max_output_buffer_timeout * _NS),
            "max_deflate_level": int(o.max_deflate_level),
        }

    # -- publishing ----------------------------------------------------------

    @app.route("/pub", methods=["POST"], merge_slashes=False, strict_slashes=True)
    def pub(self, request: Any) -> Any:
        return self._run(request, self._pub, logged=False)

    @app.route("/mpub", methods=["POST"], merge_slashes=False, strict_slashes=True)
    def mpub(self, request: Any) -> Any:
        return self._run(request, self._mpub, logged=False)

    def _topic_from_query(self, request: Any) -> tuple[dict[str, list[str]], str]:
        """nsqd's getTopicFromQuery, without the get-or-create (done by the caller)."""
        values, bad = self._query(request)
        if bad:
            raise APIError(400, "INVALID_REQUEST")
        if "topic" not in values:
            raise APIError(400, "MISSING_ARG_TOPIC")
        name = values["topic"][0]
        if not is_valid_topic_name(name):
            raise APIError(400, "INVALID_TOPIC")
        return values, name

    def _publish(self, name: str, bodies: list[bytes], defer: float = 0.0) -> str | Deferred[str]:
        """The shared publish path; answered once a spill to disk is written (as TCP)."""
        try:
            written = self.nsqd.publish(name, bodies, defer)
        except (ExitingError, BackendError):
            raise APIError(503, "EXITING") from None
        if written is None:
            return "OK"

        def failed(_: Any) -> str:
            # nsqd answers any failure to queue with 503 EXITING
            raise APIError(503, "EXITING")

        return written.addCallbacks(lambda _: "OK", failed)

    def _too_long(self, request: Any, limit: int) -> bool:
        declared = getattr(request, "declared_length", None)
        if declared is None:
            declared = request.getHeader(b"content-length")
            try:
                declared = int(declared) if declared is not None else None
            except ValueError:
                declared = None
        return declared is not None and declared > limit

    def _pub(self, request: Any) -> str | Deferred[str]:
        o = self.nsqd.options
        max_msg = int(o.max_msg_size)
        if self._too_long(request, max_msg):
            raise APIError(413, "MSG_TOO_BIG")
        body = self._body(request, max_msg + 1)
        if len(body) == max_msg + 1:
            raise APIError(413, "MSG_TOO_BIG")
        if not body:
            raise APIError(400, "MSG_EMPTY")
        values, name = self._topic_from_query(request)
        defer = 0.0
        if "defer" in values:
            try:
                ms = _go_parse_int(values["defer"][0])
            except ValueError:
                raise APIError(400, "INVALID_DEFER") from None
            if ms < 0 or ms * 1_000_000 > round(o.max_req_timeout * _NS):
                raise APIError(400, "INVALID_DEFER")
            defer = ms / 1000.0
        self.nsqd.get_topic(name)
        return self._publish(name, [body], defer)

    def _mpub(self, request: Any) -> str | Deferred[str]:
        o = self.nsqd.options
        max_body, max_msg = int(o.max_body_size), int(o.max_msg_size)
        if self._too_long(request, max_body):
            raise APIError(413, "BODY_TOO_BIG")
        values, name = self._topic_from_query(request)
        self.nsqd.get_topic(name)
        binary = False
        if "binary" in values:
            value = values["binary"][0]
            binary = _BOOL_PARAMS.get(value, True)
            if value not in _BOOL_PARAMS:
                self.log.warn("deprecated value '{value}' used for /mpub binary param", value=value)  # noqa: G010 - twisted Logger
        read_max = max_body + 1
        data = self._body(request, read_max)
        if binary:
            if len(data) > max_body:
                # only a chunked body can get here; nsqd would read on
                raise APIError(413, "BODY_TOO_BIG")
            bodies = _read_mpub(data, max_msg, max_body)
        else:
            bodies = []
            total = 0
            pos = 0
            end = len(data)
            while True:
                nl = data.find(b"\n", pos)
                stop = end if nl == -1 else nl + 1
                block = data[pos:stop]
                pos = stop
                total += len(block)
                if total == read_max:
                    raise APIError(413, "BODY_TOO_BIG")
                if block.endswith(b"\n"):
                    block = block[:-1]
                if block:
                    if len(block) > max_msg:
                        raise APIError(413, "MSG_TOO_BIG")
                    bodies.append(block)
                if nl == -1:
                    break
        return self._publish(name, bodies)

    # -- topics ----------------------------------------------------------------

    def _existing_topic(self, name: str) -> Any:
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise APIError(404, "TOPIC_NOT_FOUND")
        return topic

    @app.route("/topic/create", methods=["POST"], merge_slashes=False, strict_slashes=True)
    def topic_create(self, request: Any) -> Any:
        return self._run(request, self._topic_create)

    def _topic_create(self, request: Any) -> None:
        _, name = self._topic_from_query(request)
        self.nsqd.get_topic(name)

    @app.route("/topic/empty", methods=["POST"], merge_slashes=False, strict_slashes=True)
    def topic_empty(self, request: Any) -> Any:
        return self._run(request, self._topic_empty)

    async def _topic_empty(self, request: Any) -> None:
        values = self._params(request)
        if "topic" not in values:
            raise APIError(400, "MISSING_ARG_TOPIC")
        name = values["topic"][0]
        if not is_valid_topic_name(name):
            raise APIError(400, "INVALID_TOPIC")
        topic = self._existing_topic(name)
        try:
            await topic.empty()
        except (OSError, BackendError):
            self.log.failure("TOPIC({topic}): empty failed", topic=name)
            raise APIError(500, "INTERNAL_ERROR") from None

    @app.route("/topic/delete", methods=["POST"], merge_slashes=False, strict_slashes=True)
    def topic_delete(self, request: Any) -> Any:
        return self._run(request, self._topic_delete)

    async def _topic_delete(self, request: Any) -> None:
        values = self._params(request)
        if "topic" not in values:
            raise APIError(400, "MISSING_ARG_TOPIC")
        name = values["topic"][0]
        try:
            d = self.nsqd.delete_topic(name)
        except KeyError:
            raise APIError(404, "TOPIC_NOT_FOUND") from None
        try:
            await d
        except (OSError, BackendError):
            # nsqd answers 200 whatever the deletion of the files says
            self.log.failure("TOPIC({topic}): delete failed", topic=name)

    @app.route("/topic/pause", methods=["POST"], merge_slashes=False, strict_slashes=True)
    def topic_pause(self, request: Any) -> Any:
        return self._run(request, self._topic_pause, True)

    @app.route("/topic/unpause", methods=["POST"], merge_slashes=False, strict_slashes=True)
    def topic_unpause(self, request: Any) -> Any:
        return self._run(request, self._topic_pause, False)

    def _topic_pause(self, request: Any, pause: bool) -> None:
        values = self._params(request)
        if "topic" not in values:
            raise APIError(400, "MISSING_ARG_TOPIC")
        topic = self._existing_topic(values["topic"][0])
        topic.pause() if pause else topic.unpause()

    # -- channels ----------------------------------------------------------------

    def _topic_channel(self, request: Any) -> tuple[Any, str]:
        """nsqd's getExistingTopicFromQuery: the topic, and a valid channel name."""
        values = self._params(request)
        if "topic" not in values:
            raise APIError(400, "MISSING_ARG_TOPIC")
        topic_name = values["topic"][0]
        if not is_valid_topic_name(topic_name):
            raise APIError(400, "INVALID_ARG_TOPIC")
        if "channel" not in values:
            raise APIError(400, "MISSING_ARG_CHANNEL")
        channel_name = values["channel"][0]
        if not is_valid_channel_name(channel_name):
            raise APIError(400, "INVALID_ARG_CHANNEL")
        return self._existing_topic(topic_name), channel_name

    @staticmethod
    def _existing_channel(topic: Any, name: str) -> Any:
        channel = topic.channels.get(name)
        if channel is None:
            raise APIError(404, "CHANNEL_NOT_FOUND")
        return channel

    @app.route("/channel/create", methods=["POST"], merge_slashes=False, strict_slashes=True)
    def channel_create(self, request: Any) -> Any:
        return self._run(request, self._channel_create)

    def _channel_create(self, request: Any) -> None:
        topic, name = self._topic_channel(request)
        try:
            topic.get_channel(name)
        except ExitingError:
            raise APIError(503, "EXITING") from None

    @app.route("/channel/empty", methods=["POST"], merge_slashes=False, strict_slashes=True)
    def channel_empty(self, request: Any) -> Any:
        return self._run(request, self._channel_empty)

    async def _channel_empty(self, request: Any) -> None:
        topic, name = self._topic_channel(request)
        channel = self._existing_channel(topic, name)
        try:
            await channel.empty()
        except (OSError, BackendError):
            self.log.failure("CHANNEL({topic}:{channel}): empty failed", topic=topic.name, channel=name)
            raise APIError(500, "INTERNAL_ERROR") from None

    @app.route("/channel/delete", methods=["POST"], merge_slashes=False, strict_slashes=True)
    def channel_delete(self, request: Any) -> Any:
        return self._run(request, self._channel_delete)

    async def _channel_delete(self, request: Any) -> None:
        topic, name = self._topic_channel(request)
        try:
            d = topic.delete_channel(name)
        except KeyError:
            raise APIError(404, "CHANNEL_NOT_FOUND") from None
        try:
            await d
        except (OSError, BackendError):
            self.log.failure("CHANNEL({topic}:{channel}): delete failed", topic=topic.name, channel=name)

    @app.route("/channel/pause", methods=["POST"], merge_slashes=False, strict_slashes=True)
    def channel_pause(self, request: Any) -> Any:
        return self._run(request, self._channel_pause, True)

    @app.route("/channel/unpause", methods=["POST"], merge_slashes=False, strict_slashes=True)
    def channel_unpause(self, request: Any) -> Any:
        return self._run(request, self._channel_pause, False)

    def _channel_pause(self, request: Any, pause: bool) -> None:
        topic, name = self._topic_channel(request)
        channel = self._existing_channel(topic, name)
        channel.pause() if pause else channel.unpause()

    # -- stats ---------------------------------------------------------------------

    @app.route("/stats", methods=["GET"], merge_slashes=False, strict_slashes=True)
    def stats(self, request: Any) -> Any:
        return self._run(request, self._stats)

    def _stats(self, request: Any) -> Any:
        values = self._params(request)

        def first(key: str) -> str:
            return values[key][0] if key in values else ""

        include_clients = _BOOL_PARAMS.get(first("include_clients"), True)
        include_mem = _BOOL_PARAMS.get(first("include_mem"), True)
        snap = snapshot(self.nsqd, first("topic"), first("channel"), include_clients, include_mem)
        if first("format") == "json":
            return snap
        now = self.nsqd.clock.seconds()
        start = getattr(self.nsqd, "start_time_precise", None)
        return format_text(snap, now, start).encode("utf-8", "surrogateescape")

    # -- config ----------------------------------------------------------------------

    @app.route("/config/<opt>", methods=["GET", "PUT"], merge_slashes=False, strict_slashes=True)
    def config(self, request: Any, opt: str) -> Any:
        return self._run(request, self._config, opt)

    def _config(self, request: Any, opt: str) -> Any:
        nsqd: Any = self.nsqd
        if request.method == b"PUT":
            read_max = int(nsqd.options.max_msg_size) + 1
            body = self._body(request, read_max)
            if len(body) == read_max or not body:
                raise APIError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_tcp_addresses":
                try:
                    addresses = json.loads(body)
                except ValueError:
                    raise APIError(400, "INVALID_VALUE") from None
                if addresses is not None and (not isinstance(addresses, list)
                                              or not all(isinstance(a, str) for a in addresses)):
                    raise APIError(400, "INVALID_VALUE")
                nsqd.runtime_lookupd_tcp_addresses = addresses
            elif opt == "log_level":
                level = body.decode("utf-8", "surrogateescape").lower()
                if level not in _LOG_LEVELS:
                    raise APIError(400, "INVALID_VALUE")
                nsqd.runtime_log_level = level
            else:
                raise APIError(400, "INVALID_OPTION")
            self.log.info("config {option} changed", option=opt)
            changed = getattr(nsqd, "config_changed", None)
            if callable(changed):
                changed(opt)
        return self._config_value(opt)

    def _config_value(self, opt: str) -> Any:
        nsqd: Any = self.nsqd
        if opt == "nsqlookupd_tcp_addresses":
            return _Marshal(nsqd.runtime_lookupd_tcp_addresses)
        if opt == "log_level":
            return _Marshal(_LOG_LEVELS[nsqd.runtime_log_level])
        try:
            from nsqtw.nsqd.options import FLAGS_BY_TOML_KEY
        except ImportError:  # pragma: no cover - options.py is part of the package
            raise APIError(400, "INVALID_OPTION") from None
        flag = FLAGS_BY_TOML_KEY.get(opt)
        if flag is None:
            raise APIError(400, "INVALID_OPTION")
        value = getattr(nsqd.options, flag.attribute, flag.default)
        if flag.kind == "string":
            return str(value)  # RespondV1 writes Go strings as they are, not as JSON
        return _Marshal(_go_json_value(flag.kind, value))


def _go_parse_int(text: str) -> int:
    """Go's ``strconv.ParseInt(s, 10, 64)``: optional sign, decimal digits, int64 range."""
    digits = text[1:] if text[:1] in ("+", "-") else text
    if not digits or not digits.isascii() or not digits.isdigit():
        raise ValueError(text)
    value = int(text)
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(text)
    return value


def _read_mpub(data: bytes, max_msg: int, max_body: int) -> list[bytes]:
    """nsqd's readMPUB over a whole binary /mpub body; errors are nsqd's codes minus ``E_``."""
    if len(data) < 4:
        raise APIError(413, "BAD_BODY")
    (count,) = struct.unpack_from(">i", data, 0)
    if count <= 0 or count > (max_body - 4) // 5:
        raise APIError(413, "BAD_BODY")
    pos = 4
    bodies = []
    for _ in range(count):
        if pos + 4 > len(data):
            raise APIError(413, "BAD_MESSAGE")
        (size,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if size <= 0 or size > max_msg:
            raise APIError(413, "BAD_MESSAGE")
        if pos + size > len(data):
            raise APIError(413, "BAD_MESSAGE")
        bodies.append(data[pos:pos + size])
        pos += size
    return bodies


def _clean_path(path: str) -> str:
    """httprouter's CleanPath: one leading slash, no ``.``/``..``/``//``, trailing slash kept."""
    if not path:
        return "/"
    parts: list[str] = []
    for seg in path.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if parts:
                parts.pop()
            continue
        parts.append(seg)
    out = "/" + "/".join(parts)
    if path.endswith("/") and out != "/":
        out += "/"
    return out
