"""nsqadmin's HTTP routing and what every handler shares: the route table, httprouter's matching,
the checks a request passes before Klein sees it (the path, the method, the host and origin of one
that changes state), and
:class:`AdminBase`, the state and helpers the pages, queries and actions use.

Every route lives under ``--base-path``. :class:`_AdminRoot` answers httprouter's 404s, 405s and
redirects before Klein routes anything; the handlers are registered on the one Klein app,
:data:`ADMIN_APP`, by :mod:`nsqtw.admin.pages`, :mod:`nsqtw.admin.queries` and
:mod:`nsqtw.admin.actions`, and bound to the :class:`~nsqtw.admin.http.AdminHTTPAPI` that
combines them.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import posixpath
import socket
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import unquote_to_bytes

from klein import Klein
from twisted.internet.threads import deferToThreadPool
from twisted.web.resource import IResource, Resource
from werkzeug.exceptions import MethodNotAllowed, NotFound

from nsqtw._go.json import go_json
from nsqtw._go.path import clean_path
from nsqtw.admin.client import AdminHTTPClient
from nsqtw.admin.cluster import ClusterInfo, Errors, QueryFailed
from nsqtw.admin.history import History
from nsqtw.admin.options import AdminOptions, normalize_base_path
from nsqtw.http.base import JSON, APIError, GoHTTPAPI
from nsqtw.http.origin import CROSS_ORIGIN, HOST_NOT_ALLOWED, ServedHosts, host_name, origin_of
from nsqtw.net.listen import split_host_port

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

_Handler = TypeVar("_Handler", bound=Callable[..., Any])

#: the one Klein app every admin route is registered on (bound to each AdminHTTPAPI as ``app``)
ADMIN_APP = Klein()
ADMIN_APP.handle_errors(NotFound, MethodNotAllowed)(GoHTTPAPI._route_error)


class RawJSON(bytes):
    """An answer already encoded (off the reactor thread) as Go's JSON."""


def admin_route(app: Klein, path: str, methods: tuple[str, ...]) -> Callable[[_Handler], _Handler]:
    """Klein's route decorator with httprouter's strictness (no slash merging or fixing)."""
    klein_path = "/".join(f"<{s[1:]}>" if s.startswith(":") else s for s in path.split("/"))
    route: Callable[[_Handler], _Handler] = app.route(
        klein_path or "/", methods=list(methods), merge_slashes=False, strict_slashes=True)
    return route


def match_route(pattern: str, path: str) -> bool:
    """httprouter's matching of one route: ``:name`` takes one non-empty segment."""
    want, got = pattern.split("/"), path.split("/")
    if len(want) != len(got):
        return False
    return all(w == g or (w.startswith(":") and g != "") for w, g in zip(want, got, strict=True))


def warn_message(messages: Errors) -> str:
    """nsqadmin's maybeWarnMsg."""
    return "WARNING: " + "; ".join(messages) if messages else ""


#: methods that change nothing: never checked for their origin
_SAFE_METHODS = frozenset({"GET", "HEAD"})
#: what ``Sec-Fetch-Site`` says of a request the admin's own page (or a typed URL) made
_OWN_SITE = frozenset({"same-origin", "none"})


