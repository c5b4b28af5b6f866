"""The admin's HTTP client to nsqd, nsqlookupd and graphite: Twisted's Agent with Go's timeouts and error texts.

nsqadmin shows upstream failures to its users verbatim (``UPSTREAM_ERROR:
...`` and ``WARNING: ...`` messages), so failures are turned into the texts
Go's ``http_api.Client`` produces: ``Get "URL": dial tcp HOST:PORT: connect:
connection refused``, ``got response 404 Not Found "{...}"``. Each request
has one deadline for connecting, sending and reading the whole answer
(``--http-client-request-timeout``) and a connect timeout of its own
(``--http-client-connect-timeout``).

Addresses come from nsqlookupd registrations, which anyone who can reach a
lookupd may make, so every URL is checked before it is asked (:func:`_target`):
IPv6 hosts bracketed, names taken as they are (never IDNA-mapped, so
``my_host`` stays ``my_host``), ports checked. Whatever goes wrong with one
request, a bad address included, is an :class:`UpstreamError` for that
request, never an error of the admin's own answer.
"""

from __future__ import annotations

import ipaddress
import json
import math
import os
import string
from dataclasses import dataclass
from http import HTTPStatus
from io import BytesIO
from typing import Any, cast
from urllib.parse import quote as percent_encode

import treq
from twisted.internet import defer, error
from twisted.internet.endpoints import HostnameEndpoint, wrapClientTLS
from twisted.internet.interfaces import IStreamClientEndpoint
from twisted.internet.ssl import CertificateOptions, PrivateCertificate, optionsForClientTLS
from twisted.internet.threads import deferToThreadPool
from twisted.web.client import (
    Agent,
    BrowserLikePolicyForHTTPS,
    ContentDecoderAgent,
    FileBodyProducer,
    GzipDecoder,
    HTTPConnectionPool,
    RedirectAgent,
    ResponseFailed,
)
from twisted.web.http_headers import Headers
from twisted.web.iweb import IAgentEndpointFactory, IPolicyForHTTPS
from zope.interface import implementer

from nsqtw._go.strconv import quote
from nsqtw.net.listen import join_host_port
from nsqtw.net.tls import client_trust_root
from nsqtw.net.twisted_privates import quiet_pool
from nsqtw.protocol.auth import https_endpoint

__all__ = ["AdminHTTPClient", "UpstreamError", "client_tls_policy", "decode_json"]

_ACCEPT = "application/vnd.nsq; version=1.0"
#: answers larger than this are decoded on a worker thread, off the reactor
_BIG_BODY = 256 * 1024
#: the most an upstream answer may hold (a node's /stats with every client is far below)
_MAX_BODY = 256 * 1024 * 1024


class UpstreamError(Exception):
    """One failed request; ``str()`` is the text Go's client would give."""


@implementer(IPolicyForHTTPS)
class _InsecurePolicy:
    """``--http-client-tls-insecure-skip-verify``: TLS without checking the node's certificate."""

    def __init__(self, client_cert: Any = None) -> None:
        self.client_cert = client_cert

    def creatorForNetloc(self, hostname: bytes, port: int) -> Any:
        extra: dict[str, Any] = {}
        if self.client_cert is not None:
            extra = {"privateKey": self.client_cert.privateKey.original,
                     "certificate": self.client_cert.original}
        return CertificateOptions(verify=False, **extra)


@implementer(IPolicyForHTTPS)
class _VerifyingPolicy:
    """TLS that checks the node's certificate against ``trust_root``, offering a client certificate."""

    def __init__(self, trust_root: Any, client_cert: Any) -> None:
        self.trust_root = trust_root
        self.client_cert = client_cert

    def creatorForNetloc(self, hostname: bytes, port: int) -> Any:
        return optionsForClientTLS(hostname.decode("ascii"), trustRoot=self.trust_root,
                                   clientCertificate=self.client_cert)


