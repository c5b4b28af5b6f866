"""nsqlookupd's V1 TCP protocol: nsqd nodes IDENTIFY, REGISTER, UNREGISTER and PING.

The protocol only turns bytes into calls on :class:`~nsqtw.lookupd.lookupd.NSQLookupd`
and answers them. Every error nsqlookupd sends on V1 is fatal: the error text
is written as a response and the connection is closed, after which the node's
registrations are dropped like on any disconnect.
"""

from __future__ import annotations

import time
from typing import Any

from twisted.internet.protocol import Factory, Protocol
from twisted.python.failure import Failure

from nsqtw._go.json import go_json, go_loads
from nsqtw.errors import NSQError, fatal
from nsqtw.log import Logger
from nsqtw.lookupd.db import PeerInfo
from nsqtw.lookupd.lookupd import NSQLookupd
from nsqtw.lookupd.wire import MAGIC_V1, Body, Line, LineTooLong, V1Parser, encode_response
from nsqtw.names import is_valid_channel_name, is_valid_topic_name
from nsqtw.net.listen import join_host_port

__all__ = ["LookupFactory", "LookupProtocolV1", "decode_peer_info"]

_STRING_FIELDS = ("remote_address", "hostname", "broadcast_address", "version")
_INT_FIELDS = ("tcp_port", "http_port")
_INT64 = (-(1 << 63), (1 << 63) - 1)
#: how long one connection's commands may run before the others get the reactor (as nsqd's V2)
SLICE_SECONDS = 0.002
_OK_TEXT = b"OK"
_OK = encode_response(_OK_TEXT)


def decode_peer_info(peer_id: str, body: bytes) -> PeerInfo:
    """IDENTIFY's JSON body as Go's ``json.Unmarshal`` into PeerInfo reads it.

    Keys match field names case-insensitively, unknown keys and ``null``
    are ignored, and a value of the wrong type is an error.
    """
    bad = fatal("E_BAD_BODY", "IDENTIFY failed to decode JSON body")
    try:
        data = go_loads(body)
    except ValueError:
        raise bad from None
    peer = PeerInfo(id=peer_id)
    if data is None:
        return peer
    if not isinstance(data, dict):
        raise bad
    for key, value in data.items():
        name = key.lower()
        if value is None:
            continue
        if name in _STRING_FIELDS:
            if not isinstance(value, str):
                raise bad
            setattr(peer, name, value)
        elif name in _INT_FIELDS:
            if isinstance(value, bool) or not isinstance(value, int) or not (
                    _INT64[0] <= value <= _INT64[1]):
                raise bad
            setattr(peer, name, value)
    return peer


