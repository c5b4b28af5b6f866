"""nsqlookupd's V1 protocol and registration rules in memory (StringTransport, task.Clock)."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.errors import NSQError
from nsqtw.lookupd.db import GO_ZERO_TIME_NS, PeerInfo, Registration, RegistrationDB, active
from nsqtw.lookupd.lookupd import NSQLookupd
from nsqtw.lookupd.options import defaults, parse_args
from nsqtw.lookupd.protocol import LookupFactory, decode_peer_info
from nsqtw.lookupd.wire import Body, Line, LineTooLong, ResponseReader, V1Parser, identify
from tests.helpers import EPOCH, make_lookupd, reference

REF_TCP = reference("nsqlookupd-1.3.0-responses.json")["tcp_v1"]
CLOSED = "<connection closed>"
IDENTIFY_BODY = (b'{"broadcast_address": "127.0.0.1", "hostname": "refhost", "tcp_port": 5150,'
                 b' "http_port": 5151, "version": "1.3.0"}')


class Conn:
    """One V1 connection to the lookupd over a StringTransport."""

    def __init__(self, lookupd: NSQLookupd, port: int = 50000, magic: bool = True) -> None:
        self.proto = LookupFactory(lookupd).buildProtocol(None)
        self.transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", port))
        self.proto.makeConnection(self.transport)
        if magic:
            self.proto.dataReceived(b"  V1")

    def send(self, data: bytes) -> bytes:
        self.proto.dataReceived(data)
        out = self.transport.value()
        self.transport.clear()
        return out

    @property
    def closed(self) -> bool:
        return self.transport.disconnecting

    def close(self) -> None:
        self.proto.connectionLost(None)  # type: ignore[arg-type]


def frame(text: bytes) -> bytes:
    return struct.pack(">i", len(text)) + text


def identified(lookupd: NSQLookupd, port: int = 50000, **fields: Any) -> Conn:
    info = {"broadcast_address": "10.0.0.1", "hostname": "h", "tcp_port": 4150,
            "http_port": 4151, "version": "1.3.0", **fields}
    conn = Conn(lookupd, port)
    reply = conn.send(identify(json.dumps(info).encode()))
    assert reply.startswith(struct.pack(">i", len(reply) - 4) + b"{"), reply
    return conn


class ReferenceReplayTests(SynchronousTestCase):
    def test_tcp_answers_byte_for_byte(self) -> None:
        """Every recorded V1 exchange gets Go nsqlookupd's exact bytes.

        The recording used a new connection after each close and for each
        first IDENTIFY (the note "IDENTIFY twice" reuses the connection).
        """
        lookupd, _ = make_lookupd()
        conn = Conn(lookupd)
        for case in REF_TCP:
            if case["note"] == "IDENTIFY" and conn.proto.peer is not None:
                conn.close()
                conn = Conn(lookupd)
            sent = case["sent"].encode("latin-1")
            expected = case["received"]
            closes = expected.endswith(CLOSED)
            want = expected.removesuffix(CLOSED).encode("latin-1")
            self.assertEqual(conn.send(sent), want, case["note"])
            self.assertEqual(conn.closed, closes, case["note"])
            if closes:
                conn.close()
                conn = Conn(lookupd)


class ProtocolTests(SynchronousTestCase):
    def setUp(self) -> None:
        self.lookupd, self.clock = make_lookupd()
        self.db = self.lookupd.db

    def test_bad_magic(self) -> None:
        """A connection that does not open with "  V1" gets E_BAD_PROTOCOL and is closed."""
        conn = Conn(self.lookupd, magic=False)
        self.assertEqual(conn.send(b"  V2PING\n"), frame(b"E_BAD_PROTOCOL"))
        self.assertTrue(conn.closed)

    def test_magic_and_commands_in_any_chunking(self) -> None:
        """Magic, IDENTIFY and REGISTER split into single bytes give the same answers."""
        conn = Conn(self.lookupd, magic=False)
        data = b"  V1" + identify(IDENTIFY_BODY) + b"REGISTER t c\nPING\n"
        out = b"".join(conn.send(data[i:i + 1]) for i in range(len(data)))
        reader = ResponseReader(1 << 20)
        reader.feed(out)
        answers = [reader.next_response() for _ in range(3)]
        self.assertEqual(json.loads(answers[0] or b"")["tcp_port"], 38645)
        self.assertEqual(answers[1:], [b"OK", b"OK"])
        self.assertEqual(self.db.find_registrations("channel", "t", "*"),
                         [Registration("channel", "t", "c")])

    def test_ping_before_identify_is_ok(self) -> None:
        """PING needs no IDENTIFY (nsqlookupd answers OK and records nothing)."""
        conn = Conn(self.lookupd)
        self.assertEqual(conn.send(b"PING\n"), frame(b"OK"))
        self.assertEqual(self.db.registrations, {})

    def test_param_errors(self) -> None:
        """Each malformed REGISTER/UNREGISTER gets nsqlookupd's error text and a close."""
        cases = {
            b"REGISTER\n": b"E_INVALID REGISTER insufficient number of params",
            b"UNREGISTER \n": b"E_INVALID UNREGISTER insufficient number of params",
            b"REGISTER t bad!\n": b"E_BAD_CHANNEL REGISTER channel name 'bad!' is not valid",
            b"UNREGISTER " + b"x" * 65 + b"\n":
                b"E_BAD_TOPIC UNREGISTER topic name '" + b"x" * 65 + b"' is not valid",
            b"REGISTER  t\n": b"E_BAD_TOPIC REGISTER topic name '' is not valid",
            b"\n": b"E_INVALID invalid command ",
            b"ping\n": b"E_INVALID invalid command ping",
        }
        for sent, error in cases.items():
            conn = identified(self.lookupd)
            self.assertEqual(conn.send(sent), frame(error), sent)
            self.assertTrue(conn.closed, sent)
            conn.close()

    def test_trims_whitespace(self) -> None:
        """Lines are trimmed like Go's strings.TrimSpace (CRLF and tabs at the ends)."""
        conn = identified(self.lookupd)
        self.assertEqual(conn.send(b"\tREGISTER t c \r\n"), frame(b"OK"))
        self.assertIn(Registration("channel", "t", "c"), self.db.registrations)

    def test_identify_errors(self) -> None:
        """Bad IDENTIFY bodies get E_BAD_BODY with nsqlookupd's reason."""
        missing = b"E_BAD_BODY IDENTIFY missing fields"
        decode = b"E_BAD_BODY IDENTIFY failed to decode JSON body"
        cases = [
            (identify(b'{"broadcast_address":"a","tcp_port":1,"http_port":2}'), missing),
            (identify(b'{"broadcast_address":"a","tcp_port":0,"http_port":2,"version":"v"}'), missing),
            (identify(b"null"), missing),
            (identify(b"not json"), decode),
            (identify(b"[1]"), decode),
            (identify(b'{"broadcast_address":"a","tcp_port":"1","http_port":2,"version":"v"}'), decode),
            (identify(b'{"broadcast_address":"a","tcp_port":1.5,"http_port":2,"version":"v"}'), decode),
            (b"IDENTIFY\n" + struct.pack(">i", -1), b"E_BAD_BODY IDENTIFY failed to read body size"),
        ]
        for sent, error in cases:
            conn = Conn(self.lookupd)
            self.assertEqual(conn.send(sent), frame(error), sent)
            self.assertTrue(conn.closed)
            conn.close()
        self.assertEqual(self.db.registrations, {})

    def test_identify_json_like_go(self) -> None:
        """Keys match case-insensitively, unknown keys and nulls are ignored, remote address is ours."""
        peer = decode_peer_info("1.2.3.4:5", b'{"Broadcast_Address":"b","TCP_PORT":7,"x":[1],'
                                            b'"hostname":null,"remote_address":"spoofed"}')
        self.assertEqual((peer.broadcast_address, peer.tcp_port, peer.hostname, peer.id),
                         ("b", 7, "", "1.2.3.4:5"))
        conn = identified(self.lookupd, port=6001, remote_address="spoofed")
        self.assertIsNotNone(conn.proto.peer)
        self.assertEqual(conn.proto.peer.remote_address, "127.0.0.1:6001")  # type: ignore[union-attr]

    def test_long_line_hangs_up(self) -> None:
        """A line past 16 KiB closes the connection (nothing is buffered without bound)."""
        conn = Conn(self.lookupd)
        self.assertEqual(conn.send(b"x" * (17 * 1024)), b"")
        self.assertTrue(conn.closed)

    def test_register_unregister_and_disconnect(self) -> None:
        """REGISTER adds channel and topic; UNREGISTER removes the producer; a close removes all."""
        a = identified(self.lookupd, port=1)
        b = identified(self.lookupd, port=2, broadcast_address="10.0.0.2")
        a.send(b"REGISTER t c\n")
        b.send(b"REGISTER t\n")
        self.assertEqual(len(self.db.find_producers("topic", "t", "")), 2)
        self.assertEqual(len(self.db.find_producers("channel", "t", "c")), 1)
        a.send(b"UNREGISTER t c\n")
        self.assertEqual(self.db.find_producers("channel", "t", "c"), [])
        # a durable channel's registration stays, as in nsqlookupd
        self.assertEqual(self.db.find_registrations("channel", "t", "*"),
                         [Registration("channel", "t", "c")])
        b.close()
        self.assertEqual([p.peer.id for p in self.db.find_producers("topic", "t", "")],
                         ["127.0.0.1:1"])
        self.assertEqual(self.db.find_registrations("topic", "*", ""),
                         [Registration("topic", "t", "")])
        a.close()
        self.assertEqual(self.db.find_producers("client", "", ""), [])

    def test_ephemeral_channel_removed_with_last_producer(self) -> None:
        """UNREGISTER of an ephemeral channel drops its registration once nobody produces it."""
        a = identified(self.lookupd, port=1)
        b = identified(self.lookupd, port=2)
        for conn in (a, b):
            conn.send(b"REGISTER t e#ephemeral\n")
        a.send(b"UNREGISTER t e#ephemeral\n")
        self.assertIn(Registration("channel", "t", "e#ephemeral"), self.db.registrations)
        b.send(b"UNREGISTER t e#ephemeral\n")
        self.assertNotIn(Registration("channel", "t", "e#ephemeral"), self.db.registrations)

    def test_topic_unregister_takes_channels(self) -> None:
        """UNREGISTER topic removes this node from the topic and its channels only."""
        a = identified(self.lookupd, port=1)
        b = identified(self.lookupd, port=2)
        a.send(b"REGISTER t c\n")
        b.send(b"REGISTER t c\n")
        self.assertEqual(a.send(b"UNREGISTER t\n"), frame(b"OK"))
        self.assertEqual([p.peer.id for p in self.db.find_producers("channel", "t", "c")],
                         ["127.0.0.1:2"])
        self.assertEqual([p.peer.id for p in self.db.find_producers("topic", "t", "")],
                         ["127.0.0.1:2"])

    def test_ping_keeps_producer_active(self) -> None:
        """Without a PING a producer leaves the active list after --inactive-producer-timeout."""
        lookupd, clock = make_lookupd(inactive_producer_timeout=60.0)
        conn = identified(lookupd)
        conn.send(b"REGISTER t\n")
        producers = lookupd.db.find_producers("topic", "t", "")
        clock.advance(59)
        self.assertEqual(len(lookupd.active(producers)), 1)
        self.assertEqual(conn.send(b"PING\n"), frame(b"OK"))
        clock.advance(59)
        self.assertEqual(len(lookupd.active(producers)), 1)
        clock.advance(2)
        self.assertEqual(lookupd.active(producers), [])
        # still registered: only filtered out, as in nsqlookupd
        self.assertEqual(len(lookupd.db.find_producers("topic", "t", "")), 1)


