"""One client connection to nsqd: the V2 handshake, heartbeats, and frames handed to an owner.

The handshake follows every NSQ client: the magic, IDENTIFY with feature
negotiation, then — each confirmed by nsqd with ``OK`` — TLS, then snappy or
deflate, then AUTH when nsqd asks for it. After that the connection answers
heartbeats itself and passes every other frame to its
:class:`~nsqtw.interfaces.IConnectionDelegate`. Frames are split by
:class:`nsqtw.protocol.wire.FrameParser` and compression is
:mod:`nsqtw.protocol.compress`, the same code nsqd's side uses.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from twisted.application.internet import ClientService, backoffPolicy
from twisted.internet import ssl
from twisted.internet.defer import CancelledError, Deferred, maybeDeferred
from twisted.internet.interfaces import IDelayedCall, IProtocol, IProtocolFactory, IReactorTime, IStreamClientEndpoint
from twisted.internet.protocol import Factory, Protocol, connectionDone
from twisted.python.failure import Failure
from zope.interface import implementer

from nsqtw.client.config import Config
from nsqtw.client.errors import ConnectionClosed, NSQClientError, NSQErrorResponse
from nsqtw.interfaces import IConnectionDelegate, IStreamCodec
from nsqtw.log import Logger
from nsqtw.net.eager import direct_sender
from nsqtw.net.listen import client_endpoint, split_host_port
from nsqtw.net.tls import client_trust_root
from nsqtw.protocol.compress import CodecError, CompressingTransport, DeflateCodec, SnappyCodec
from nsqtw.protocol.wire import MAGIC_V2, NOP, FrameParser, FrameTooLarge, encode_command

__all__ = ["Dialer", "NSQClientFactory", "NSQClientProtocol", "client_tls_options", "connect"]

FRAME_RESPONSE = 0
FRAME_ERROR = 1
FRAME_MESSAGE = 2
HEARTBEAT = b"_heartbeat_"

(_IDENTIFY, _TLS, _COMPRESS, _AUTH, _READY) = range(5)


def client_tls_options(config: Config, host: str) -> Any:
    """The TLS client settings for ``tls_v1``: the CA file (else the system's), a client certificate."""
    cert = None
    if config.tls_cert:
        with open(config.tls_cert, "rb") as f, open(config.tls_key, "rb") as k:
            cert = ssl.PrivateCertificate.loadPEM(f.read() + b"\n" + k.read())
    if config.tls_insecure_skip_verify:
        kw: dict[str, Any] = {}
        if cert is not None:
            kw = {"privateKey": cert.privateKey.original, "certificate": cert.original}
        return ssl.CertificateOptions(verify=False, **kw)
    trust = client_trust_root(config.tls_root_ca_file) if config.tls_root_ca_file else ssl.platformTrust()
    return ssl.optionsForClientTLS(host, trustRoot=trust, clientCertificate=cert)


class NSQClientProtocol(Protocol):
    """The client side of one V2 connection.

    ``ready`` fires with the protocol itself once the handshake is done, or
    fails with the reason; ``settings`` keeps nsqd's IDENTIFY answer (empty
    for an nsqd without feature negotiation) and ``auth`` AUTH's.
    """

    log = Logger()

    def __init__(self, address: str, config: Config, delegate: IConnectionDelegate,
                 clock: IReactorTime) -> None:
        self.address = address
        self.config = config
        self.delegate = delegate
        self.clock = clock
        self.ready: Deferred[NSQClientProtocol] = Deferred()
        self.settings: dict[str, Any] = {}
        self.auth: dict[str, Any] = {}
        self.closed = False
        self._ready_fired = False
        self._state = _IDENTIFY
        self._parser = FrameParser()
        self._codec: IStreamCodec | None = None
        self._out: Any = None
        #: while frames of one read are handed out: what they made the owner write, sent as one write
        self._batch: list[bytes] | None = None
        #: on a plain TCP connection: sends a read's answers at once (see :func:`direct_sender`)
        self._send_now: Callable[[bytes], None] | None = None
        self._last_read = 0.0
        self._read_timer: IDelayedCall | None = None

    def __str__(self) -> str:
        return self.address

    @property
    def is_ready(self) -> bool:
        return self._state == _READY and not self.closed

    # -- connection ------------------------------------------------------

    def connectionMade(self) -> None:
        self._out = self.transport
        set_nodelay = getattr(self.transport, "setTcpNoDelay", None)
        if set_nodelay is not None:
            set_nodelay(True)
        self._last_read = self.clock.seconds()
        self._read_timer = self.clock.callLater(self.config.read_timeout, self._check_read)
        self.transport.write(MAGIC_V2 + encode_command(b"IDENTIFY", body=self.config.identify_body()))  # type: ignore[union-attr]

    def write(self, data: bytes) -> None:
        """Send bytes (compressed when negotiated); dropped once the connection is closed.

        What is written while the frames of one read are handed to the owner
        (the FINs of a batch of messages, the next PUB after an OK) goes out
        together when they all have been, as one write."""
        if self.closed:
            return
        if self._batch is not None:
            self._batch.append(data)
        else:
            self._out.write(data)

    def _flush(self) -> None:
        batch = self._batch
        self._batch = None
        if batch and not self.closed:
            data = batch[0] if len(batch) == 1 else b"".join(batch)
            if self._send_now is not None:
                # the reactor would send it on its next turn anyway (one send either way); sending it
                # now saves that turn, and the two epoll_ctl of starting and stopping to watch for
                # writability, on every round trip: the next PUB after an OK, the FINs of a read
                self._send_now(data)
            else:
                self._out.write(data)

    def close(self) -> None:
        """Close after what was written is sent."""
        if not self.closed:
            self._flush()
            self.closed = True
            self.transport.loseConnection()  # type: ignore[union-attr]

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abortConnection()  # type: ignore[attr-defined]

    def connectionLost(self, reason: Failure = connectionDone) -> None:
        self.closed = True
        if self._read_timer is not None and self._read_timer.active():
            self._read_timer.cancel()
        self._read_timer = None
        error = ConnectionClosed(f"({self.address}) connection closed: {reason.getErrorMessage()}")
        if not self._ready_fired:
            self._ready_fired = True
            self.ready.errback(error)
        elif self._state == _READY:  # a handshake that failed was reported through ``ready``
            self.delegate.on_close(self, error)

    def _check_read(self) -> None:
        idle = self.clock.seconds() - self._last_read
        if idle >= self.config.read_timeout:
            self._read_timer = None
            self.log.error("({address}) IO error - read timeout: nothing received for {idle:.1f}s",
                           address=self.address, idle=idle)
            self.abort()
            return
        self._read_timer = self.clock.callLater(self.config.read_timeout - idle, self._check_read)

    # -- input -----------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        self._last_read = self.clock.seconds()
        try:
            if self._codec is None:
                self._parser.feed(data)
            else:
                self._codec.feed(data)
            self._pump()
        except (FrameTooLarge, CodecError, ValueError) as e:
            self._fail(NSQClientError(f"({self.address}) {e}"))

    def _pump(self) -> None:
        parser = self._parser
        while not self.closed:
            if self._state != _READY:
                got = parser.next_frame()
                if got is not None:
                    self._handshake(*got)
                    continue
            else:
                self._batch = []
                try:
                    self._dispatch(parser)
                finally:
                    self._flush()
                if self.closed:
                    return
            if self._codec is None:
                return
            chunk = self._codec.read()
            if not chunk:
                return
            parser.feed(chunk)

    def _dispatch(self, parser: FrameParser) -> None:
        """Hand every complete frame to the delegate (the connection is ready)."""
        delegate = self.delegate
        for ftype, data in parser.frames():
            if self.closed:
                return
            if ftype == FRAME_MESSAGE:
                delegate.on_message(self, data)
            elif ftype == FRAME_RESPONSE:
                if data == HEARTBEAT:
                    self.write(NOP)
                else:
                    delegate.on_response(self, data)
            else:
                delegate.on_error(self, data)

    # -- handshake -------------------------------------------------------

    def _fail(self, error: Exception) -> None:
        if not self._ready_fired:
            self._ready_fired = True
            self.ready.errback(error)
        else:
            self.log.error("({address}) {error}", address=self.address, error=error)
        self.abort()

    def _handshake(self, ftype: int, data: bytes) -> None:
        if ftype == FRAME_RESPONSE and data == HEARTBEAT:
            self.write(NOP)
            return
        if ftype == FRAME_ERROR:
            self._fail(NSQErrorResponse(data))
            return
        if ftype != FRAME_RESPONSE:
            self._fail(NSQClientError(f"({self.address}) frame type {ftype} during the handshake"))
            return
        state = self._state
        if state == _IDENTIFY:
            if data != b"OK":
                try:
                    self.settings = json.loads(data)
                except ValueError:
                    self._fail(NSQClientError(f"({self.address}) bad IDENTIFY answer {data!r}"))
                    return
            if self.config.tls_v1 and not self.settings.get("tls_v1"):
                self._fail(NSQClientError(f"({self.address}) TLS requested but nsqd did not enable it"))
                return
            if self.settings.get("tls_v1"):
                self._state = _TLS
                self._parser.take_buffered()  # nsqd sends nothing more before the TLS handshake
                host, _ = split_host_port(self.address)
                self.transport.startTLS(client_tls_options(self.config, host or "127.0.0.1"))  # type: ignore[union-attr]
                return
            self._after_tls()
        elif data != b"OK" and state in (_TLS, _COMPRESS):
            self._fail(NSQClientError(f"({self.address}) expected OK, got {data!r}"))
        elif state == _TLS:
            self._after_tls()
        elif state == _COMPRESS:
            self._after_compression()
        else:  # _AUTH
            try:
                self.auth = json.loads(data)
            except ValueError:
                self.auth = {}
            self.log.info("({address}) Auth accepted. Identity {identity!r} {url} Permissions: {count}",
                          address=self.address, identity=self.auth.get("identity", ""),
                          url=self.auth.get("identity_url", ""), count=self.auth.get("permission_count", 0))
            self._become_ready()

    def _after_tls(self) -> None:
        codec: IStreamCodec | None = None
        if self.settings.get("snappy"):
            codec = SnappyCodec()
        elif self.settings.get("deflate"):
            codec = DeflateCodec(int(self.settings.get("deflate_level") or self.config.deflate_level))
        if codec is None:
            self._after_compression()
            return
        self._state = _COMPRESS
        codec.feed(self._parser.take_buffered())  # the rest of the stream is compressed
        self._codec = codec
        self._out = CompressingTransport(self.transport, codec)

    def _after_compression(self) -> None:
        if self.settings.get("auth_required"):
            if not self.config.auth_secret:
                self._fail(NSQClientError(f"({self.address}) nsqd requires AUTH; set auth_secret"))
                return
            self._state = _AUTH
            self.write(encode_command(b"AUTH", body=self.config.auth_secret.encode()))
            return
        self._become_ready()

    def _become_ready(self) -> None:
        self._state = _READY
        if self._codec is None and not self.settings.get("tls_v1"):
            self._send_now = direct_sender(self.transport)
        self._ready_fired = True
        self.ready.callback(self)


class NSQClientFactory(Factory):
    """Builds :class:`NSQClientProtocol` for one address (for endpoints and ClientService)."""

    noisy = False

    def __init__(self, address: str, config: Config, delegate: IConnectionDelegate,
                 clock: IReactorTime) -> None:
        self.address = address
        self.config = config
        self.delegate = delegate
        self.clock = clock

    def buildProtocol(self, addr: Any) -> NSQClientProtocol:
        proto = NSQClientProtocol(self.address, self.config, self.delegate, self.clock)
        proto.factory = self
        return proto


@implementer(IStreamClientEndpoint)
class _Watched:
    """An endpoint whose failed connects are reported (to the :class:`Dialer`) and passed on."""

    def __init__(self, endpoint: IStreamClientEndpoint, on_failed: Callable[[Failure], None]) -> None:
        self.endpoint = endpoint
        self.on_failed = on_failed

    def connect(self, factory: IProtocolFactory) -> Deferred[IProtocol]:
        def failed(f: Failure) -> Failure:
            self.on_failed(f)
            return f

        return self.endpoint.connect(factory).addErrback(failed)


class Dialer(NSQClientFactory):
    """Keeps one connection to ``address`` up: reconnects after 1 s, 2 s, 4 s ... at most
    ``lookupd_poll_interval``, the delay growing while attempts fail, the handshake included.

    ``on_ready(proto)`` runs once a connection's handshake is done (its
    Deferred, if any, failing aborts the connection); ``on_failed(failure)``
    hears of each attempt that failed before that, at the TCP connect or in
    the handshake (a server that breaks the protocol). The handshake runs on
    the connection Twisted's ``ClientService`` sees as made: a handshake that
    fails then is a connection lost, which the service retries (given a
    ``prepareConnection`` instead, a connection lost while preparing reaches
    the service in a state that cannot take it, and raises).
    """

    def __init__(self, reactor: Any, address: str, config: Config, delegate: IConnectionDelegate,
                 on_ready: Callable[[NSQClientProtocol], Any], on_failed: Callable[[Failure], None]) -> None:
        super().__init__(address, config, delegate, reactor)
        self.on_ready = on_ready
        self.on_failed = on_failed
        #: attempts failed in a row, the handshake included (ClientService counts TCP connects only)
        self.failures = 0
        self._first: Failure | None | bool = False  # False: the first attempt is still under way
        self._first_waiters: list[Deferred[None]] = []
        grow = backoffPolicy(initialDelay=1.0, factor=2.0, maxDelay=config.lookupd_poll_interval)
        endpoint = _Watched(client_endpoint(reactor, address, config.dial_timeout), self._failed)
        self.service = ClientService(endpoint, self, retryPolicy=lambda attempt: grow(max(attempt, self.failures)),
                                     clock=reactor)

    def buildProtocol(self, addr: Any) -> NSQClientProtocol:
        proto = super().buildProtocol(addr)
        proto.ready.addCallbacks(self._ready, self._failed)
        return proto

    def _ready(self, proto: NSQClientProtocol) -> None:
        self.failures = 0
        self._settle(None)
        # the owner reports its own refusals (a SUB nsqd refused); the connection just ends
        maybeDeferred(self.on_ready, proto).addErrback(lambda _: proto.abort())

    def _failed(self, failure: Failure) -> None:
        if failure.check(CancelledError):  # the dialer was stopped
            return
        self.failures += 1
        self.on_failed(failure)
        self._settle(failure)

    def _settle(self, outcome: Failure | None) -> None:
        if self._first is False:
            self._first = outcome
            waiters, self._first_waiters = self._first_waiters, []
            for w in waiters:
                self._fire(w)

    def _fire(self, d: Deferred[None]) -> None:
        if isinstance(self._first, Failure):
            d.errback(self._first)
        else:
            d.callback(None)

    def first_attempt(self) -> Deferred[None]:
        """Fires when the first attempt is over: None once ready, else its failure (go-nsq's
        ``ConnectToNSQD`` result; the dialer keeps retrying either way)."""
        d: Deferred[None] = Deferred()
        if self._first is False:
            self._first_waiters.append(d)
        else:
            self._fire(d)
        return d

    @property
    def running(self) -> bool:
        return bool(self.service.running)

    def start(self) -> None:
        self.service.startService()

    def stop(self) -> Deferred[None]:
        return self.service.stopService()


def connect(reactor: Any, address: str, config: Config,
            delegate: IConnectionDelegate) -> Deferred[NSQClientProtocol]:
    """Connect once and complete the handshake; fires with the ready connection."""
    endpoint = client_endpoint(reactor, address, config.dial_timeout)
    d: Deferred[Any] = endpoint.connect(NSQClientFactory(address, config, delegate, reactor))

    d.addCallback(lambda proto: proto.ready)
    return d