class LookupProtocolV1(Protocol):
    """One nsqd connection: magic, then commands answered in order."""

    log = Logger()
    #: how long one connection's commands may run before the others get the reactor
    slice_seconds = SLICE_SECONDS
    #: the clock slices are measured with (CPU work, not the reactor's time)
    _now = staticmethod(time.perf_counter)
    #: this connection's slice is used up: it reads nothing until the next reactor turn
    _sliced = False

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.parser = V1Parser()
        self.peer: PeerInfo | None = None
        self._magic = b""
        self._closing = False
        self.name = ""

    def connectionMade(self) -> None:
        addr = self.transport.getPeer()  # type: ignore[union-attr]
        self.name = join_host_port(getattr(addr, "host", ""), getattr(addr, "port", ""))
        self.log.info("TCP: new client({client})", client=self.name)

    def dataReceived(self, data: bytes) -> None:
        if self._closing:
            return
        if len(self._magic) < 4:
            need = 4 - len(self._magic)
            self._magic += data[:need]
            data = data[need:]
            if len(self._magic) < 4:
                return
            magic = self._magic.decode("utf-8", "replace")
            if self._magic != MAGIC_V1:
                self.log.error("client({client}) bad protocol magic '{magic}'", client=self.name,
                               magic=magic)
                self._close_with(b"E_BAD_PROTOCOL")
                return
            self.log.info("CLIENT({client}): desired protocol magic '{magic}'", client=self.name,
                          magic=magic)
        self.parser.feed(data)
        if not self._sliced:
            self._run_commands()

    def _run_commands(self) -> None:
        """Answer the buffered commands for at most :attr:`slice_seconds`, then let the others in.

        A node that pipelines a flood of REGISTERs is served a slice at a
        time: past it the connection stops reading until the next reactor
        turn (TCP flow control slows the sender). The answers of one slice
        leave in one write.
        """
        now = self._now
        deadline = now() + self.slice_seconds
        answers: list[bytes] = []
        steps = 0
        try:
            while not self._closing:
                steps += 1
                if steps & 15 == 0 and now() > deadline:
                    self._yield_slice()
                    return
                event = self.parser.next_event()
                if event is None:
                    return
                response = self._exec(event)
                if response is not None:
                    answers.append(_OK if response is _OK_TEXT else encode_response(response))
        except LineTooLong:
            self._write(answers)
            self.log.error("[{client}] - line too long", client=self.name)
            self._closing = True
            self.transport.loseConnection()  # type: ignore[union-attr]
        except NSQError as e:
            self._write(answers)
            self.log.error("[{client}] - {error}", client=self.name, error=str(e))
            self._close_with(e.frame_body())
        finally:
            self._write(answers)

    def _write(self, answers: list[bytes]) -> None:
        if answers:
            self.transport.write(b"".join(answers))  # type: ignore[union-attr]
            answers.clear()

    def _yield_slice(self) -> None:
        self._sliced = True
        self.transport.pauseProducing()  # type: ignore[union-attr]
        self.lookupd.clock.callLater(0, self._next_slice)

    def _next_slice(self) -> None:
        self._sliced = False
        if self._closing:
            return
        self.transport.resumeProducing()  # type: ignore[union-attr]
        self._run_commands()

    def _close_with(self, text: bytes) -> None:
        self._closing = True
        self.transport.write(encode_response(text))  # type: ignore[union-attr]
        self.transport.loseConnection()  # type: ignore[union-attr]

    def _exec(self, event: Line | Body) -> bytes | None:
        """Answer one line (None while an IDENTIFY body is still to come)."""
        if isinstance(event, Body):
            return self._identified(event.data)
        params = event.params
        command = params[0]
        if command == "PING":
            self.lookupd.ping(self.peer)
            return _OK_TEXT
        if command == "IDENTIFY":
            if self.peer is not None:
                raise fatal("E_INVALID", "cannot IDENTIFY again")
            self.parser.expect_body()
            return None
        if command in ("REGISTER", "UNREGISTER"):
            if self.peer is None:
                raise fatal("E_INVALID", "client must IDENTIFY")
            topic, channel = _topic_channel(command, params[1:])
            if command == "REGISTER":
                self.lookupd.register(self.peer, topic, channel)
            else:
                self.lookupd.unregister(self.peer, topic, channel)
            return _OK_TEXT
        raise fatal("E_INVALID", f"invalid command {command}")

    def _identified(self, body: bytes) -> bytes:
        peer = decode_peer_info(self.name, body)
        peer.remote_address = self.name
        if not (peer.broadcast_address and peer.tcp_port and peer.http_port and peer.version):
            raise fatal("E_BAD_BODY", "IDENTIFY missing fields")
        self.peer = peer
        return go_json(self.lookupd.identify(peer))

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        self._closing = True  # a slice still to come reads nothing more
        self.log.info("PROTOCOL(V1): [{client}] exiting ioloop", client=self.name)
        if self.peer is not None:
            self.lookupd.disconnected(self.peer)
            self.peer = None


def _topic_channel(command: str, params: list[str]) -> tuple[str, str]:
    """nsqlookupd's getTopicChan: a valid topic and an optional valid channel."""
    if not params:
        raise fatal("E_INVALID", f"{command} insufficient number of params")
    topic = params[0]
    channel = params[1] if len(params) >= 2 else ""
    if not is_valid_topic_name(topic):
        raise fatal("E_BAD_TOPIC", f"{command} topic name '{topic}' is not valid")
    if channel and not is_valid_channel_name(channel):
        raise fatal("E_BAD_CHANNEL", f"{command} channel name '{channel}' is not valid")
    return topic, channel


class LookupFactory(Factory):
    """Builds a :class:`LookupProtocolV1` per nsqd connection."""

    noisy = False

    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd

    def buildProtocol(self, addr: Any) -> LookupProtocolV1:
        return LookupProtocolV1(self.lookupd)