class DBTests(SynchronousTestCase):
    def test_tombstone_lifetime(self) -> None:
        """A tombstone hides a producer for the lifetime, then it is active again."""
        clock = Clock()
        clock.advance(EPOCH)
        lookupd = NSQLookupd(defaults("h"), clock, "h")
        conn = identified(lookupd)
        conn.send(b"REGISTER t\n")
        [producer] = lookupd.db.find_producers("topic", "t", "")
        self.assertEqual(producer.tombstoned_at, GO_ZERO_TIME_NS)
        lookupd.tombstone("t", "10.0.0.1:9999")  # another node: nothing happens
        self.assertFalse(producer.tombstoned)
        lookupd.tombstone("t", "10.0.0.1:4151")
        self.assertEqual(lookupd.active([producer]), [])
        clock.advance(44.9)
        conn.send(b"PING\n")
        self.assertEqual(lookupd.active([producer]), [])
        clock.advance(0.2)
        self.assertEqual(lookupd.active([producer]), [producer])

    def test_find_and_lookup(self) -> None:
        """Wildcards match any key or subkey; lookups by peer find every registration."""
        db = RegistrationDB(Clock())
        p = PeerInfo(id="x")
        self.assertTrue(db.add_producer(Registration("channel", "t", "c"), p))
        self.assertFalse(db.add_producer(Registration("channel", "t", "c"), p))
        db.add_producer(Registration("channel", "u", "c"), p)
        db.add_registration(Registration("topic", "t", ""))
        self.assertEqual(len(db.find_registrations("channel", "*", "c")), 2)
        self.assertEqual(db.find_registrations("channel", "t", "d"), [])
        self.assertEqual(len(db.lookup_registrations("x")), 2)
        self.assertEqual(db.remove_producer(Registration("channel", "t", "c"), "x"), (True, 0))
        self.assertEqual(db.remove_producer(Registration("nope", "", ""), "x"), (False, 0))
        self.assertEqual(active([], 0, 1.0, 1.0), [])


