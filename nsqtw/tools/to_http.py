"""``nsqtw to-http``: nsq_to_http — send each message of a topic/channel to HTTP endpoints.

``--post=URL`` POSTs the body (``--content-type``); ``--get=URL`` GETs the URL
with its one ``%s`` replaced by the query-escaped body. ``--header=Key:Value``
adds headers. With several addresses ``--mode`` picks: ``round-robin``,
``hostpool`` (in turn, skipping endpoints that failed recently; Go's
default), ``epsilon-greedy`` (as hostpool here), or ``multicast`` (fan-out:
every endpoint gets every message; deprecated in nsq_to_http, kept here).
A message is FINed only when its request(s) answered 2xx (200 for GET);
otherwise it is REQueued with backoff. ``-n`` requests run at once;
``--sample`` forwards only that fraction (the rest are FINed unsent, as
nsq_to_http does). Every ``--status-every`` requests a line with the
99th/95th percentile and mean time goes to stderr. Ctrl-C/SIGTERM: stop
taking messages, let the running requests finish (FIN or REQ), exit.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus, urlsplit

import treq
from twisted.internet.defer import Deferred, DeferredSemaphore
from twisted.web.client import Agent, HTTPConnectionPool, ResponseNeverReceived
from twisted.web.http_headers import Headers

from nsqtw import __version__
from nsqtw._go.flags import ACTIVE, FlagSet, make_flag
from nsqtw.client import Consumer, Message
from nsqtw.tools.common import GoLog, client_config, connected_or_exit, parse_flags, require, run_tool
from nsqtw.tools.forward import Destinations, TimerMetrics

PROGRAM = "nsq_to_http"
USER_AGENT = f"nsq_to_http v{__version__} (nsqtw)"


@dataclass(frozen=True)
class ToHTTPOptions:
    channel: str = "nsq_to_http"
    consumer_opt: tuple[str, ...] = ()
    content_type: str = "application/octet-stream"
    get: tuple[str, ...] = ()
    header: tuple[str, ...] = ()
    http_client_connect_timeout: float = 2.0
    http_client_request_timeout: float = 20.0
    lookupd_http_address: tuple[str, ...] = ()
    max_in_flight: int = 200
    mode: str = "hostpool"
    n: int = 100
    nsqd_tcp_address: tuple[str, ...] = ()
    post: tuple[str, ...] = ()
    sample: float = 1.0
    status_every: int = 250
    topic: str = ""
    version: bool = False


_B = ToHTTPOptions()
FLAGS = FlagSet("nsqtw to-http", (
    make_flag("channel", "string", "Channel to read from.", ACTIVE, base=_B),
    make_flag("consumer-opt", "strings", "A go-nsq Config option for the consumer, as name,value (repeatable; see "
              "docs/client.md).", ACTIVE, base=_B),
    make_flag("content-type", "string", "Content-Type of the POST requests.", ACTIVE, base=_B),
    make_flag("get", "strings", "URL to GET; its %s becomes the query-escaped message (repeatable).", ACTIVE, base=_B),
    make_flag("header", "strings", "An extra request header, as Key:Value (repeatable).", ACTIVE, base=_B),
    make_flag("http-client-connect-timeout", "duration", "How long an HTTP connect may take.", ACTIVE, base=_B),
    make_flag("http-client-request-timeout", "duration", "How long an HTTP request may take.", ACTIVE, base=_B),
    make_flag("lookupd-http-address", "strings", "nsqlookupd HTTP address to discover nsqd nodes through (repeatable).",
              ACTIVE, base=_B),
    make_flag("max-in-flight", "int", "Most messages held at once, over all nsqd connections.", ACTIVE, base=_B),
    make_flag("mode", "string", "How to pick an endpoint: round-robin, hostpool, epsilon-greedy or multicast (every "
              "endpoint).", ACTIVE, base=_B),
    make_flag("n", "int", "Requests under way at once.", ACTIVE, base=_B),
    make_flag("nsqd-tcp-address", "strings", "nsqd TCP address to read from (repeatable).", ACTIVE, base=_B),
    make_flag("post", "strings", "URL to POST each message to, as the body (repeatable).", ACTIVE, base=_B),
    make_flag("sample", "float", "Share of messages to send, 0 to 1 (the others are FINed unsent).", ACTIVE, base=_B),
    make_flag("status-every", "int", "Log a timing line every this many requests (0: never).", ACTIVE, base=_B),
    make_flag("topic", "string", "Topic to read.", ACTIVE, base=_B),
    make_flag("version", "bool", "Print the version and exit.", ACTIVE, base=_B),
), lambda hostname: ToHTTPOptions(), lambda opts: None)


class RequestFailed(Exception):
    """The endpoint answered with a status that does not count as delivered."""


class Forwarder:
    """The handler: one request per message (or one per endpoint in multicast), at most ``-n`` at once."""

    def __init__(self, reactor: Any, opts: ToHTTPOptions, headers: dict[str, str], log: GoLog) -> None:
        self.reactor = reactor
        self.opts = opts
        self.method = "POST" if opts.post else "GET"
        self.addresses = list(opts.post or opts.get)
        self.multicast = opts.mode == "multicast"
        self.destinations = Destinations(self.addresses, opts.mode, reactor)
        self.headers = Headers({k: [v] for k, v in headers.items()})
        self.headers.setRawHeaders("User-Agent", [USER_AGENT])
        if self.method == "POST":
            self.headers.setRawHeaders("Content-Type", [opts.content_type])
        pool = HTTPConnectionPool(reactor, persistent=True)
        pool.maxPersistentPerHost = max(2, opts.n)
        connect = opts.http_client_connect_timeout
        self.http = treq.client.HTTPClient(Agent(reactor, connectTimeout=connect, pool=pool))
        #: for endpoints that answer HTTP/1.0 and close: Twisted would keep their connections for reuse
        self.http10 = treq.client.HTTPClient(Agent(reactor, connectTimeout=connect,
                                                   pool=HTTPConnectionPool(reactor, persistent=False)))
        self.closing_hosts: set[str] = set()
        self.pool = pool
        self.limit = DeferredSemaphore(max(1, opts.n))
        one = len(self.addresses) == 1
        self.per_address = {a: TimerMetrics(0 if one else opts.status_every, f"[{a}]:", log)
                            for a in self.addresses}
        self.aggregate = TimerMetrics(opts.status_every, "[aggregate]:", log)

    def __call__(self, msg: Message) -> Deferred[None] | None:
        if self.opts.sample < 1.0 and random.random() > self.opts.sample:
            return None  # not sampled: FINed without being sent, as nsq_to_http
        return self.limit.run(self._send, msg.body)

    async def _send(self, body: bytes) -> None:
        started = self.reactor.seconds()
        targets = self.addresses if self.multicast else [self.destinations.pick()]
        for address in targets:  # multicast: in order, stopping at the first failure (as Go's)
            t0 = self.reactor.seconds()
            try:
                await self._request(address, body)
            except Exception:
                self.destinations.mark(address, False)
                raise
            self.destinations.mark(address, True)
            self.per_address[address].status(t0 if self.multicast else started, self.reactor.seconds())
        self.aggregate.status(started, self.reactor.seconds())

    async def _request(self, address: str, body: bytes) -> None:
        if self.method == "POST":
            url, data = address, body
        else:
            url, data = address.replace("%s", quote_plus(body, safe=""), 1), None
        host = urlsplit(url).netloc
        for attempt in range(3):
            http = self.http10 if host in self.closing_hosts else self.http
            try:
                response = await http.request(self.method, url, data=data, headers=self.headers,
                                              timeout=self.opts.http_client_request_timeout)
                break
            except ResponseNeverReceived:
                # a kept connection the server had closed: the request never reached it, so send it again
                if attempt == 2:
                    raise
        await treq.content(response)
        if tuple(response.version[1:]) == (1, 0) and \
                b"keep-alive" not in b",".join(response.headers.getRawHeaders(b"connection", [])).lower():
            self.closing_hosts.add(host)
        ok = 200 <= response.code < 300 if self.method == "POST" else response.code == 200
        if not ok:
            raise RequestFailed(f"got status code {response.code}")


def parse_headers(values: Sequence[str]) -> dict[str, str]:
    headers = {}
    for value in values:
        key, sep, text = value.partition(":")
        require(bool(sep and key.strip()), "--header value format should be 'key=value'")
        headers[key.strip()] = text.strip()
    return headers


async def to_http(reactor: Any, opts: ToHTTPOptions) -> int:
    log = GoLog()
    require(bool(opts.topic and opts.channel), "--topic and --channel are required")
    if opts.content_type != _B.content_type:
        require(bool(opts.post), "--content-type only used with --post")
        require(bool(opts.content_type), "--content-type requires a value when used")
    require(bool(opts.nsqd_tcp_address or opts.lookupd_http_address),
            "--nsqd-tcp-address or --lookupd-http-address required")
    require(not (opts.nsqd_tcp_address and opts.lookupd_http_address),
            "use --nsqd-tcp-address or --lookupd-http-address not both")
    require(bool(opts.get or opts.post), "--get or --post required")
    require(not (opts.get and opts.post), "use --get or --post not both")
    for address in opts.get:
        require(address.count("%s") == 1, "invalid GET address - must be a printf string")
    require(0.0 <= opts.sample <= 1.0, "ERROR: --sample must be between 0.0 and 1.0")
    headers = parse_headers(opts.header)
    if opts.mode == "multicast":
        log.printf("WARNING: multicast mode is deprecated in favor of using separate nsq_to_http on different"
                   " channels (and will be dropped in a future release)")
    config = client_config(opts.consumer_opt, PROGRAM, max_in_flight=opts.max_in_flight)
    forwarder = Forwarder(reactor, opts, headers, log)
    consumer = Consumer(opts.topic, opts.channel, forwarder, config, reactor=reactor,
                        nsqd_tcp_addresses=opts.nsqd_tcp_address, lookupd_http_addresses=opts.lookupd_http_address,
                        drain_timeout=opts.http_client_request_timeout + 10)
    done: Deferred[None] = Deferred()

    def stop() -> Deferred[Any]:
        d = consumer.stop()  # waits for the requests under way: FIN or REQ each

        def finished(_: Any) -> Deferred[Any]:
            closed: Deferred[Any] = forwarder.pool.closeCachedConnections()
            if not done.called:
                done.callback(None)
            return closed
        return d.addCallback(finished)

    reactor.addSystemEventTrigger("before", "shutdown", stop)
    consumer.start()
    await connected_or_exit([consumer.first_attempts()])
    await done
    return 0


def main(argv: Sequence[str]) -> int:
    opts = parse_flags("nsqtw to-http", FLAGS, argv)
    if opts.version:
        print(f"nsq_to_http v{__version__} (nsqtw)")
        return 0
    return run_tool(lambda reactor: to_http(reactor, opts))


__all__ = ["Forwarder", "main", "parse_headers"]
