"""The admin's HTTP client to nsqd, nsqlookupd and graphite: treq with Go's timeouts and error texts.

nsqadmin shows upstream failures to its users verbatim (``UPSTREAM_ERROR:
...`` and ``WARNING: ...`` messages), so failures are turned into the texts
Go's ``http_api.Client`` produces: ``Get "URL": dial tcp HOST:PORT: connect:
connection refused``, ``got response 404 Not Found "{...}"``. Each request
has one deadline for connecting, sending and reading the whole answer
(``--http-client-request-timeout``) and a connect timeout of its own
(``--http-client-connect-timeout``).
"""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any, cast
from urllib.parse import urlsplit

import treq
from treq.client import HTTPClient
from twisted.internet import defer, error
from twisted.internet.ssl import CertificateOptions, PrivateCertificate, optionsForClientTLS
from twisted.internet.threads import deferToThreadPool
from twisted.web.client import (
    Agent,
    BrowserLikePolicyForHTTPS,
    HTTPConnectionPool,
    ResponseFailed,
    _HTTP11ClientFactory,
)
from twisted.web.http_headers import Headers
from twisted.web.iweb import IPolicyForHTTPS
from zope.interface import implementer

from nsqtw._go.strconv import quote
from nsqtw.net.tls import client_trust_root
from nsqtw.protocol.auth import https_endpoint

__all__ = ["AdminHTTPClient", "UpstreamError", "client_tls_policy"]

_ACCEPT = "application/vnd.nsq; version=1.0"
#: answers larger than this are decoded on a worker thread, off the reactor
_BIG_BODY = 256 * 1024
#: the most an upstream answer may hold (a node's /stats with every client is far below)
_MAX_BODY = 256 * 1024 * 1024



class _QuietFactory(_HTTP11ClientFactory):
    noisy = False


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


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = parts.hostname or ""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _go_text(method: str, url: str, failure: BaseException) -> str:
    """What Go's net/http client says for a request that got no answer."""
    where = f'{method} {quote(url)}'
    if isinstance(failure, error.ConnectionRefusedError):
        return f"{where}: dial tcp {_host_port(url)}: connect: connection refused"
    if isinstance(failure, error.DNSLookupError):
        return f"{where}: dial tcp: lookup {urlsplit(url).hostname}: no such host"
    if isinstance(failure, (error.TimeoutError, error.TCPTimedOutError)):
        return f"{where}: dial tcp {_host_port(url)}: i/o timeout"
    if isinstance(failure, (defer.TimeoutError, defer.CancelledError)):
        return f"{where}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    if isinstance(failure, ResponseFailed):
        return f"{where}: EOF"
    return f"{where}: {failure}"


class AdminHTTPClient:
    """GET JSON and POST actions as nsqadmin's ``http_api.Client`` does."""

    def __init__(self, reactor: Any, connect_timeout: float, request_timeout: float,
                 policy: IPolicyForHTTPS | None = None, user_agent: str = "") -> None:
        self.reactor = reactor
        self.request_timeout = request_timeout
        self.pool = HTTPConnectionPool(reactor, persistent=True)
        self.pool.maxPersistentPerHost = 4
        self.pool._factory = _QuietFactory  # no "Starting factory" line per connection
        agent = Agent(reactor, contextFactory=policy or BrowserLikePolicyForHTTPS(),
                      connectTimeout=connect_timeout, pool=self.pool)
        self._http = HTTPClient(agent)
        self.user_agent = user_agent

    def close(self) -> defer.Deferred[None]:
        """Drop the kept-alive connections (at stop)."""
        return cast(defer.Deferred[None], self.pool.closeCachedConnections())

    async def _request(self, method: str, url: str, body: bytes | None = None,
                       headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        h = Headers({"Accept": [_ACCEPT]})
        if self.user_agent:
            h.setRawHeaders("User-Agent", [self.user_agent])
        for k, v in (headers or {}).items():
            h.setRawHeaders(k, [v])
        d = self._http.request(method.upper(), url, headers=h, data=body)

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
            raise UpstreamError(_go_text(method, url, cause)) from None

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
                                               json.loads, content)
            return json.loads(content)
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
