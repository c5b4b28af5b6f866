"""The client library without sockets: options as go-nsq reads them, frame splitting, the handshake."""

from __future__ import annotations

import json
import struct
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.error import ConnectionDone, ConnectionRefusedError
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.python.failure import Failure
from twisted.trial.unittest import SynchronousTestCase
from zope.interface import implementer
from zope.interface.verify import verifyObject

from nsqtw.client import Config, ConfigError, Consumer, Message, NSQErrorResponse, Producer
from nsqtw.client import conn as conn_module
from nsqtw.client.conn import Dialer, NSQClientProtocol
from nsqtw.interfaces import IConnectionDelegate
from nsqtw.protocol.compress import SnappyCodec
from nsqtw.protocol.wire import FrameParser, FrameTooLarge, encode_dpub, encode_pub, fin, rdy, req, touch


def frame(ftype: int, data: bytes) -> bytes:
    return struct.pack(">ii", len(data) + 4, ftype) + data


@implementer(IConnectionDelegate)
class Recorder:
    """A delegate that records what the connection reports."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_response(self, conn: object, data: bytes) -> None:
        self.events.append(("response", data))

    def on_error(self, conn: object, data: bytes) -> None:
        self.events.append(("error", data))

    def on_message(self, conn: object, data: bytes) -> None:
        self.events.append(("message", data))

    def on_close(self, conn: object, reason: Exception) -> None:
        self.events.append(("close", str(reason)))


class ConfigTests(SynchronousTestCase):
    def test_set_coerces_like_go_nsq(self) -> None:
        """Durations as Go strings or integer milliseconds, bools and ints from strings, hyphens too."""
        c = Config()
        c.set("heartbeat_interval", "10s")
        c.set("msg_timeout", 1500)
        c.set("snappy", "true")
        c.set("max_in_flight", "200")
        c.set("tls-insecure-skip-verify", True)
        self.assertEqual((c.heartbeat_interval, c.msg_timeout, c.snappy, c.max_in_flight,
                          c.tls_insecure_skip_verify), (10.0, 1.5, True, 200, True))

    def test_set_flag(self) -> None:
        """``--consumer-opt=key,value``, and a key alone meaning true."""
        c = Config()
        c.set_flag("deflate")
        c.set_flag("deflate_level,3")
        self.assertEqual((c.deflate, c.deflate_level), (True, 3))

    def test_refusals(self) -> None:
        """Unknown options, bad values and out-of-range values are refused with go-nsq's wording."""
        c = Config()
        with self.assertRaisesRegex(ConfigError, "invalid option nope"):
            c.set("nope", 1)
        with self.assertRaisesRegex(ConfigError, "failed to coerce option snappy"):
            c.set("snappy", "maybe")
        with self.assertRaisesRegex(ConfigError, r"invalid deflate_level ! 10 > 9"):
            c.set("deflate_level", "10")
        with self.assertRaisesRegex(ConfigError, "must be less than ReadTimeout"):
            Config(heartbeat_interval=90.0).validate()

    def test_identify_body(self) -> None:
        """IDENTIFY asks for feature negotiation and sends durations in milliseconds."""
        body = json.loads(Config(heartbeat_interval=5.0, msg_timeout=2.0, snappy=True).identify_body())
        self.assertEqual((body["feature_negotiation"], body["heartbeat_interval"], body["msg_timeout"],
                          body["snappy"]), (True, 5000, 2000, True))