def client_tls_policy(options: Any) -> IPolicyForHTTPS:
    """The https:// policy nsqadmin's ``--http-client-tls-*`` flags describe (errors: ValueError)."""
    client_cert = None
    if options.http_client_tls_cert:
        try:
            with open(options.http_client_tls_cert, "rb") as f:
                cert = f.read()
            with open(options.http_client_tls_key, "rb") as f:
                key = f.read()
            client_cert = PrivateCertificate.loadPEM(cert + b"\n" + key)
        except Exception as e:  # noqa: BLE001 - any failure to load is a start-up error
            raise ValueError(f"failed to LoadX509KeyPair - {e}") from None
    if options.http_client_tls_insecure_skip_verify:
        return _InsecurePolicy(client_cert)
    trust_root = None
    if options.http_client_tls_root_ca_file:
        try:
            trust_root = client_trust_root(options.http_client_tls_root_ca_file)
        except Exception as e:  # noqa: BLE001
            raise ValueError(f"failed to read TLS root CA file "
                             f"{options.http_client_tls_root_ca_file} - {e}") from None
    if client_cert is None:
        return BrowserLikePolicyForHTTPS(trustRoot=trust_root)
    return _VerifyingPolicy(trust_root, client_cert)


#: what a host name may hold (Go's isDomainName: letters, digits, ``-``, ``_`` and dots)
_NAME_CHARS = frozenset(string.ascii_letters + string.digits + "-_.")
#: characters of a path and query sent as they are; anything else is percent-encoded
_PATH_SAFE = "!$%&'()*+,/:;=?@[]~"


@dataclass(frozen=True)
class _Target:
    """A checked URL: what the agent is given, and the host and port it dials (for Go's texts)."""

    uri: bytes
    host: str
    port: int


def _bad_name(name: str) -> bool:
    """Not a name DNS could answer for (Go's isDomainName): empty labels, or too long."""
    labels = name[:-1].split(".") if name.endswith(".") else name.split(".")
    return len(name) > 254 or any(not 0 < len(label) <= 63 for label in labels)


def _target(method: str, url: str) -> _Target:
    """Check ``url`` (built from addresses nobody vouches for); UpstreamError with Go's text if bad."""
    where = f"{method} {quote(url)}"
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("http", "https"):
        raise UpstreamError(f'{where}: unsupported protocol scheme "{scheme}"')
    end = len(rest)
    for stop in "/?#":
        at = rest.find(stop)
        if at >= 0:
            end = min(end, at)
    authority, path = rest[:end], rest[end:] or "/"
    if "@" in authority:
        raise UpstreamError(f'parse {quote(url)}: invalid character "@" in host name')
    if authority.startswith("["):
        literal, bracket, port_text = authority[1:].partition("]")
        if not bracket or (port_text and not port_text.startswith(":")):
            raise UpstreamError(f"parse {quote(url)}: missing ']' in host")
        port_text = port_text[1:]
        try:
            ipaddress.IPv6Address(literal)
        except ValueError:
            raise UpstreamError(f"{where}: dial tcp: lookup {literal}: no such host") from None
        host, dialled = f"[{literal}]", literal
    else:
        name, _, port_text = authority.partition(":")
        if ":" in port_text:
            raise UpstreamError(f"{where}: dial tcp: address {authority}: too many colons in address")
        if not name:
            raise UpstreamError(f"{where}: http: no Host in request URL")
        if not name.isascii():
            try:
                name = name.encode("idna").decode("ascii")
            except UnicodeError:
                raise UpstreamError(f"{where}: dial tcp: lookup {name}: no such host") from None
        bad = [c for c in name if c not in _NAME_CHARS]
        if bad:
            raise UpstreamError(f"parse {quote(url)}: invalid character {quote(bad[0])} in host name")
        if _bad_name(name):
            raise UpstreamError(f"{where}: dial tcp: lookup {name}: no such host")
        host = dialled = name
    if port_text and not (port_text.isascii() and port_text.isdigit()):
        raise UpstreamError(f"parse {quote(url)}: invalid port {quote(':' + port_text)} after host")
    port = int(port_text) if port_text else (443 if scheme == "https" else 80)
    if not 0 < port <= 65535:
        raise UpstreamError(f"{where}: dial tcp: address {port_text}: invalid port")
    netloc = f"{host}:{port_text}" if port_text else host
    uri = f"{scheme}://{netloc}{percent_encode(path, safe=_PATH_SAFE)}"
    return _Target(uri.encode("ascii"), dialled, port)