def cross_site_refusal(method: str, api_route: bool, headers: dict[str, str],
                       allowed_origins: frozenset[str], served: ServedHosts | None = None) -> APIError | None:
    """nsqtw: why a request that changes state looks sent by another site's page, or None.

    First its ``Host`` must be one the admin serves (``served``, see
    :func:`served_hosts`; 403 ``HOST_NOT_ALLOWED``): a page whose name an
    attacker rebound to the admin's address (DNS rebinding) sends requests
    that are same-origin by every other measure, naming the attacker's
    host. Then a browser tells where a request comes from: ``Sec-Fetch-Site`` where it
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
    if served is not None and not served.serves(headers.get("host")):
        return APIError(403, HOST_NOT_ALLOWED)
    origin = headers.get("origin")
    seen = origin_of(origin) if origin is not None else ""
    if origin is None or seen not in allowed_origins:
        site = headers.get("sec-fetch-site")
        if site is not None:
            if site.strip().lower() not in _OWN_SITE:
                return APIError(403, CROSS_ORIGIN)
        elif origin is not None:
            # the admin's own origin, as far as the Host header tells it (``Origin: null``: never)
            scheme = seen.partition("://")[0]
            if not seen or origin_of(f"{scheme}://{headers.get('host', '')}") != seen:
                return APIError(403, CROSS_ORIGIN)
    if api_route:
        media_type = headers.get("content-type", "").partition(";")[0].strip().lower()
        if media_type != "application/json" and "x-requested-with" not in headers:
            return APIError(415, "JSON_CONTENT_TYPE_REQUIRED")
    return None


def served_hosts(options: AdminOptions, hostname: str) -> ServedHosts:
    """The hosts the admin takes state-changing requests for: ``--allow-host``, its hostname and listen name.

    Any IP address and ``localhost`` are served whatever is listened on
    (:class:`~nsqtw.http.origin.ServedHosts`), so on ``0.0.0.0`` or ``::``
    every address of the machine is; the machine's hostname is added, and
    the ``--http-address`` host when it is a name. Other names the admin is
    reached by (a DNS alias, the fully qualified name, a proxy that keeps
    ``Host``) are given with ``--allow-host``.
    """
    names = list(options.allow_host)
    try:
        listen_host = split_host_port(options.http_address)[0]
    except ValueError:
        listen_host = ""
    for name in (hostname, listen_host):
        if name and ":" not in name:  # an IPv6 address is served anyway
            try:
                ServedHosts([name])
            except ValueError:
                continue  # a hostname no browser could send as Host
            names.append(name)
    return ServedHosts(names)


def go_decode_error(body: bytes, e: ValueError) -> str:
    """The text Go's json.Decoder gives for a body it cannot read into a struct."""
    stripped = body.strip()
    if not stripped:
        return "EOF"
    pos = getattr(e, "pos", 0)
    if pos >= len(body.rstrip()):
        return "unexpected EOF"
    ch = body[pos:pos + 1].decode("latin-1")
    return f"invalid character {ch!r} looking for beginning of value"


def decode_struct(body: bytes, fields: tuple[str, ...]) -> dict[str, str]:
    """Read a JSON object's string fields as Go decodes the request into a struct (ValueError: Go's text)."""
    text = body.decode("utf-8", "replace")
    try:
        value, _ = json.JSONDecoder().raw_decode(text.lstrip())
    except json.JSONDecodeError as e:
        raise ValueError(go_decode_error(body, e)) from None
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

    def __init__(self, api: AdminBase, klein_resource: Any) -> None:
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


class AdminBase(GoHTTPAPI):
    """The state and helpers of nsqadmin's routes over one cluster; ``options`` may change at run time."""

    app = ADMIN_APP

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
        self.served_hosts = served_hosts(options, self.hostname)
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
        return any(method in methods and match_route(route, path) for route, methods in self.routes.items())

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
                                     self.allowed_origins, self.served_hosts)
        if refusal is not None and refusal.text == HOST_NOT_ALLOWED:
            self.log.warn("refused {method} {path}: Host {host} is not a name this admin serves (its"
                          " addresses, localhost, {hostname}, --allow-host); if it is, add"
                          " --allow-host={name}", method=method, path=path, host=headers.get("host"),
                          hostname=self.hostname, name=host_name(headers.get("host", "")) or "NAME")
        elif refusal is not None:
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
            return decode_struct(self._body(request, 1024 * 1024), fields)
        except ValueError as e:
            raise APIError(400, str(e)) from None


def basic_auth_user(request: Any) -> str:
    header = request.getHeader(b"authorization") or b""
    scheme, _, token = header.partition(b" ")
    if scheme != b"Basic":
        return ""
    try:
        user, sep, _ = base64.b64decode(token, validate=True).partition(b":")
    except ValueError:
        return ""
    return user.decode("utf-8", "replace") if sep else ""