class WireTests(SynchronousTestCase):
    def test_frame_parser_any_chunking(self) -> None:
        """Frames come out whole whatever the chunking, one at a time."""
        data = frame(0, b"OK") + frame(1, b"E_INVALID x") + frame(2, b"m" * 40)
        for size in range(1, len(data) + 1):
            p = FrameParser()
            got = []
            for i in range(0, len(data), size):
                p.feed(data[i:i + size])
                while (f := p.next_frame()) is not None:
                    got.append(f)
            self.assertEqual(got, [(0, b"OK"), (1, b"E_INVALID x"), (2, b"m" * 40)])

    def test_frame_parser_size_checked_first(self) -> None:
        """A frame larger than the limit is refused from its header alone."""
        p = FrameParser(max_size=100)
        p.feed(struct.pack(">ii", 1000, 0))
        with self.assertRaises(FrameTooLarge):
            p.next_frame()

    def test_frame_parser_frames_at_once(self) -> None:
        """``frames()`` hands out every complete frame of the buffer and keeps a partial one."""
        data = frame(0, b"OK") + frame(2, b"m" * 40) + frame(0, b"_heartbeat_")
        for cut in range(len(data) + 1):
            p = FrameParser()
            p.feed(data[:cut])
            got = p.frames()
            p.feed(data[cut:])
            got += p.frames()
            self.assertEqual(got, [(0, b"OK"), (2, b"m" * 40), (0, b"_heartbeat_")])
            self.assertEqual(p.frames(), [])
        p = FrameParser(max_size=100)
        p.feed(frame(0, b"OK") + struct.pack(">ii", 1000, 0))
        with self.assertRaises(FrameTooLarge):
            p.frames()

    def test_command_encoders(self) -> None:
        """The client's commands, byte for byte."""
        self.assertEqual(encode_pub(b"t", b"ab"), b"PUB t\n\x00\x00\x00\x02ab")
        self.assertEqual(encode_dpub(b"t", 1500, b"a"), b"DPUB t 1500\n\x00\x00\x00\x01a")
        self.assertEqual(rdy(5) + fin(b"I" * 16) + req(b"I" * 16, 100) + touch(b"I" * 16),
                         b"RDY 5\nFIN " + b"I" * 16 + b"\nREQ " + b"I" * 16 + b" 100\nTOUCH " + b"I" * 16 + b"\n")


