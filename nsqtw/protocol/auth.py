"""AUTH: asking ``--auth-http-address`` servers what a secret may do (nsqd's ``internal/auth``).

nsqd sends ``/auth?common_name=&remote_ip=&secret=&tls=`` (or, with
``--auth-http-request-method=post``, the same values as a JSON object of
lists) to one auth server after another, starting at a random one, until
one answers with::

    {"ttl": 3600, "identity": "...", "identity_url": "...",
     "authorizations": [{"topic": "regex", "channels": ["regex"],
                         "permissions": ["subscribe", "publish"]}]}

The answer holds for ``ttl`` seconds; after that the next command that
needs it asks again. Topic and channel patterns are regular expressions
that may match anywhere in the name (Go's ``MatchString``); they are
compiled with Python's ``re``, which accepts a superset of Go's RE2 syntax.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from typing import Any, cast
from urllib.parse import urlencode, urlsplit, urlunsplit

from twisted.internet.defer import Deferred, ensureDeferred
from twisted.internet.interfaces import IReactorTime
from twisted.web.http_headers import Headers
from zope.interface import implementer

from nsqtw._go.json import go_loads
from nsqtw.interfaces import IAuthorizer
from nsqtw.log import Logger

__all__ = ["AuthError", "AuthState", "Authorization", "HTTPAuthorizer", "parse_auth_response"]

_PERMISSIONS = ("subscribe", "publish")
_ACCEPT = "application/vnd.nsq; version=1.0"


class AuthError(Exception):
    """The auth servers could not be asked, or answered something unusable."""


class Authorization:
    """One entry of ``authorizations``: a topic pattern, channel patterns and permissions."""

    __slots__ = ("topic", "channels", "permissions")

    def __init__(self, topic: str, channels: Sequence[str], permissions: Sequence[str]) -> None:
        self.topic = re.compile(topic)
        self.channels = [re.compile(c) for c in channels]
        self.permissions = frozenset(permissions)

    def is_allowed(self, topic: str, channel: str) -> bool:
        """A channel means SUB (needs ``subscribe``); none means a publish (needs ``publish``)."""
        if ("subscribe" if channel else "publish") not in self.permissions:
            return False
        if self.topic.search(topic) is None:
            return False
        return any(c.search(channel) is not None for c in self.channels)


class AuthState:
    """What the auth server said about one secret, until ``expires``."""

    __slots__ = ("ttl", "identity", "identity_url", "authorizations", "expires", "_cache")

    def __init__(self, ttl: int, identity: str, identity_url: str,
                 authorizations: list[Authorization], expires: float) -> None:
        self.ttl = ttl
        self.identity = identity
        self.identity_url = identity_url
        self.authorizations = authorizations
        self.expires = expires
        self._cache: dict[tuple[str, str], bool] = {}

    def is_allowed(self, topic: str, channel: str) -> bool:
        key = (topic, channel)
        allowed = self._cache.get(key)
        if allowed is None:
            allowed = any(a.is_allowed(topic, channel) for a in self.authorizations)
            if len(self._cache) < 1024:  # a client uses few topics; never grow unbounded
                self._cache[key] = allowed
        return allowed

    def expired(self, now: float) -> bool:
        return self.expires < now


def _field(data: dict[str, Any], name: str) -> Any:
    """A JSON field as Go's decoder finds it: the exact key, else one differing in case only."""
    if name in data:
        return data[name]
    for key, value in data.items():
        if key.lower() == name:
            return value
    return None