def _go_text(where: str, target: _Target, failure: BaseException) -> str:
    """What Go's net/http client says for a request that got no answer."""
    address = join_host_port(target.host, target.port)
    if isinstance(failure, error.ConnectionRefusedError):
        return f"{where}: dial tcp {address}: connect: connection refused"
    if isinstance(failure, error.DNSLookupError):
        return f"{where}: dial tcp: lookup {target.host}: no such host"
    if isinstance(failure, (error.TimeoutError, error.TCPTimedOutError)):
        return f"{where}: dial tcp {address}: i/o timeout"
    if isinstance(failure, (defer.TimeoutError, defer.CancelledError)):
        return f"{where}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    if isinstance(failure, ResponseFailed):
        return f"{where}: EOF"
    if isinstance(failure, error.ConnectError) and isinstance(failure.osError, int):
        return f"{where}: dial tcp {address}: connect: {os.strerror(failure.osError).lower()}"
    return f"{where}: {failure}"


class _NameAsIsEndpoint(HostnameEndpoint):
    """A HostnameEndpoint that resolves a host name as it is given (``my_host`` included).

    It overrides Twisted's private ``_hostAsBytesAndText``: listed, with
    why, in :data:`nsqtw.net.twisted_privates.OVERRIDDEN`, which a test
    checks against the installed Twisted.

    Twisted's refuses names that are not valid IDNA 2008, underscores among
    them; Go's client and the system resolver take them, so nsqadmin reaches a
    node registered as ``my_host``. :func:`_target` has already checked the
    name: ASCII, a DNS name's characters and lengths, or an IP address.
    """

    @staticmethod
    def _hostAsBytesAndText(host: bytes | str) -> tuple[bool, bytes, str]:
        text = host.decode("ascii") if isinstance(host, bytes) else host
        return False, text.encode("ascii"), text


@implementer(IAgentEndpointFactory)
class _EndpointFactory:
    """The Agent's endpoints: Twisted's standard ones, but with names taken as they are."""

    def __init__(self, reactor: Any, policy: IPolicyForHTTPS, connect_timeout: float) -> None:
        self.reactor = reactor
        self.policy = policy
        self.connect_timeout = connect_timeout

    def endpointForURI(self, uri: Any) -> IStreamClientEndpoint:
        endpoint: IStreamClientEndpoint = _NameAsIsEndpoint(
            self.reactor, uri.host.decode("ascii"), uri.port, timeout=self.connect_timeout)
        if uri.scheme == b"https":
            return wrapClientTLS(self.policy.creatorForNetloc(uri.host, uri.port), endpoint)
        return endpoint


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} out of range")
    return value


def _no_constant(name: str) -> Any:
    raise ValueError(f"invalid character {name[0]!r} looking for beginning of value")


def decode_json(content: bytes) -> Any:
    """A node's JSON as Go reads it: ``NaN``, ``Infinity`` and numbers past float64 are errors, not values."""
    return json.loads(content, parse_float=_finite, parse_constant=_no_constant)


