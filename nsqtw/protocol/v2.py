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

from nsqtw._go.strconv import parse_int
from nsqtw.core import commands
from nsqtw.core.admission import PUBLISHED, Failed, WaitForRoom, Written, admit, settled
from nsqtw.core.commands import SUBSCRIBED, TOO_MANY, Consumer, Failures, SubOutcome
from nsqtw.core.message import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE, MSG_ID_LENGTH, Message, frame, frames
from nsqtw.errors import NSQError, fatal, nonfatal
from nsqtw.interfaces import IConsumer, IStreamCodec
from nsqtw.log import Logger
from nsqtw.names import go_quote, is_valid_channel_name, is_valid_topic_name
from nsqtw.protocol.authz import ClientAuth
from nsqtw.protocol.client_stats import ClientStats
from nsqtw.protocol.compress import CodecError
from nsqtw.protocol.handshake import Handshake
from nsqtw.protocol.heartbeat import Heartbeats
from nsqtw.protocol.identify import DEFAULT_OUTPUT_BUFFER_SIZE
from nsqtw.protocol.node import Node
from nsqtw.protocol.states import ClientState, Input
from nsqtw.protocol.wire import BODY_COMMANDS, Command, LineTooLong, V2Parser

# The members as module constants: a member looked up through its Enum class costs about
# 150 ns on CPython 3.11, and these are compared for every command and every delivery.
_RUNNING, _WAITING, _YIELDED, _CLOSED = Input.RUNNING, Input.WAITING, Input.YIELDED, Input.CLOSED
_INIT, _SUBSCRIBED, _CLOSING = ClientState.INIT, ClientState.SUBSCRIBED, ClientState.CLOSING

#: the reactor time one client's input may take before others are served (see _process)
SLICE_SECONDS = 0.002
#: the most REQs one connection's slice takes (each is a message redelivered next turn)
REQS_PER_SLICE = 128
#: how many topic names one connection remembers as checked (see V2Protocol._topic_name)
KNOWN_TOPICS = 64

_OK = frame(FRAME_TYPE_RESPONSE, b"OK")
_CLOSE_WAIT = frame(FRAME_TYPE_RESPONSE, b"CLOSE_WAIT")

def _parse_base10(value: bytes) -> int:
    """nsqd's ByteToBase10: digits only (no sign, no spaces); the caller checks the range.

    An empty argument is 0, not an error: ``RDY `` and ``RDY  5`` (the count
    is the empty word between two spaces) set RDY 0 in nsqd.
    """
    if not value:
        return 0
    return parse_int(value, 10, signed=False, bounded=False)


def _nothing() -> None:
    return None


def _text(value: bytes) -> str:
    return value.decode("utf-8", "surrogateescape")