class ProtocolTests(SynchronousTestCase):
    def connect(self, **config: Any) -> tuple[NSQClientProtocol, StringTransport, Recorder, Clock]:
        clock = Clock()
        rec = Recorder()
        proto = NSQClientProtocol("127.0.0.1:4150", Config(**config), rec, clock)
        transport = StringTransport()
        proto.makeConnection(transport)
        return proto, transport, rec, clock

    def test_identify_then_ready(self) -> None:
        """The magic and IDENTIFY go first; the JSON answer makes the connection ready."""
        proto, transport, rec, _ = self.connect()
        sent = transport.value()
        self.assertTrue(sent.startswith(b"  V2IDENTIFY\n"))
        ready: list[Any] = []
        proto.ready.addCallback(ready.append)
        proto.dataReceived(frame(0, json.dumps({"max_rdy_count": 2500}).encode()))
        self.assertEqual(ready, [proto])
        self.assertEqual(proto.settings["max_rdy_count"], 2500)

    def test_heartbeat_answered(self) -> None:
        """A heartbeat is answered with NOP and not reported; other frames are."""
        proto, transport, rec, _ = self.connect()
        proto.dataReceived(frame(0, b"{}"))
        transport.clear()
        proto.dataReceived(frame(0, b"_heartbeat_") + frame(0, b"OK") + frame(1, b"E_FIN_FAILED x"))
        self.assertEqual(transport.value(), b"NOP\n")
        self.assertEqual(rec.events, [("response", b"OK"), ("error", b"E_FIN_FAILED x")])

    def test_writes_of_one_read_go_out_together(self) -> None:
        """What the delegate writes while the frames of one read are handed to it is one write,
        sent after them (a FIN per message of a read: one write, not one each)."""
        writes: list[bytes] = []

        class Answering(Recorder):
            def on_message(self, conn: Any, data: bytes) -> None:
                super().on_message(conn, data)
                conn.write(fin(data[10:26]))
                writes.append(transport.value())  # nothing sent yet

        clock = Clock()
        proto = NSQClientProtocol("127.0.0.1:4150", Config(), Answering(), clock)
        transport = StringTransport()
        proto.makeConnection(transport)
        proto.dataReceived(frame(0, b"{}"))
        transport.clear()
        msg = struct.pack(">qH", 1, 1)
        proto.dataReceived(frame(2, msg + b"A" * 16 + b"x") + frame(0, b"_heartbeat_") + frame(2, msg + b"B" * 16))
        self.assertEqual(writes, [b"", b""])
        self.assertEqual(transport.value(), b"FIN " + b"A" * 16 + b"\nNOP\nFIN " + b"B" * 16 + b"\n")
        transport.clear()
        proto.write(b"NOP\n")  # outside a read: written at once
        self.assertEqual(transport.value(), b"NOP\n")

    def test_direct_sender(self) -> None:
        """On a plain TCP transport, a read's answers go to the socket at once when Twisted holds
        nothing unsent; behind what it holds otherwise; what the socket does not take is queued
        after what it took. Other transports get none."""
        import socket

        from nsqtw.net.eager import direct_sender
        from tests.helpers import PlainTCP

        a, b = socket.socketpair()
        self.addCleanup(a.close)
        self.addCleanup(b.close)
        a.setblocking(False)
        t = PlainTCP(a)
        send = direct_sender(t)
        assert send is not None
        send(b"FIN x\n")
        self.assertEqual((b.recv(100), t.queued), (b"FIN x\n", []))
        t._tempDataLen = len(b"queued")
        send(b"NOP\n")
        self.assertEqual(t.queued, [b"NOP\n"])
        t._tempDataLen = 0
        t.queued.clear()
        big = b"m" * (16 << 20)  # more than the socket takes at once
        send(big)
        self.assertEqual(len(t.queued), 1)
        self.assertTrue(0 < len(t.queued[0]) < len(big) and big.endswith(t.queued[0]))
        self.assertIsNone(direct_sender(StringTransport()))
        t.TLS = True
        self.assertIsNone(direct_sender(t))

    def test_snappy_switch_in_the_same_read(self) -> None:
        """Bytes after the IDENTIFY answer in the same read are snappy already, and are decoded."""
        proto, transport, rec, _ = self.connect(snappy=True)
        server = SnappyCodec()
        answer = frame(0, json.dumps({"snappy": True}).encode())
        ready: list[Any] = []
        proto.ready.addCallback(ready.append)
        proto.dataReceived(answer + server.encode(frame(0, b"OK") + frame(0, b"CLOSE_WAIT")))
        self.assertEqual(ready, [proto])
        self.assertEqual(rec.events, [("response", b"CLOSE_WAIT")])
        transport.clear()
        proto.write(b"NOP\n")
        decoder = SnappyCodec()
        decoder.feed(transport.value())
        self.assertEqual(decoder.read(), b"NOP\n")

    def test_identify_error_fails_ready(self) -> None:
        """An error frame during the handshake fails ``ready`` with nsqd's code and drops the connection."""
        proto, transport, rec, _ = self.connect()
        failures: list[Any] = []
        proto.ready.addErrback(failures.append)
        proto.dataReceived(frame(1, b"E_BAD_BODY IDENTIFY invalid"))
        self.assertIsInstance(failures[0].value, NSQErrorResponse)
        self.assertEqual(failures[0].value.code, "E_BAD_BODY")

    def test_read_timeout(self) -> None:
        """A connection silent for read_timeout is dropped."""
        proto, transport, rec, clock = self.connect(read_timeout=5.0)
        proto.ready.addErrback(lambda f: None)
        clock.advance(3)
        proto.dataReceived(frame(0, b"_heartbeat_"))
        clock.advance(3)
        self.assertFalse(transport.disconnecting)
        clock.advance(2.5)
        self.assertTrue(proto.closed)

    def test_delegates_provide_the_interface(self) -> None:
        """Producer and Consumer provide IConnectionDelegate."""
        clock = Clock()
        self.assertTrue(verifyObject(IConnectionDelegate, Producer("127.0.0.1:4150", reactor=clock)))
        self.assertTrue(verifyObject(IConnectionDelegate, Consumer("t", "c", lambda m: None, reactor=clock,
                                                                   nsqd_tcp_addresses=["127.0.0.1:4150"])))