class WireTests(SynchronousTestCase):
    def test_parser_events(self) -> None:
        """Lines come out split; a body only when asked for, in any chunking."""
        data = b"PING\nIDENTIFY\n" + struct.pack(">i", 3) + b"abcREGISTER t c\n"
        for step in (1, 2, 5, len(data)):
            parser = V1Parser()
            events: list[Any] = []
            for i in range(0, len(data), step):
                parser.feed(data[i:i + step])
                while (ev := parser.next_event()) is not None:
                    events.append(ev)
                    if isinstance(ev, Line) and ev.params == ["IDENTIFY"]:
                        parser.expect_body()
            self.assertEqual(events, [Line(["PING"]), Line(["IDENTIFY"]), Body(b"abc"),
                                      Line(["REGISTER", "t", "c"])])

    def test_parser_limits(self) -> None:
        """Over-long lines and oversized bodies are refused before they are buffered."""
        parser = V1Parser()
        parser.feed(b"a" * (16 * 1024 + 1))
        self.assertRaises(LineTooLong, parser.next_event)
        parser = V1Parser()
        parser.expect_body()
        parser.feed(struct.pack(">i", (1 << 20) + 1))
        self.assertRaises(NSQError, parser.next_event)

    def test_response_reader(self) -> None:
        """Responses split on their size; a size past the limit is an error."""
        reader = ResponseReader(10)
        reader.feed(frame(b"OK")[:3])
        self.assertIsNone(reader.next_response())
        reader.feed(frame(b"OK")[3:] + frame(b"E_INVALID"))
        self.assertEqual([reader.next_response(), reader.next_response()], [b"OK", b"E_INVALID"])
        reader.feed(frame(b"x" * 11))
        self.assertRaises(ValueError, reader.next_response)