@implementer(IConsumer, IPushProducer, IHandshakeListener)
class V2Protocol(Handshake, Heartbeats, ClientStats, Consumer, Protocol):
    """One client connection speaking nsqd's V2 protocol.

    Its state is nsqd's client state (:attr:`state`, a :class:`ClientState`:
    what the client may ask for) and where its input stands
    (:attr:`_input`, an :class:`Input`: whether the next command may run).
    Apart from them, ``_paused_writing``: whether the transport asked for
    no more writes (a slow reader), which neither decides nor is decided
    by the other two.
    """

    log = Logger()
    #: how long one client's commands may run before the others get the reactor
    slice_seconds = SLICE_SECONDS
    #: the clock slices are measured with (CPU work, not the reactor's time)
    _now = staticmethod(time.perf_counter)

    def __init__(self, nsqd: Node, clock: IReactorTime) -> None:
        o = nsqd.options
        self.nsqd = nsqd
        self.clock = clock
        self.client_id = nsqd.new_client_id()
        self.parser = V2Parser(o.max_msg_size, o.max_body_size, self._check_header)
        self.heartbeat_interval = o.client_timeout / 2
        #: state, channel, ready count and counters: what the node's side of its commands keeps
        self.init_consumer(_INIT, o.msg_timeout)
        self.output_buffer_timeout = o.output_buffer_timeout
        self.connect_ts = int(clock.seconds())
        #: nsqd's --tls-required: every command but IDENTIFY needs TLS first
        self._need_tls = bool(o.tls_required)
        self._tls_info: dict[str, Any] = {}
        #: AUTH: the secret and the auth server's answer (off when nsqd has no --auth-http-address)
        self.auth = ClientAuth(nsqd.auth, clock)
        #: whether commands are read and run now (see :class:`Input`)
        self._input = _RUNNING
        #: the transport was paused because input came while a command waited (:meth:`_block_until`)
        self._paused_waiting = False
        #: the transport asked us to stop writing (a slow reader): no deliveries meanwhile.
        #: Apart from :attr:`_input`: a client that reads slowly may still publish, and one
        #: that waits on a publish may still be sent the messages it subscribed to
        self._paused_writing = False
        # IDENTIFY-able settings, nsqd's defaults (the option-derived ones are set above)
        self.output_buffer_size = DEFAULT_OUTPUT_BUFFER_SIZE
        self.sample_rate = 0
        self.identifier = ""
        self.hostname = ""
        self.user_agent = ""
        self.remote_address = ""
        # the encodings agreed in IDENTIFY
        self.tls = False
        self.snappy = False
        self.deflate = False
        #: tls_v1 agreed, TLS not begun: (snappy, deflate, level, bytes the client sent so far)
        self._tls_pending: tuple[bool, bool, int, bytes] | None = None
        #: reads through the negotiated compression, when there is one
        self._decoder: IStreamCodec | None = None
        self._handshake_call: IDelayedCall | None = None
        self._heartbeat_call: IDelayedCall | None = None
        self._read_deadline: IDelayedCall | None = None
        self._command_at = 0.0
        #: topic arguments of publishes already found valid, and the names they stand for
        self._known_topics: dict[bytes, str] = {}
        #: the transport's ``cork()``, when it can gather writes (:class:`nsqtw.net.eager.EagerServer`)
        self._cork: Callable[[], None] | None = None
        #: the transport's ``uncork()``: what it gathered leaves now (before a change of encoding too)
        self._uncork: Callable[[], None] = _nothing

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
        # looked up once: a compressing transport put in front later passes them through
        self._cork = getattr(self.transport, "cork", None)
        self._uncork = getattr(self.transport, "uncork", _nothing)
        self._restart_heartbeat()
        self._reset_read_deadline()

    def connectionLost(self, reason: Failure | None = None) -> None:
        self._input = _CLOSED
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

    def close(self) -> None:
        """Hang up (graceful stop, channel deleted)."""
        self._close()

    def _closed(self) -> bool:
        return self._input is _CLOSED

    def _close(self, abort: bool = False) -> None:
        """Hang up: after what was written (or at once, dropping it, when ``abort``)."""
        if self._input is not _CLOSED:
            self._input = _CLOSED
            self._cancel_timers()
            if abort:
                self.transport.abortConnection()  # type: ignore[union-attr]
            else:
                self.transport.loseConnection()  # type: ignore[union-attr]

    # -- reading ----------------------------------------------------------

    def dataReceived(self, data: bytes) -> None:
        if self._input is _CLOSED:
            return
        if self._tls_pending is not None:
            self._tls_first_bytes(data)
            return
        if self._decoder is None:
            self.parser.feed(data)
        else:
            self._decoder.feed(data)
        if self._input is _WAITING:
            self._pause_waiting()  # a pipelining client: what came is kept, nothing more is read
            return
        self._process()

    def _process(self) -> None:
        """Run the buffered commands: for at most one slice of reactor time, then yield.

        Every client shares the one reactor thread, so one client's input
        (a pipelined flood, a decompression bomb, a storm of creates) is
        worked through :attr:`slice_seconds` at a time: past that the
        transport stops reading and the rest waits for the next reactor
        turn, after every other connection has had its turn. Order and
        content are unchanged; TCP flow control slows the flooder down.

        When more than the command at hand has arrived, the transport is
        corked where it can be (a listener's connections can:
        :class:`nsqtw.net.eager.EagerServer`), so the answers of every
        command run now leave in one send. A read that holds one command,
        the usual case, needs no cork: its answer is its one write.
        """
        parser = self.parser
        now = self._now
        deadline = now() + self.slice_seconds
        steps = 0
        requeued = 0
        corked = False
        try:
            while self._input is _RUNNING:
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
                if not corked and self._cork is not None and (parser.buffered() or self._decoder is not None):
                    self._cork()  # more commands follow this one: their answers go out together
                    corked = True
                self._restart_read_deadline()
                try:
                    self._dispatch(cmd)
                except NSQError as e:
                    self._send_error(e)
                if not parser.buffered() and self._decoder is None:
                    return  # the usual case: the read held this one command
                if cmd.reqs is not None and self._input is _RUNNING:
                    requeued += len(cmd.reqs)
                    if requeued >= REQS_PER_SLICE:
                        # each comes back through the channel's pump on the next turn: as many
                        # as that may take before the others get the reactor
                        self._yield_slice()
                        return
                    steps |= 7  # a run is worth eight commands: look at the clock next
        finally:
            if corked:
                self._uncork()

    def _yield_slice(self) -> None:
        """Stop reading until the next reactor turn; then carry on where this slice stopped."""
        self._input = _YIELDED
        self.transport.pauseProducing()  # type: ignore[union-attr]
        self.clock.callLater(0, self._next_slice)

    def _next_slice(self) -> None:
        if self._input is not _YIELDED:  # closed meanwhile
            return
        self._input = _RUNNING
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
        self.transport.write(data)  # type: ignore[union-attr]

    def _check_header(self, name: bytes, args: list[bytes]) -> None:
        """What nsqd checks of every command before it reads anything after its line.

        The parser calls this for each command (once for a run of FINs or
        REQs): TLS first, the one place it is checked, then a body
        command's state, parameters and topic.
        """
        if self._need_tls and name != b"IDENTIFY":
            raise fatal("E_INVALID", f"cannot {_text(name)} in current state (TLS required)")
        # a topic argument in _known_topics was checked before (see _topic_name)
        if name == b"PUB":
            if not args or args[0] not in self._known_topics:
                self._topic_arg(b"PUB", args, 1)
        elif name == b"MPUB":
            topic = self._known_topics.get(args[0]) if args else None
            if topic is None:
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
            if self.state != _INIT:
                raise fatal("E_INVALID", "cannot IDENTIFY in current state")
        elif name == b"AUTH":
            if self.state != _INIT:
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
        topic = known.get(raw)
        if topic is None:
            topic = _text(raw)
            if not is_valid_topic_name(topic):
                raise fatal("E_BAD_TOPIC", f"{cmd.decode()} topic name {go_quote(raw)} is not valid")
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
        if name == b"PUB" or name == b"MPUB":  # the header check found the topic valid
            topic = self._known_topics.get(cmd.args[0]) or _text(cmd.args[0])
            self._publish(name, topic, [cmd.body or b""] if cmd.messages is None else cmd.messages)
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

    def _block_until(self, d: Deferred[Any], then: Callable[[Any], None]) -> None:
        """Read and run nothing more until ``d`` fires, then ``then(result or Failure)``.

        Used while a publish waits for its disk write or its replica and
        while the auth server is asked; ``then`` may raise an NSQError for
        the client. The transport is paused only once more input is here
        (now, or when it comes): a publisher that waits for each answer, the
        usual one, costs no ``epoll_ctl`` pair per command.
        """
        self._input = _WAITING
        if self.parser.buffered() or self._decoder is not None:
            self._pause_waiting()
        d.addBoth(self._unblock, then)

    def _pause_waiting(self) -> None:
        if not self._paused_waiting:
            self._paused_waiting = True
            self.transport.pauseProducing()  # type: ignore[union-attr]

    def _unexpected(self, failure: Failure) -> None:
        self.log.failure("[{client}] - unexpected error", failure, client=self)
        self._close()

    def _unblock(self, result: Any, then: Callable[[Any], None]) -> None:
        """The one callback on what a command waited for (a publish waits on this for each
        answer): ``then``, then the input that came meanwhile. What escapes is logged and closes
        the connection, never left in the Deferred."""
        if self._input is not _WAITING:  # closed meanwhile
            return
        self._input = _RUNNING
        try:
            try:
                then(result)
            except NSQError as e:
                self._send_error(e)
            if self._input is _RUNNING:  # not waiting again (``then`` may wait), nor closed
                if self._paused_waiting:
                    self._paused_waiting = False
                    self.transport.resumeProducing()  # type: ignore[union-attr]
                if self.parser.buffered() or self._decoder is not None:
                    self._process()  # (a publisher that waits for each answer sent nothing more)
        except Exception:
            self._unexpected(Failure())

    def _sub(self, args: list[bytes]) -> None:
        if self.state != _INIT:
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
        outcome = commands.subscribe(self.nsqd, topic_name, channel_name, self)
        if isinstance(outcome, Deferred):  # a worker's: its core answers
            self._block_until(outcome, lambda result: self._subscribed(
                commands.subscribed(self, result), topic_name, channel_name))
        else:
            self._subscribed(outcome, topic_name, channel_name)

    def _subscribed(self, outcome: SubOutcome, topic_name: str, channel_name: str) -> None:
        """SUB's answer: OK, or a fatal error for the node's refusal."""
        if outcome is SUBSCRIBED:
            self._write(_OK)
        elif outcome is TOO_MANY:
            raise fatal("E_TOO_MANY_CHANNEL_CONSUMERS",
                        f"channel consumers for {topic_name}:{channel_name} exceeds limit of "
                        f"{self.nsqd.options.max_channel_consumers}")
        else:
            raise fatal("E_SUB_FAILED", f"SUB failed {outcome.why}")

    def _rdy(self, args: list[bytes]) -> None:
        if self.state == _CLOSING:
            self.log.info("PROTOCOL(V2): [{client}] ignoring RDY after CLS in state ClientStateV2Closing",
                          client=self)
            return
        if self.state != _SUBSCRIBED:
            raise fatal("E_INVALID", "cannot RDY in current state")
        count = 1
        if args:
            try:
                count = _parse_base10(args[0])
            except ValueError:
                raise fatal("E_INVALID", f"RDY could not parse count {_text(args[0])}") from None
        commands.ready(self, count, self.nsqd.options.max_rdy_count)

    def _message_id(self, cmd: str, args: list[bytes], count: int) -> bytes:
        if self.state != _SUBSCRIBED and self.state != _CLOSING:
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
        if self.state != _SUBSCRIBED and self.state != _CLOSING:
            raise fatal("E_INVALID", "cannot FIN in current state")
        self._finish(msg_ids)

    def _finish(self, msg_ids: list[bytes]) -> None:
        failed = commands.finish(self, msg_ids)
        if failed:  # the usual FIN run fails none: no more calls for it
            self._report_failures("FIN", failed)

    def _report_failures(self, cmd: str, failed: Failures) -> None:
        for msg_id, why in failed:
            self.report_failed(cmd, msg_id, why)

    def report_failed(self, cmd: str, msg_id: bytes, why: object) -> None:
        """nsqd's answer to a FIN, REQ or TOUCH that failed (a worker's comes from its core, later)."""
        self._send_error(nonfatal(f"E_{cmd}_FAILED", f"{cmd} {_text(msg_id)} failed {why}"))

    def _req_run(self, reqs: list[tuple[bytes, int]]) -> None:
        """A run of plain ``REQ <id> <ms>`` lines (:class:`~nsqtw.protocol.wire.Command`'s ``reqs``):
        one call on the channel."""
        if self.state != _SUBSCRIBED and self.state != _CLOSING:
            raise fatal("E_INVALID", "cannot REQ in current state")
        max_ms = self.nsqd.options.max_req_timeout * 1000
        if any(ms > max_ms for _, ms in reqs):
            for msg_id, ms in reqs:  # a timeout out of range is logged and clamped, one by one
                try:
                    self._req([msg_id, b"%d" % ms])
                except NSQError as e:
                    self._send_error(e)
            return
        self._report_failures("REQ", commands.requeue(self, [(msg_id, ms / 1000.0) for msg_id, ms in reqs]))

    def _req(self, args: list[bytes]) -> None:
        msg_id = self._message_id("REQ", args, 2)
        try:
            ms = _parse_base10(args[1])
        except ValueError:
            raise fatal("E_INVALID", f"REQ could not parse timeout {_text(args[1])}") from None
        delay = commands.requeue_delay(self, ms, self.nsqd.options.max_req_timeout)
        self._report_failures("REQ", commands.requeue(self, [(msg_id, delay)]))

    def _touch(self, args: list[bytes]) -> None:
        self._report_failures("TOUCH", commands.touch(self, self._message_id("TOUCH", args, 1)))

    def _cls(self) -> None:
        if self.state != _SUBSCRIBED:
            raise fatal("E_INVALID", "cannot CLS in current state")
        self.ready_count = 0
        self.state = _CLOSING
        self._write(_CLOSE_WAIT)
        assert self.channel is not None
        self.channel.wake()  # nothing more for this client (a worker's core learns it so)

    def _publish(self, cmd: bytes, topic: str, bodies: list[bytes], defer: float = 0.0) -> None:
        """PUB, MPUB, DPUB: the node's admission (:func:`~nsqtw.core.admission.admit`), answered
        as nsqd does: OK now, OK once the disk write is done, or a fatal ``E_<CMD>_FAILED``."""
        if self.auth.required and not self._authorize(
                cmd.decode(), topic, "", lambda: self._publish(cmd, topic, bodies, defer)):
            return
        outcome = admit(self.nsqd, topic, bodies, defer, self)
        if outcome is PUBLISHED:
            self._write(_OK)
        elif isinstance(outcome, Written):
            # Some went to disk: answer once written, like nsqd. Until then this
            # publisher is paused, which is our backpressure on fast publishers.
            self._block_until(outcome.deferred, lambda result: self._published(result, cmd))
        elif isinstance(outcome, WaitForRoom):
            # past the memory bound of unwritten records: read nothing from this
            # publisher until there is room, then ask again (checked before accepting)
            self._block_until(outcome.room, lambda result: self._publish_when_room(result, cmd, topic, bodies, defer))
        else:
            raise _publish_failed(cmd, outcome)

    def _publish_when_room(self, result: Any, cmd: bytes, topic: str, bodies: list[bytes], defer: float) -> None:
        room = settled(result)
        if isinstance(room, Failed):
            raise _publish_failed(cmd, room)
        self._publish(cmd, topic, bodies, defer)

    def _published(self, result: Any, cmd: bytes) -> None:
        written = settled(result)
        if isinstance(written, Failed):
            raise _publish_failed(cmd, written)
        self._write(_OK)

    # -- IConsumer --------------------------------------------------------

    def ready_capacity(self) -> int:
        if self._paused_writing or self._input is _CLOSED or self.state != _SUBSCRIBED:
            return 0
        return self.ready_count - self.in_flight_count

    def deliver(self, messages: list[Message]) -> None:
        self.count_delivered(len(messages))
        self.transport.writeSequence(frames(messages))  # type: ignore[union-attr]

    def deliver_frames(self, data: bytes) -> None:
        """MESSAGE frames a worker's core sent for this client (counted there)."""
        self.transport.write(data)  # type: ignore[union-attr]

    def channel_deleted(self) -> None:
        """The channel went away under this client: nsqd closes the connection."""
        self.channel = None
        self._close()

    # -- IPushProducer (our writes to a slow reader) ------------------------

    def pauseProducing(self) -> None:
        self._paused_writing = True
        if self.channel is not None:
            self.channel.wake()  # its capacity fell to 0 (a worker's core learns it so)

    def resumeProducing(self) -> None:
        self._paused_writing = False
        if self.channel is not None:
            self.channel.wake()

    def stopProducing(self) -> None:
        self._paused_writing = True

def _publish_failed(cmd: bytes, failed: Failed) -> NSQError:
    """nsqd's answer to a publish the node refused: fatal ``E_PUB_FAILED PUB failed <why>``."""
    c = cmd.decode()
    if not failed.fatal:
        return nonfatal(f"E_{c}_FAILED", f"{c} failed {failed.why}")
    return fatal(f"E_{c}_FAILED", f"{c} failed {failed.why}")


class V2Factory(ServerFactory):
    """Builds a :class:`V2Protocol` per connection to the TCP listener."""

    noisy = False

    def __init__(self, nsqd: Node, clock: IReactorTime) -> None:
        self.nsqd = nsqd
        self.clock = clock

    def buildProtocol(self, addr: Any) -> V2Protocol:
        return V2Protocol(self.nsqd, self.clock)