class ConsumerAnswerTests(SynchronousTestCase):
    """What a consumer answers for each kind of handler, on one subscribed connection without sockets."""

    def subscribed(self, handler: Any) -> tuple[Consumer, StringTransport]:
        clock = Clock()
        consumer = Consumer("t", "c", handler, Config(max_in_flight=10), nsqd_tcp_addresses=["x:1"],
                            reactor=clock)
        proto = NSQClientProtocol("x:1", consumer.config, consumer, clock)
        transport = StringTransport()
        proto.makeConnection(transport)
        proto.dataReceived(frame(0, b"{}"))
        consumer._subscribe(proto)
        proto.dataReceived(frame(0, b"OK"))
        transport.clear()
        return consumer, transport

    @staticmethod
    def messages(*ids: bytes) -> bytes:
        return b"".join(frame(2, struct.pack(">qH", 1, 1) + i * 16 + b"body") for i in ids)

    def test_answers(self) -> None:
        """Returning None FINs (once, counted); finishing itself is not FINed twice; disabled
        auto-response and a later answer; a return value that is not awaitable FINs too; raising REQs."""
        later: list[Message] = []

        def handler(msg: Message) -> Any:
            if msg.id == b"B" * 16:
                msg.finish()
            elif msg.id == b"C" * 16:
                msg.disable_auto_response()
                later.append(msg)
            elif msg.id == b"D" * 16:
                return 42
            elif msg.id == b"E" * 16:
                raise ValueError("no")
            return None

        consumer, transport = self.subscribed(handler)
        [consumer_conn] = consumer._conns.values()
        consumer_conn.proto.dataReceived(self.messages(b"A", b"B", b"C", b"D", b"E"))
        self.flushLoggedErrors(ValueError)
        sent = transport.value()
        self.assertEqual([sent.count(b"FIN " + i * 16) for i in (b"A", b"B", b"C", b"D")], [1, 1, 0, 1])
        self.assertIn(b"REQ " + b"E" * 16, sent)
        self.assertEqual(sorted(consumer_conn.held), [b"C" * 16])
        later[0].finish()
        self.assertIn(b"FIN " + b"C" * 16, transport.value())
        self.assertEqual((consumer.stats.messages_received, consumer.stats.messages_finished,
                          consumer.stats.messages_requeued), (5, 4, 1))


class FakeEndpoint:
    """Records each connect; the test fires it with a connection over a StringTransport."""

    def __init__(self) -> None:
        self.attempts: list[tuple[Any, Deferred[Any]]] = []

    def connect(self, factory: Any) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.attempts.append((factory, d))
        return d


class DialerTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.endpoint = FakeEndpoint()
        self.patch(conn_module, "client_endpoint", lambda reactor, address, timeout: self.endpoint)
        self.clock = Clock()
        self.ready: list[NSQClientProtocol] = []
        self.failed: list[str] = []
        self.dialer = Dialer(self.clock, "127.0.0.1:4150", Config(lookupd_poll_interval=60.0), Recorder(),
                             self.ready.append, lambda f: self.failed.append(f.getErrorMessage()))
        self.dialer.start()

    def answer(self, data: bytes) -> NSQClientProtocol:
        """The latest attempt connects, and the server answers IDENTIFY with ``data``."""
        factory, d = self.endpoint.attempts[-1]
        proxy = factory.buildProtocol(None)
        transport = StringTransport()
        proxy.makeConnection(transport)
        d.callback(proxy)
        proto: NSQClientProtocol = proxy._protocol
        proto.dataReceived(data)
        if transport.disconnecting or proto.closed:
            proxy.connectionLost(Failure(ConnectionDone()))
        return proto

    def next_attempt_after(self) -> float:
        """Seconds until the next connect (advancing the clock in 0.1 s steps)."""
        before, waited = len(self.endpoint.attempts), 0.0
        while len(self.endpoint.attempts) == before:
            self.clock.advance(0.1)
            waited += 0.1
            self.assertLess(waited, 120)
        return waited

    def test_failed_handshakes_back_off(self) -> None:
        """A server that breaks the handshake is one failed attempt each time, reported once, no
        exception; the delay grows (2 s, 4 s ... plus up to 1 s of jitter) until a handshake succeeds."""
        first: list[Any] = []
        self.dialer.first_attempt().addErrback(first.append)
        self.answer(frame(0, b"{not json"))
        self.assertEqual(len(first), 1)
        self.assertEqual(self.failed, ["(127.0.0.1:4150) bad IDENTIFY answer b'{not json'"])
        self.assertTrue(2 <= self.next_attempt_after() <= 3.1)
        self.answer(struct.pack(">i", -5) + b"xxxx")
        self.assertEqual(self.failed[-1], "(127.0.0.1:4150) invalid frame size -5")
        self.assertTrue(4 <= self.next_attempt_after() <= 5.1)
        self.endpoint.attempts[-1][1].errback(Failure(ConnectionRefusedError()))
        self.assertEqual(len(self.failed), 3)
        self.assertTrue(8 <= self.next_attempt_after() <= 9.1)
        proto = self.answer(frame(0, b"OK"))
        self.assertEqual(self.ready, [proto])
        self.assertEqual(self.dialer.failures, 0)