class OptionsTests(SynchronousTestCase):
    def test_nsqlookupd_flags(self) -> None:
        """nsqlookupd's flags, Go syntax and defaults; nsqd-only flags are refused."""
        from nsqtw._go.flags import OptionsError
        from nsqtw.lookupd.options import FLAGS

        self.assertEqual([f.name for f in FLAGS], [
            "config", "version", "log-level", "log-prefix", "verbose", "tcp-address",
            "http-address", "broadcast-address", "inactive-producer-timeout", "tombstone-lifetime"])
        opts = parse_args(["-tcp-address", "127.0.0.1:0", "--tombstone-lifetime=1m30s",
                           "-inactive-producer-timeout=10s"], hostname="h")
        self.assertEqual((opts.tcp_address, opts.http_address, opts.broadcast_address),
                         ("127.0.0.1:0", "0.0.0.0:4161", "h"))
        self.assertEqual((opts.tombstone_lifetime, opts.inactive_producer_timeout), (90.0, 10.0))
        self.assertEqual(defaults("h").tcp_address, "0.0.0.0:4160")
        with self.assertRaises(OptionsError) as cm:
            parse_args(["--mem-queue-size=1"])
        self.assertEqual(str(cm.exception), "flag provided but not defined: -mem-queue-size")
        with self.assertRaises(OptionsError) as cm:
            parse_args(["stray"])
        self.assertIn("nsqlookupd takes only flags", str(cm.exception))

    def test_config_file(self) -> None:
        """The TOML file uses nsqlookupd's keys; the command line wins."""
        # tempfile rather than mktemp(): mktemp leaves directories behind under pytest
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        path = os.path.join(tmp, "nsqlookupd.toml")
        with open(path, "w") as f:
            f.write('tcp_address = "127.0.0.1:1"\nhttp_address = "127.0.0.1:2"\n'
                    'tombstone_lifetime = "10s"\ninactive_producer_timeout = 5000\n'
                    'log_level = "WARN"\nmem_queue_size = 5\n')
        opts = parse_args([f"--config={path}", "--http-address=127.0.0.1:3"], hostname="h")
        self.assertEqual((opts.tcp_address, opts.http_address), ("127.0.0.1:1", "127.0.0.1:3"))
        self.assertEqual((opts.tombstone_lifetime, opts.inactive_producer_timeout, opts.log_level),
                         (10.0, 5.0, "warn"))
