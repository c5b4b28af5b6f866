"""The V2 handshake: IDENTIFY's negotiation, the switch to TLS and compression, AUTH."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime, ITransport
from twisted.python.failure import Failure

from nsqtw.core.commands import ClientState
from nsqtw.core.message import FRAME_TYPE_RESPONSE, frame
from nsqtw.errors import NSQError, fatal
from nsqtw.interfaces import IStreamCodec
from nsqtw.log import Logger
from nsqtw.net.tls import connection_info, looks_like_tls, peer_common_name
from nsqtw.protocol.auth import AuthState
from nsqtw.protocol.authz import ClientAuth
from nsqtw.protocol.compress import CompressingTransport, DeflateCodec, SnappyCodec
from nsqtw.protocol.identify import apply_settings, decode_identify, negotiate
from nsqtw.protocol.node import Node
from nsqtw.protocol.wire import V2Parser

#: nsqd's deadline for a TLS handshake after IDENTIFY
TLS_HANDSHAKE_TIMEOUT = 5.0

_OK = frame(FRAME_TYPE_RESPONSE, b"OK")


def _text(value: bytes) -> str:
    return value.decode("utf-8", "surrogateescape")


class Handshake:
    """IDENTIFY, TLS, snappy/deflate and AUTH for :class:`~nsqtw.protocol.v2.V2Protocol`
    (a mixin: it reads and sets the connection's fields)."""

    log: Logger
    nsqd: Node
    clock: IReactorTime
    transport: ITransport | None
    parser: V2Parser
    auth: ClientAuth
    state: ClientState
    identifier: str
    hostname: str
    user_agent: str
    remote_address: str
    tls: bool
    snappy: bool
    deflate: bool
    # the settings IDENTIFY may change (nsqtw.protocol.identify.Settings)
    heartbeat_interval: float
    output_buffer_size: int
    output_buffer_timeout: float
    sample_rate: int
    msg_timeout: float
    #: nsqd's --tls-required and TLS not on yet: every command but IDENTIFY is refused
    _need_tls: bool
    _tls_info: dict[str, Any]
    #: tls_v1 agreed, TLS not begun: (snappy, deflate, level, bytes the client sent so far)
    _tls_pending: tuple[bool, bool, int, bytes] | None
    #: reads through the negotiated compression, when there is one
    _decoder: IStreamCodec | None
    _handshake_call: IDelayedCall | None
    #: sends what the transport holds back (see V2Protocol)
    _uncork: Callable[[], None]

    if TYPE_CHECKING:
        def _write(self, data: bytes) -> None: ...

        def _send_error(self, e: NSQError) -> None: ...

        def _close(self, abort: bool = False) -> None: ...

        def _block_until(self, d: Deferred[Any], then: Callable[[Any], None]) -> None: ...

        def _restart_heartbeat(self) -> None: ...

        def _reset_read_deadline(self) -> None: ...

    def _identify(self, body: bytes) -> None:
        o = self.nsqd.options
        try:
            data = decode_identify(body)
        except ValueError:
            raise fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body") from None
        self.log.info("[{client}] IDENTIFY: {data}", client=self, data=data)
        self.identifier = data.get("client_id") or ""
        self.hostname = data.get("hostname") or ""
        self.user_agent = data.get("user_agent") or ""
        apply_settings(self, data, o)
        self._restart_heartbeat()
        self._reset_read_deadline()
        if not data.get("feature_negotiation"):
            self._write(_OK)
            return
        agreed = negotiate(data, o, self, tls_available=self.nsqd.tls is not None, upgraded_tls=self.tls,
                           compressed=self._decoder is not None, auth_required=self.auth.required)
        self._write(frame(FRAME_TYPE_RESPONSE, agreed.answer))
        if agreed.tls_v1 or agreed.snappy or agreed.deflate:
            self._upgrade(agreed.tls_v1, agreed.snappy, agreed.deflate, agreed.deflate_level)

    def _upgrade(self, tls_v1: bool, snappy: bool, deflate: bool, deflate_level: int) -> None:
        """Switch the connection to TLS, then to compression, each confirmed by an OK.

        The IDENTIFY answer went out as it was; from here on the client
        speaks the new encoding, so whatever it already sent after IDENTIFY
        is handed to the new layer instead of the parser. TLS starts only
        once the client's first byte shows a TLS record: a client that goes
        on in plain text, or says nothing for nsqd's handshake deadline, gets
        nsqd's ``E_IDENTIFY_FAILED`` in plain text (what Go nsqd sends) rather
        than a silent hang-up.
        """
        early = self.parser.take_buffered()
        self._uncork()  # the IDENTIFY answer goes out as it is, before the new encoding
        if tls_v1:
            self.log.info("PROTOCOL(V2): [{client}] upgrading connection to TLS", client=self)
            self._tls_pending = (snappy, deflate, deflate_level, early)
            self._need_tls = False
            self._handshake_call = self.clock.callLater(TLS_HANDSHAKE_TIMEOUT, self._handshake_timeout)
            if early:
                self._tls_first_bytes(b"")
            return
        self._compress(snappy, deflate, deflate_level, early)

    def _tls_first_bytes(self, data: bytes) -> None:
        """The client's first bytes after a tls_v1 IDENTIFY: start TLS, or refuse plain text."""
        assert self._tls_pending is not None
        snappy, deflate, deflate_level, early = self._tls_pending
        early += data
        if not early:
            return
        self._tls_pending = None
        if not looks_like_tls(early):
            self._identify_failed("tls: first record does not look like a TLS handshake")
            return
        self._uncork()
        self.transport.startTLS(self.nsqd.tls)  # type: ignore[union-attr]
        self.tls = True
        self._write(_OK)
        self._compress(snappy, deflate, deflate_level, b"")
        self.transport.protocol.dataReceived(early)  # type: ignore[union-attr]

    def _compress(self, snappy: bool, deflate: bool, deflate_level: int, early: bytes) -> None:
        codec: IStreamCodec | None = None
        if snappy:
            self.log.info("PROTOCOL(V2): [{client}] upgrading connection to snappy", client=self)
            codec = SnappyCodec()
            self.snappy = True
        elif deflate:
            self.log.info("PROTOCOL(V2): [{client}] upgrading connection to deflate (level {deflate_level})",
                          client=self, deflate_level=deflate_level)
            codec = DeflateCodec(deflate_level)
            self.deflate = True
        if codec is not None:
            self._uncork()  # IDENTIFY's answer (or TLS's OK) goes out uncompressed
            self.transport = CompressingTransport(self.transport, codec)
            self._decoder = codec
            self._write(_OK)
            if early:
                codec.feed(early)

    def _identify_failed(self, reason: str) -> None:
        """nsqd's answer to a failed TLS upgrade, sent before TLS began: plain text, then close."""
        self._send_error(fatal("E_IDENTIFY_FAILED", f"IDENTIFY failed {reason}"))

    def handshakeCompleted(self) -> None:
        """The TLS handshake after IDENTIFY finished: note what was agreed, for /stats and AUTH."""
        if self._handshake_call is not None and self._handshake_call.active():
            self._handshake_call.cancel()
        self._handshake_call = None
        conn = self.transport.getHandle()  # type: ignore[union-attr]
        self._tls_info = connection_info(conn)
        self._tls_info["common_name"] = peer_common_name(conn)

    def _handshake_timeout(self) -> None:
        self._handshake_call = None
        if self._tls_pending is not None:
            # not a byte since IDENTIFY: nsqd's read of the handshake timed out
            self._tls_pending = None
            host = self.transport.getHost()  # type: ignore[union-attr]
            local = f"{getattr(host, 'host', '')}:{getattr(host, 'port', '')}"
            self._identify_failed(f"read tcp {local}->{self.remote_address}: i/o timeout")
            return
        self.log.error("[{client}] - E_IDENTIFY_FAILED IDENTIFY failed TLS handshake timeout",
                       client=self)
        self._close(abort=True)

    def _auth(self, body: bytes) -> None:
        self.auth.begin(_text(body))
        self._block_until(self._query_auth(), self._authed)

    def _query_auth(self) -> Deferred[AuthState]:
        peer = self.transport.getPeer()  # type: ignore[union-attr]
        return self.auth.query(getattr(peer, "host", ""), self.tls, self._tls_info.get("common_name", ""))

    def _authed(self, result: AuthState | Failure) -> None:
        if isinstance(result, Failure):
            raise self.auth.failed(result, self)
        self._write(frame(FRAME_TYPE_RESPONSE, self.auth.accepted(result, self)))

    def _authorize(self, cmd: str, topic: str, channel: str,
                   retry: Callable[[], None] | None) -> bool:
        """Whether the command may go on now (see :meth:`ClientAuth.check`).

        When the authorization has expired it is asked for again: with
        ``retry`` the connection waits for the answer and then runs the
        command again (False is returned meanwhile); without, the check is
        left to a later call.
        """
        if self.auth.check(cmd, topic, channel):
            return True
        if retry is not None:
            self._block_until(self._query_auth(), lambda result: self._reauthed(result, retry))
        return False

    def _reauthed(self, result: AuthState | Failure, retry: Callable[[], None]) -> None:
        if isinstance(result, Failure):
            raise self.auth.failed(result, self)
        self.auth.state = result
        retry()