class AdminHTTPClient:
    """GET JSON and POST actions as nsqadmin's ``http_api.Client`` does."""

    def __init__(self, reactor: Any, connect_timeout: float, request_timeout: float,
                 policy: IPolicyForHTTPS | None = None, user_agent: str = "") -> None:
        self.reactor = reactor
        self.request_timeout = request_timeout
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.pool.maxPersistentPerHost = 4
        quiet_pool(self.pool)  # no "Starting factory" line per connection
        endpoints = _EndpointFactory(reactor, policy or BrowserLikePolicyForHTTPS(), connect_timeout)
        agent = Agent.usingEndpointFactory(reactor, endpoints, pool=self.pool)
        # what treq would add (redirects of GETs, gzip), without its IDNA mapping of the host
        self._agent = ContentDecoderAgent(RedirectAgent(agent), [(b"gzip", GzipDecoder)])
        self.user_agent = user_agent

    def close(self) -> defer.Deferred[None]:
        """Drop the kept-alive connections (at stop)."""
        return cast(defer.Deferred[None], self.pool.closeCachedConnections())

    async def _request(self, method: str, url: str, body: bytes | None = None,
                       headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        target = _target(method, url)
        h = Headers({"Accept": [_ACCEPT]})
        if self.user_agent:
            h.setRawHeaders("User-Agent", [self.user_agent])
        for k, v in (headers or {}).items():
            h.setRawHeaders(k, [v])
        producer = FileBodyProducer(BytesIO(body)) if body is not None else None
        try:
            d = self._agent.request(method.upper().encode("ascii"), target.uri, h, producer)
        except Exception as e:  # noqa: BLE001 - a request that cannot even start is that node's error
            raise UpstreamError(_go_text(f"{method} {quote(url)}", target, e)) from None

        def read(response: Any) -> Any:
            length = response.length
            if isinstance(length, int) and length > _MAX_BODY:
                response.deliverBody(_Discard())
                raise UpstreamError(f"{method} {quote(url)}: answer too large ({length} bytes)")
            return treq.content(response).addCallback(lambda content: (response.code, content))

        d.addCallback(read)
        timed_out: list[bool] = []

        def on_timeout(result: Any, timeout: float) -> Any:
            timed_out.append(True)
            return result

        # one deadline for connecting, sending and reading the whole answer (Go's client timeout)
        d.addTimeout(self.request_timeout, self.reactor, onTimeoutCancel=on_timeout)
        try:
            return cast(tuple[int, bytes], await d)
        except UpstreamError:
            raise
        except Exception as e:  # noqa: BLE001 - every transport failure becomes Go's text
            cause: BaseException = defer.TimeoutError() if timed_out else e
            raise UpstreamError(_go_text(f"{method} {quote(url)}", target, cause)) from None

    async def _with_https_retry(self, method: str, url: str,
                                body: bytes | None = None,
                                headers: dict[str, str] | None = None) -> bytes:
        code, content = await self._request(method, url, body, headers)
        if code == 403 and not url.startswith("https"):
            # as nsqadmin's client: a node that requires TLS answers 403 with its https_port
            try:
                url = https_endpoint(url, content)
            except Exception as e:  # noqa: BLE001
                raise UpstreamError(str(e)) from None
            code, content = await self._request(method, url, body, headers)
        if code != 200:
            try:
                status = f"{code} {HTTPStatus(code).phrase}"
            except ValueError:
                status = f"{code} status code {code}"
            raise UpstreamError(f"got response {status} {quote(content.decode('utf-8', 'replace'))}")
        return content

    async def get_json(self, url: str, headers: dict[str, str] | None = None) -> Any:
        """GET an NSQ daemon's V1 answer and decode it (big answers on a worker thread)."""
        content = await self._with_https_retry("Get", url, None, headers)
        if not content:
            content = b"{}"
        try:
            if len(content) > _BIG_BODY:
                return await deferToThreadPool(self.reactor, self.reactor.getThreadPool(),
                                               decode_json, content)
            return decode_json(content)
        except ValueError as e:
            raise UpstreamError(f"invalid character in answer of {url}: {e}") from None

    async def post(self, url: str, body: bytes | None = None,
                   headers: dict[str, str] | None = None) -> None:
        """POST an action; anything but 200 is an error."""
        await self._with_https_retry("Post", url, body, headers)


class _Discard:
    """A body receiver that drops everything (an answer refused for its size)."""

    def makeConnection(self, transport: Any) -> None:
        transport.stopProducing()

    def dataReceived(self, data: bytes) -> None:
        return None

    def connectionLost(self, reason: Any) -> None:
        return None