def _strings(value: Any, what: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise AuthError(f"cannot decode {what}: not a list of strings")
    return value


def https_endpoint(endpoint: str, body: bytes) -> str:
    """The HTTPS address a 403 answer points to: same host and path, its ``https_port``."""
    try:
        port = int(go_loads(body)["https_port"])
    except (ValueError, KeyError, TypeError) as e:
        raise AuthError(f"got response 403 without an https_port: {json.dumps(body.decode('utf-8', 'replace'))}") from e
    url = urlsplit(endpoint)
    host = url.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return urlunsplit(("https", f"{host}:{port}", url.path, url.query, url.fragment))


def parse_auth_response(body: bytes, now: float) -> AuthState:
    """Decode and check an auth server's answer as nsqd does; raises AuthError."""
    try:
        data = go_loads(body)
    except ValueError as e:
        raise AuthError(f"invalid JSON - {e}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AuthError("cannot decode response: not a JSON object")
    ttl = _field(data, "ttl")
    if ttl is None:
        ttl = 0
    if isinstance(ttl, bool) or not isinstance(ttl, int):
        raise AuthError(f"cannot decode ttl {ttl!r} as an integer")
    identity = _field(data, "identity") or ""
    identity_url = _field(data, "identity_url") or ""
    if not isinstance(identity, str) or not isinstance(identity_url, str):
        raise AuthError("cannot decode identity: not a string")
    raw = _field(data, "authorizations")
    if raw is not None and not isinstance(raw, list):
        raise AuthError("cannot decode authorizations: not a list")
    authorizations = []
    for item in raw or []:
        if item is None:
            item = {}
        if not isinstance(item, dict):
            raise AuthError("cannot decode an authorization: not an object")
        topic = _field(item, "topic") or ""
        if not isinstance(topic, str):
            raise AuthError("cannot decode topic: not a string")
        channels = _strings(_field(item, "channels"), "channels")
        permissions = _strings(_field(item, "permissions"), "permissions")
        for p in permissions:
            if p not in _PERMISSIONS:
                raise AuthError(f"unknown permission {p}")
        for pattern, what in [(topic, "topic")] + [(c, "channel") for c in channels]:
            try:
                re.compile(pattern)
            except re.error as e:
                raise AuthError(f"unable to compile {what} {json.dumps(pattern)} {e}") from None
        authorizations.append(Authorization(topic, channels, permissions))
    if ttl <= 0:
        raise AuthError(f"invalid TTL {ttl} (must be >0)")
    return AuthState(ttl, identity, identity_url, authorizations, now + ttl)


@implementer(IAuthorizer)
class HTTPAuthorizer:
    """Asks the ``--auth-http-address`` servers over HTTP(S) with treq, as nsqd's auth client."""

    log = Logger()

    def __init__(self, addresses: Sequence[str], method: str, connect_timeout: float,
                 request_timeout: float, reactor: Any, trust_root: Any = None) -> None:
        self.addresses = list(addresses)
        self.method = method
        self.request_timeout = request_timeout
        self.clock: IReactorTime = reactor
        # imported here, not with the module: a node without --auth-http-address never needs
        # treq or twisted.web.client (docs/performance.md, Memory)
        import treq
        from treq.client import HTTPClient
        from twisted.web.client import Agent, BrowserLikePolicyForHTTPS, HTTPConnectionPool

        self._content = treq.content
        policy = BrowserLikePolicyForHTTPS(trustRoot=trust_root)
        pool = HTTPConnectionPool(reactor, persistent=False)
        agent = Agent(reactor, contextFactory=policy, connectTimeout=connect_timeout, pool=pool)
        self._http = HTTPClient(agent)

    async def _request(self, endpoint: str, values: dict[str, str]) -> tuple[int, Any, bytes]:
        headers = Headers({"Accept": [_ACCEPT]})
        if self.method == "post":
            body = json.dumps({k: [v] for k, v in values.items()}, separators=(",", ":")).encode()
            headers.setRawHeaders("Content-Type", ["application/json"])
            d = self._http.post(endpoint, data=body, headers=headers)
        else:
            d = self._http.get(f"{endpoint}?{urlencode(values)}", headers=headers)
        d.addCallback(lambda response: self._content(response).addCallback(
            lambda content: (response.code, response.phrase, content)))
        # one deadline for connecting, sending and reading the whole answer (Go's client timeout)
        d.addTimeout(self.request_timeout, self.clock)
        return cast(tuple[int, Any, bytes], await d)

    def query(self, remote_ip: str, tls: bool, secret: str, common_name: str) -> Deferred[AuthState]:
        return ensureDeferred(self._query_any(remote_ip, tls, secret, common_name))

    async def _query_any(self, remote_ip: str, tls: bool, secret: str, common_name: str) -> AuthState:
        values = {"common_name": common_name, "remote_ip": remote_ip, "secret": secret,
                  "tls": "true" if tls else "false"}
        errors: list[str] = []
        start = random.randrange(len(self.addresses))
        for i in range(len(self.addresses)):
            address = self.addresses[(start + i) % len(self.addresses)]
            try:
                return await self._query(address, values)
            except Exception as e:  # noqa: BLE001 - any failure moves on to the next server
                text = str(e) or type(e).__name__
                self.log.error("AUTH: failed to auth against {address} - {error}",
                               address=address, error=text)
                errors.append(f"failed to auth against {address} - {text}")
        raise AuthError("; ".join(errors))

    async def _query(self, address: str, values: dict[str, str]) -> AuthState:
        endpoint = address if "://" in address else f"http://{address}/auth"
        code, phrase, content = await self._request(endpoint, values)
        if code == 403 and not endpoint.startswith("https"):
            # as nsqd's HTTP client: a server that wants TLS answers 403 with its
            # "https_port"; ask again there
            code, phrase, content = await self._request(https_endpoint(endpoint, content), values)
        if code != 200:
            status = phrase.decode("latin-1", "replace") if isinstance(phrase, bytes) else phrase
            raise AuthError(f"got response {code} {status} {json.dumps(content.decode('utf-8', 'replace'))}")
        return parse_auth_response(content, self.clock.seconds())


def authorizer_for(options: Any, reactor: Any) -> HTTPAuthorizer | None:
    """nsqd's auth-server client for these options (none without ``--auth-http-address``):
    the one process's, and each worker's with ``--workers``."""
    if not options.auth_http_address:
        return None
    from nsqtw.net.tls import client_trust_root

    return HTTPAuthorizer(options.auth_http_address, options.auth_http_request_method,
                          options.http_client_connect_timeout, options.http_client_request_timeout,
                          reactor, client_trust_root(options.tls_root_ca_file))
