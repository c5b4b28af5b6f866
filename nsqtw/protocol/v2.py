"""The V2 TCP protocol: a thin Protocol over the parser and the NSQD domain.

The protocol turns parsed commands into calls on topics and channels and
their results into frames; decisions about queues, flight and timeouts live
in :mod:`nsqtw.core.channel`. One protocol instance is one nsqd client.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall, IHandshakeListener, IPushProducer, IReactorTime
from twisted.internet.protocol import Protocol, ServerFactory
from twisted.python.failure import Failure
from zope.interface import implementer

from nsqtw._go.json import go_dumps
from nsqtw._go.strconv import parse_int
from nsqtw.core.channel import Channel
from nsqtw.core.message import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, MSG_ID_LENGTH, Message, frame, frames
from nsqtw.core.nsqd import NSQD
from nsqtw.errors import BackendError, ExitingError, NotInFlightError, NSQError, fatal, nonfatal
from nsqtw.interfaces import IConsumer, IStreamCodec
from nsqtw.log import Logger
from nsqtw.names import go_quote, is_valid_channel_name, is_valid_topic_name
from nsqtw.net.tls import connection_info, looks_like_tls, peer_common_name
from nsqtw.protocol.auth import AuthState
from nsqtw.protocol.authz import ClientAuth
from nsqtw.protocol.compress import CodecError, CompressingTransport, DeflateCodec, SnappyCodec
from nsqtw.protocol.identify import DEFAULT_OUTPUT_BUFFER_SIZE, apply_settings, decode_identify, negotiate
from nsqtw.protocol.wire import BODY_COMMANDS, Command, LineTooLong, V2Parser

STATE_INIT = 0
STATE_DISCONNECTED = 1
STATE_CONNECTED = 2
STATE_SUBSCRIBED = 3
STATE_CLOSING = 4

#: nsqd's deadline for a TLS handshake after IDENTIFY
TLS_HANDSHAKE_TIMEOUT = 5.0
#: the reactor time one client's input may take before others are served (see _process)
SLICE_SECONDS = 0.002
#: the most REQs one connection's slice takes (each is a message redelivered next turn)
REQS_PER_SLICE = 128
#: how many topic names one connection remembers as checked (see V2Protocol._topic_name)
KNOWN_TOPICS = 64

_OK = frame(FRAME_TYPE_RESPONSE, b"OK")
_HEARTBEAT = frame(FRAME_TYPE_RESPONSE, b"_heartbeat_")
_CLOSE_WAIT = frame(FRAME_TYPE_RESPONSE, b"CLOSE_WAIT")

def _parse_base10(value: bytes) -> int:
    """nsqd's ByteToBase10: digits only (no sign, no spaces); the caller checks the range.

    An empty argument is 0, not an error: ``RDY `` and ``RDY  5`` (the count
    is the empty word between two spaces) set RDY 0 in nsqd.
    """
    if not value:
        return 0
    return parse_int(value, 10, signed=False, bounded=False)


def _text(value: bytes) -> str:
    return value.decode("utf-8", "surrogateescape")


@implementer(IConsumer, IPushProducer, IHandshakeListener)
class V2Protocol(Protocol):
    """One client connection speaking nsqd's V2 protocol."""

    log = Logger()
    #: how long one client's commands may run before the others get the reactor
    slice_seconds = SLICE_SECONDS
    #: the clock slices are measured with (CPU work, not the reactor's time)
    _now = staticmethod(time.perf_counter)

    # Per-connection state that starts the same for every client is a class attribute
    # until first assigned: a connection that only connects and closes never writes it,
    # and ~30 attribute stores were most of the cost of making a protocol object.
    state = STATE_INIT
    channel: Channel | None = None
    # IDENTIFY-able settings, nsqd's defaults (the option-derived ones are set in __init__)
    output_buffer_size = DEFAULT_OUTPUT_BUFFER_SIZE
    sample_rate = 0
    identifier = ""
    hostname = ""
    user_agent = ""
    remote_address = ""
    # counters for /stats
    ready_count = 0
    in_flight_count = 0
    message_count = 0
    finish_count = 0
    requeue_count = 0
    tls = False
    snappy = False
    deflate = False
    #: :meth:`stats_json`'s cache: what its template was made from, and the template
    _stats_key: tuple[Any, ...] | None = None
    _stats_template = ""
    _handshake_call: IDelayedCall | None = None
    #: tls_v1 agreed, TLS not begun: (snappy, deflate, level, bytes the client sent so far)
    _tls_pending: tuple[bool, bool, int, bytes] | None = None
    #: reads through the negotiated compression, when there is one
    _decoder: IStreamCodec | None = None
    _paused_writing = False
    #: read and dispatch nothing meanwhile: a publish waits for its disk write or the
    #: auth server (``_waiting``), or this client's slice of the reactor is used up
    #: (``_sliced``: it goes on next turn)
    _blocked = False
    _waiting = False
    _sliced = False
    #: frames waiting to be sent at the end of the current run of commands
    _corked: list[bytes] | None = None
    _closed = False
    _heartbeat_call: IDelayedCall | None = None
    _read_deadline: IDelayedCall | None = None
    _command_at = 0.0
    #: topic arguments of publishes already found valid, and the names they stand for
    _known_topics: dict[bytes, str] | None = None

    def __init__(self, nsqd: NSQD, clock: IReactorTime) -> None:
        o = nsqd.options
        self.nsqd = nsqd
        self.clock = clock
        self.client_id = nsqd.new_client_id()
        self.parser = V2Parser(o.max_msg_size, o.max_body_size, self._check_header)
        self.heartbeat_interval = o.client_timeout / 2
        self.msg_timeout = o.msg_timeout
        self.output_buffer_timeout = o.output_buffer_timeout
        self.connect_ts = int(clock.seconds())
        self.pub_counts: dict[str, int] = {}
        #: nsqd's --tls-required: every command but IDENTIFY needs TLS first
        self._need_tls = bool(o.tls_required)
        self._tls_info: dict[str, Any] = {}
        #: AUTH: the secret and the auth server's answer (off when nsqd has no --auth-http-address)
        self.auth = ClientAuth(nsqd.auth, clock)

    def __str__(self) -> str:
        return self.remote_address or f"client {self.client_id}"

    # -- connection lifecycle ---------------------------------------------

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()  # type: ignore[union-attr]
        host = getattr(peer, "host", "") or str(peer)
        port = getattr(peer, "port", None)
        self.remote_address = f"{host}:{port}" if port is not None else host
        self.identifier = self.hostname = host
        self.log.info("TCP: new client({client})", client=self.remote_address)
        self.nsqd.add_client(self.client_id, self)
        self.transport.registerProducer(self, True)  # type: ignore[union-attr]
        self._restart_heartbeat()
        self._reset_read_deadline()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self._closed = True
        self._cancel_timers()
        if self.tls and not self._tls_info and reason is not None:
            self.log.error("[{client}] - E_IDENTIFY_FAILED IDENTIFY failed {error}", client=self,
                           error=reason.getErrorMessage())
        self.log.info("PROTOCOL(V2): [{client}] exiting ioloop", client=self)
        if self.channel is not None:
            # requeuing what it held wakes the channel's pump; nothing else changed for the others
            self.channel.remove_client(self)
        self.nsqd.remove_client(self.client_id)
        # the one reference cycle of a connection (see V2Parser.release): broken here, the
        # protocol, its transport and the rest are freed as soon as the reactor lets go
        self.parser.release()

    def _cancel_timers(self) -> None:
        for call in (self._heartbeat_call, self._read_deadline, self._handshake_call):
            if call is not None and call.active():
                call.cancel()
        self._heartbeat_call = self._read_deadline = self._handshake_call = None

    def _restart_heartbeat(self) -> None:
        if self._heartbeat_call is not None and self._heartbeat_call.active():
            self._heartbeat_call.cancel()
        self._heartbeat_call = None
        if self.heartbeat_interval > 0 and not self._closed:
            self._heartbeat_call = self.clock.callLater(self.heartbeat_interval, self._send_heartbeat)

    def _send_heartbeat(self) -> None:
        self._heartbeat_call = None
        if self._closed:
            return
        self.transport.write(_HEARTBEAT)  # type: ignore[union-attr]
        self._arm_read_deadline()
        self._restart_heartbeat()

    def _reset_read_deadline(self) -> None:
        """Start the read deadline afresh (new connection, new heartbeat interval)."""
        if self._read_deadline is not None and self._read_deadline.active():
            self._read_deadline.cancel()
        self._read_deadline = None
        self._restart_read_deadline()

    def _restart_read_deadline(self) -> None:
        """nsqd allows two heartbeat intervals for each command to arrive whole.

        This runs for every command, so it only notes the time: the one timer
        re-arms itself from that note when it fires, instead of a DelayedCall
        being cancelled and made per command.
        """
        self._command_at = self.clock.seconds()

    def _arm_read_deadline(self) -> None:
        """Make the read-deadline timer, when the first heartbeat goes out.

        The deadline is two heartbeat intervals after the last command; the
        heartbeat timer, started at the same moment (connect, IDENTIFY), fires
        one interval in, so making the deadline's timer then is soon enough,
        and fires at the same instant. Most connections that only connect,
        maybe SUB, and leave never make it (a DelayedCall made and cancelled
        was 4 µs of such a connection's cost). It is made before the next
        heartbeat's timer, as before, so a deadline falling on a heartbeat
        still fires first.
        """
        if self._read_deadline is None and self.heartbeat_interval > 0 and not self._closed:
            left = self._command_at + 2 * self.heartbeat_interval - self.clock.seconds()
            self._read_deadline = self.clock.callLater(max(left, 0), self._read_timeout)

    def _read_timeout(self) -> None:
        self._read_deadline = None
        left = self._command_at + 2 * self.heartbeat_interval - self.clock.seconds()
        if left > 0:
            self._read_deadline = self.clock.callLater(left, self._read_timeout)
            return
        self.log.error("ERROR: client({client}) - failed to read command - i/o timeout", client=self)
        self._close()

    def close(self) -> None:
        """Hang up (graceful stop, channel deleted)."""
        self._close()

    def _close(self) -> None:
        if not self._closed:
            self._uncork()
            self._closed = True
            self._cancel_timers()
            self.transport.loseConnection()  # type: ignore[union-attr]

    # -- reading ----------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if self._closed:
            return
        if self._tls_pending is not None:
            self._tls_first_bytes(data)
            return
        if self._decoder is None:
            self.parser.feed(data)
        else:
            self._decoder.feed(data)
        self._process()

    def _process(self) -> None:
        """Run the buffered commands: for at most one slice of reactor time, then yield.

        Every client shares the one reactor thread, so one client's input
        (a pipelined flood, a decompression bomb, a storm of creates) is
        worked through :attr:`slice_seconds` at a time: past that the
        transport stops reading and the rest waits for the next reactor
        turn, after every other connection has had its turn. Order and
        content are unchanged; TCP flow control slows the flooder down.
        """
        if self._corked is not None:  # run from within a command (a publish's write was done)
            self._run_commands()
            return
        # the answers and messages of all commands run now go out in one write
        self._corked = []
        try:
            self._run_commands()
        finally:
            corked, self._corked = self._corked, None
            if corked and not self._closed:
                self.transport.write(b"".join(corked))  # type: ignore[union-attr]

    def _run_commands(self) -> None:
        parser = self.parser
        now = self._now
        deadline = now() + self.slice_seconds
        steps = 0
        requeued = 0
        while not self._closed and not self._blocked:
            steps += 1
            if steps & 7 == 0 and now() > deadline:
                self._yield_slice()
                return
            try:
                cmd = parser.next_command(REQS_PER_SLICE - requeued)
            except NSQError as e:
                self._send_error(e)
                return
            except LineTooLong:
                self.log.error("ERROR: client({client}) - failed to read command - line too long",
                               client=self)
                self._close()
                return
            if cmd is None:
                if self._decoder is None or not self._decompress_more():
                    return
                continue
            self._restart_read_deadline()
            try:
                self._dispatch(cmd)
            except NSQError as e:
                self._send_error(e)
            if not parser.buffered() and self._decoder is None:
                return  # the usual case: the read held this one command
            if cmd.reqs is not None:
                requeued += len(cmd.reqs)
                if requeued >= REQS_PER_SLICE:
                    # each comes back through the channel's pump on the next turn: as many
                    # as that may take before the others get the reactor
                    self._yield_slice()
                    return
                steps |= 7  # a run is worth eight commands: look at the clock next

    def _yield_slice(self) -> None:
        """Stop reading until the next reactor turn; then carry on where this slice stopped."""
        self._blocked = self._sliced = True
        self.transport.pauseProducing()  # type: ignore[union-attr]
        self.clock.callLater(0, self._next_slice)

    def _next_slice(self) -> None:
        self._sliced = False
        if self._closed or self._waiting:
            return
        self._blocked = False
        self.transport.resumeProducing()  # type: ignore[union-attr]
        self._process()

    def _decompress_more(self) -> bool:
        """Give the parser the next piece of decompressed input; False when there is none."""
        assert self._decoder is not None
        try:
            data = self._decoder.read()
        except CodecError as e:
            self.log.error("ERROR: client({client}) - failed to read command - {error}",
                           client=self, error=str(e))
            self._close()
            return False
        if not data:
            return False
        self.parser.feed(data)
        return True

    def _send_error(self, e: NSQError) -> None:
        self.log.error("[{client}] - {error}", client=self, error=str(e))
        self._write(frame(FRAME_TYPE_ERROR, e.frame_body()))
        if e.fatal:
            self._close()

    def _write(self, data: bytes) -> None:
        """Send a frame; while commands are being run, frames wait to go out together."""
        if self._corked is not None:
            self._corked.append(data)
        else:
            self.transport.write(data)  # type: ignore[union-attr]

    def _uncork(self) -> None:
        """Send the frames gathered so far (before a close, or a change of encoding)."""
        corked = self._corked
        if corked:
            self._corked = []
            self.transport.write(b"".join(corked))  # type: ignore[union-attr]

    def _check_header(self, name: bytes, args: list[bytes]) -> None:
        """What nsqd checks of every command before it reads anything after its line.

        The parser calls this for each command (once for a run of FINs or
        REQs): TLS first, the one place it is checked, then a body
        command's state, parameters and topic.
        """
        if self._need_tls and name != b"IDENTIFY":
            raise fatal("E_INVALID", f"cannot {_text(name)} in current state (TLS required)")
        if name == b"PUB":
            self._topic_arg(b"PUB", args, 1)
        elif name == b"MPUB":
            # nsqd's MPUB repeats the code inside its description
            if len(args) < 1:
                raise fatal("E_INVALID", "MPUB insufficient number of parameters")
            topic = self._topic_name(b"E_BAD_TOPIC MPUB", args[0])
            if self.auth.required:
                # nsqd checks MPUB's authorization before reading its body
                self._authorize("MPUB", topic, "", None)
        elif name not in BODY_COMMANDS:
            return
        elif name == b"IDENTIFY":
            if self.state != STATE_INIT:
                raise fatal("E_INVALID", "cannot IDENTIFY in current state")
        elif name == b"AUTH":
            if self.state != STATE_INIT:
                raise fatal("E_INVALID", "cannot AUTH in current state")
            if len(args) != 0:
                raise fatal("E_INVALID", "AUTH invalid number of parameters")
        else:  # DPUB
            self._topic_arg(b"DPUB", args, 2)
            self._dpub_timeout(args[1])

    def _topic_arg(self, cmd: bytes, args: list[bytes], count: int) -> str:
        if len(args) < count:
            raise fatal("E_INVALID", f"{cmd.decode()} insufficient number of parameters")
        return self._topic_name(cmd, args[0])

    def _topic_name(self, cmd: bytes, raw: bytes) -> str:
        """A publish's topic argument as a valid name, or nsqd's E_BAD_TOPIC.

        A publisher names the same few topics command after command: the
        names this connection already checked are remembered (at most
        :data:`KNOWN_TOPICS` of them), so their check is one lookup.
        """
        known = self._known_topics
        topic = known.get(raw) if known is not None else None
        if topic is None:
            topic = _text(raw)
            if not is_valid_topic_name(topic):
                raise fatal("E_BAD_TOPIC", f"{cmd.decode()} topic name {go_quote(raw)} is not valid")
            if known is None:
                known = self._known_topics = {}
            if len(known) < KNOWN_TOPICS:
                known[raw] = topic
        return topic

    def _dpub_timeout(self, raw: bytes) -> float:
        try:
            ms = _parse_base10(raw)
        except ValueError:
            raise fatal("E_INVALID", f"DPUB could not parse timeout {_text(raw)}") from None
        max_ms = int(self.nsqd.options.max_req_timeout * 1000)
        if ms > max_ms:
            raise fatal("E_INVALID", f"DPUB timeout {ms} out of range 0-{max_ms}")
        return ms / 1000.0

    # -- dispatch ---------------------------------------------------------

    def _dispatch(self, cmd: Command) -> None:
        name = cmd.name
        if name == b"PUB":
            self._publish(b"PUB", self._topic_name(name, cmd.args[0]), [cmd.body or b""])
        elif name == b"MPUB":
            self._publish(b"MPUB", self._topic_name(name, cmd.args[0]), cmd.messages or [])
        elif name == b"FIN":
            if cmd.ids is not None:
                self._fin_run(cmd.ids)
            else:
                self._fin(cmd.args)
        elif name == b"RDY":
            self._rdy(cmd.args)
        elif name == b"REQ":
            if cmd.reqs is not None:
                self._req_run(cmd.reqs)
            else:
                self._req(cmd.args)
        elif name == b"TOUCH":
            self._touch(cmd.args)
        elif name == b"NOP":
            pass
        elif name == b"DPUB":
            self._publish(b"DPUB", self._topic_name(name, cmd.args[0]), [cmd.body or b""],
                          self._dpub_timeout(cmd.args[1]))
        elif name == b"SUB":
            self._sub(cmd.args)
        elif name == b"CLS":
            self._cls()
        elif name == b"IDENTIFY":
            self._identify(cmd.body or b"")
        elif name == b"AUTH":
            self._auth(cmd.body or b"")
        else:
            raise fatal("E_INVALID", f"invalid command {_text(name)}")

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
        self._closed = True
        self._cancel_timers()
        self.transport.abortConnection()  # type: ignore[union-attr]

    # -- AUTH -------------------------------------------------------------

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

    def _block_until(self, d: Deferred[Any], then: Callable[[Any], None]) -> None:
        """Read and run nothing more until ``d`` fires, then ``then(result or Failure)``.

        Used while a publish waits for its disk write and while the auth
        server is asked; ``then`` may raise an NSQError for the client.
        """
        self._blocked = self._waiting = True
        self.transport.pauseProducing()  # type: ignore[union-attr]
        d.addBoth(self._unblock, then).addErrback(self._unexpected)

    def _unexpected(self, failure: Failure) -> None:
        self.log.failure("[{client}] - unexpected error", failure, client=self)
        self._close()

    def _unblock(self, result: Any, then: Callable[[Any], None]) -> None:
        if self._closed:
            return
        self._waiting = False
        self._blocked = self._sliced
        try:
            then(result)
        except NSQError as e:
            self._send_error(e)
        if not self._closed and not self._blocked:
            self.transport.resumeProducing()  # type: ignore[union-attr]
            self._process()

    def _sub(self, args: list[bytes]) -> None:
        if self.state != STATE_INIT:
            raise fatal("E_INVALID", "cannot SUB in current state")
        if self.heartbeat_interval <= 0:
            raise fatal("E_INVALID", "cannot SUB with heartbeats disabled")
        if len(args) < 2:
            raise fatal("E_INVALID", "SUB insufficient number of parameters")
        topic_name = _text(args[0])
        if not is_valid_topic_name(topic_name):
            raise fatal("E_BAD_TOPIC", f"SUB topic name {go_quote(args[0])} is not valid")
        channel_name = _text(args[1])
        if not is_valid_channel_name(channel_name):
            raise fatal("E_BAD_CHANNEL", f"SUB channel name {go_quote(args[1])} is not valid")
        if self.auth.required and not self._authorize("SUB", topic_name, channel_name,
                                                           lambda: self._sub(args)):
            return
        channel = self.nsqd.get_topic(topic_name).get_channel(channel_name)
        try:
            channel.add_client(self)
        except ValueError:
            raise fatal("E_TOO_MANY_CHANNEL_CONSUMERS",
                        f"channel consumers for {topic_name}:{channel_name} exceeds limit of "
                        f"{self.nsqd.options.max_channel_consumers}") from None
        self.channel = channel
        self.state = STATE_SUBSCRIBED
        self._write(_OK)

    def _rdy(self, args: list[bytes]) -> None:
        if self.state == STATE_CLOSING:
            self.log.info("PROTOCOL(V2): [{client}] ignoring RDY after CLS in state ClientStateV2Closing",
                          client=self)
            return
        if self.state != STATE_SUBSCRIBED:
            raise fatal("E_INVALID", "cannot RDY in current state")
        count = 1
        if args:
            try:
                count = _parse_base10(args[0])
            except ValueError:
                raise fatal("E_INVALID", f"RDY could not parse count {_text(args[0])}") from None
        max_rdy = self.nsqd.options.max_rdy_count
        if count > max_rdy:
            raise fatal("E_INVALID", f"RDY count {count} out of range 0-{max_rdy}")
        self.ready_count = count
        assert self.channel is not None
        self.channel.wake()

    def _message_id(self, cmd: str, args: list[bytes], count: int) -> bytes:
        if self.state != STATE_SUBSCRIBED and self.state != STATE_CLOSING:
            raise fatal("E_INVALID", f"cannot {cmd} in current state")
        if len(args) < count:
            raise fatal("E_INVALID", f"{cmd} insufficient number of params")
        msg_id = args[0]
        if len(msg_id) != MSG_ID_LENGTH:
            raise fatal("E_INVALID", "invalid message ID")
        return msg_id

    def _fin(self, args: list[bytes]) -> None:
        self._finish([self._message_id("FIN", args, 1)])

    def _fin_run(self, msg_ids: list[bytes]) -> None:
        """A run of plain ``FIN <id>`` lines: each line's only possible error is the state's."""
        if self.state != STATE_SUBSCRIBED and self.state != STATE_CLOSING:
            raise fatal("E_INVALID", "cannot FIN in current state")
        self._finish(msg_ids)

    def _finish(self, msg_ids: list[bytes]) -> None:
        assert self.channel is not None
        for msg_id, e in self.channel.finish_many(self, msg_ids):
            self._send_error(nonfatal("E_FIN_FAILED", f"FIN {_text(msg_id)} failed {e}"))

    def _req_run(self, reqs: list[tuple[bytes, int]]) -> None:
        """A run of plain ``REQ <id> <ms>`` lines (:class:`~nsqtw.protocol.wire.Command`'s ``reqs``):
        one call on the channel."""
        if self.state != STATE_SUBSCRIBED and self.state != STATE_CLOSING:
            raise fatal("E_INVALID", "cannot REQ in current state")
        max_ms = self.nsqd.options.max_req_timeout * 1000
        if any(ms > max_ms for _, ms in reqs):
            for msg_id, ms in reqs:  # a timeout out of range is logged and clamped, one by one
                try:
                    self._req([msg_id, b"%d" % ms])
                except NSQError as e:
                    self._send_error(e)
            return
        assert self.channel is not None
        try:
            failed = self.channel.requeue_many(self, [(msg_id, ms / 1000.0) for msg_id, ms in reqs])
        except BackendError as e:
            raise nonfatal("E_REQ_FAILED", f"REQ {_text(reqs[-1][0])} failed {e}") from None
        for msg_id, why in failed:
            self._send_error(nonfatal("E_REQ_FAILED", f"REQ {_text(msg_id)} failed {why}"))

    def _req(self, args: list[bytes]) -> None:
        msg_id = self._message_id("REQ", args, 2)
        try:
            ms = _parse_base10(args[1])
        except ValueError:
            raise fatal("E_INVALID", f"REQ could not parse timeout {_text(args[1])}") from None
        max_req = self.nsqd.options.max_req_timeout
        delay = ms / 1000.0
        if delay > max_req:
            self.log.info("PROTOCOL(V2): [{client}] REQ timeout {timeout} out of range 0-{max}. "
                          "Setting to {max}", client=self, timeout=ms, max=int(max_req * 1000))
            delay = max_req
        assert self.channel is not None
        try:
            self.channel.requeue(self, msg_id, delay)
        except (NotInFlightError, ExitingError, BackendError) as e:
            raise nonfatal("E_REQ_FAILED", f"REQ {_text(msg_id)} failed {e}") from None

    def _touch(self, args: list[bytes]) -> None:
        msg_id = self._message_id("TOUCH", args, 1)
        assert self.channel is not None
        try:
            self.channel.touch(self, msg_id, self.msg_timeout)
        except NotInFlightError as e:
            raise nonfatal("E_TOUCH_FAILED", f"TOUCH {_text(msg_id)} failed {e}") from None

    def _cls(self) -> None:
        if self.state != STATE_SUBSCRIBED:
            raise fatal("E_INVALID", "cannot CLS in current state")
        self.ready_count = 0
        self.state = STATE_CLOSING
        self._write(_CLOSE_WAIT)

    def _publish(self, cmd: bytes, topic: str, bodies: list[bytes], defer: float = 0.0) -> None:
        if self.auth.required and not self._authorize(
                cmd.decode(), topic, "", lambda: self._publish(cmd, topic, bodies, defer)):
            return
        try:
            room = self.nsqd.wait_for_room(topic)
            if room is not None:
                # past the memory bound of unwritten records: read nothing from this
                # publisher until there is room, then ask again (checked before accepting)
                self._block_until(room, lambda result: self._publish_when_room(result, cmd, topic, bodies, defer))
                return
            written = self.nsqd.publish(topic, bodies, defer)
        except (ExitingError, BackendError) as e:
            c = cmd.decode()
            raise fatal(f"E_{c}_FAILED", f"{c} failed {e}") from None
        self.pub_counts[topic] = self.pub_counts.get(topic, 0) + len(bodies)
        if written is None:
            self._write(_OK)
            return
        # Some went to disk: answer once written, like nsqd. Until then this
        # publisher is paused, which is our backpressure on fast publishers.
        self._block_until(written, lambda result: self._published(result, cmd.decode()))

    def _publish_when_room(self, result: Any, cmd: bytes, topic: str, bodies: list[bytes], defer: float) -> None:
        if isinstance(result, Failure):
            c = cmd.decode()
            raise fatal(f"E_{c}_FAILED", f"{c} failed {result.getErrorMessage()}")
        self._publish(cmd, topic, bodies, defer)

    def _published(self, result: Any, cmd: str) -> None:
        if isinstance(result, Failure):
            raise fatal(f"E_{cmd}_FAILED", f"{cmd} failed {result.getErrorMessage()}")
        self._write(_OK)

    # -- IConsumer --------------------------------------------------------

    def ready_capacity(self) -> int:
        if self._paused_writing or self._closed or self.state != STATE_SUBSCRIBED:
            return 0
        return self.ready_count - self.in_flight_count

    def deliver(self, messages: list[Message]) -> None:
        self.in_flight_count += len(messages)
        self.message_count += len(messages)
        self._write(frames(messages))

    def messages_finished(self, count: int) -> None:
        self.in_flight_count -= count
        self.finish_count += count

    def message_requeued(self) -> None:
        self.in_flight_count -= 1
        self.requeue_count += 1

    def message_timed_out(self) -> None:
        self.in_flight_count -= 1
        if self.channel is not None:
            self.channel.wake()

    def in_flight_emptied(self) -> None:
        self.in_flight_count = 0

    def channel_deleted(self) -> None:
        """The channel went away under this client: nsqd closes the connection."""
        self.channel = None
        self._close()

    # -- IPushProducer (our writes to a slow reader) ------------------------

    def pauseProducing(self) -> None:
        self._paused_writing = True

    def resumeProducing(self) -> None:
        self._paused_writing = False
        if self.channel is not None:
            self.channel.wake()

    def stopProducing(self) -> None:
        self._paused_writing = True

    # -- stats ------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """This client's fields, every one present (the AUTH ones last), without ``pub_counts``."""
        out = self.go_stats()
        out.pop("pub_counts", None)
        auth = self.auth.stats()
        for key in auth:
            out.pop(key, None)
        out.update(auth)
        return out

    def go_stats(self, topic_filter: str = "") -> dict[str, Any]:
        """This client exactly as nsqd's ``/stats`` JSON has it, built in one go.

        Go's ``omitempty`` fields (AUTH's, and ``pub_counts`` narrowed to
        ``topic_filter``) sit after ``user_agent``. At 20,000 clients a
        ``/stats`` builds 20,000 of these, so it is one dict, not a copy of
        :meth:`stats` reordered.
        """
        tls = self._tls_info
        out: dict[str, Any] = {
            "client_id": self.identifier,
            "hostname": self.hostname,
            "version": "V2",
            "remote_address": self.remote_address,
            "state": self.state,
            "ready_count": self.ready_count,
            "in_flight_count": self.in_flight_count,
            "message_count": self.message_count,
            "finish_count": self.finish_count,
            "requeue_count": self.requeue_count,
            "connect_ts": self.connect_ts,
            "sample_rate": self.sample_rate,
            "deflate": self.deflate,
            "snappy": self.snappy,
            "user_agent": self.user_agent,
        }
        if self.auth.state is not None:
            for key, value in self.auth.stats().items():
                if value:
                    out[key] = value
        if self.pub_counts:
            counts = [{"topic": t, "count": n} for t, n in self.pub_counts.items()
                      if not topic_filter or t == topic_filter]
            if counts:
                out["pub_counts"] = counts
        out["tls"] = self.tls
        out["tls_cipher_suite"] = tls.get("tls_cipher_suite", "")
        out["tls_version"] = tls.get("tls_version", "")
        out["tls_negotiated_protocol"] = tls.get("tls_negotiated_protocol", "")
        out["tls_negotiated_protocol_is_mutual"] = tls.get("tls_negotiated_protocol_is_mutual", False)
        return out


    def stats_json(self, topic_filter: str = "") -> str:
        """``go_dumps(self.go_stats(topic_filter))``, byte for byte, at a fraction of its cost.

        A ``/stats`` at 20,000 clients spent about 40% of its time building and
        encoding client dicts whose text barely changes. The text is cached
        as a template with the six counters left open, remade whenever any
        other field it shows has changed (the key holds them all); a client
        with ``pub_counts`` (a producer) is encoded in full.
        """
        if self.pub_counts:
            return go_dumps(self.go_stats(topic_filter))
        auth = self.auth
        key = (self.identifier, self.hostname, self.remote_address, self.connect_ts, self.sample_rate,
               self.deflate, self.snappy, self.user_agent, self.tls, self._tls_info,
               tuple(auth.stats().values()) if auth.state is not None else None)
        if key != self._stats_key:
            self._stats_template = self._make_stats_template()
            self._stats_key = key
        return self._stats_template.format(self.state, self.ready_count, self.in_flight_count,
                                           self.message_count, self.finish_count, self.requeue_count)

    def _make_stats_template(self) -> str:
        fields = self.go_stats()
        for i, name in enumerate(_STATS_COUNTERS):
            fields[name] = _STATS_MARK + i
        text = go_dumps(fields).replace("{", "{{").replace("}", "}}")
        for i, name in enumerate(_STATS_COUNTERS):
            # '"name":' cannot occur inside a JSON string (its quotes would be escaped there)
            text = text.replace(f'"{name}":{_STATS_MARK + i}', f'"{name}":{{{i}}}', 1)
        return text


#: the go_stats fields :meth:`V2Protocol.stats_json` fills in each time, in its format's order
_STATS_COUNTERS = ("state", "ready_count", "in_flight_count", "message_count", "finish_count", "requeue_count")
#: stand-ins for them while the template is made
_STATS_MARK = 8_000_000_000_000_000_000


class V2Factory(ServerFactory):
    """Builds a :class:`V2Protocol` per connection to the TCP listener."""

    noisy = False

    def __init__(self, nsqd: NSQD, clock: IReactorTime) -> None:
        self.nsqd = nsqd
        self.clock = clock

    def buildProtocol(self, addr: Any) -> V2Protocol:
        return V2Protocol(self.nsqd, self.clock)
