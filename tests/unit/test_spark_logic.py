"""The Spark connector's pure logic: options, offsets, MPUB chunking, frames, Arrow rows."""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
from twisted.trial.unittest import SynchronousTestCase

from nsqtw.core.message import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, Message, frame
from nsqtw.protocol.wire import V2Parser, encode_mpub, split_frames
from nsqtw.spark.blocks import (
    ARROW_SCHEMA,
    Block,
    commands,
    decode_ids,
    encode_ids,
    mpub_body,
    mpub_chunks,
    scan_frames,
    to_record_batch,
)
from nsqtw.spark.offsets import Offset
from nsqtw.spark.options import DEFAULT_MAX_IN_FLIGHT, NSQOptionError, ReaderOptions, WriterOptions, lookupd_url

BASE = {"nsqd_tcp_addresses": "127.0.0.1:4150", "topic": "events", "channel": "spark"}


class ReaderOptionsTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        """Only the address, topic and channel are needed; the rest has defaults."""
        o = ReaderOptions.parse(BASE)
        self.assertEqual(o.endpoints.nsqd_tcp_addresses, ("127.0.0.1:4150",))
        self.assertEqual((o.topic, o.channel), ("events", "spark"))
        self.assertIsNone(o.max_messages_per_batch)
        self.assertEqual(o.max_in_flight, DEFAULT_MAX_IN_FLIGHT)
        self.assertEqual(o.connections_per_nsqd, 0)  # as many as max_in_flight needs
        self.assertGreaterEqual(o.num_partitions, 1)
        self.assertEqual(o.endpoints.connect.msg_timeout_ms, 0)

    def test_values(self) -> None:
        """Numbers and lists are parsed; msg_timeout_ms goes into IDENTIFY."""
        o = ReaderOptions.parse({**BASE, "nsqd_tcp_addresses": "a:1, [::1]:2",
                                 "max_messages_per_batch": "50", "max_in_flight": "7",
                                 "msg_timeout_ms": "1500"})
        self.assertEqual(o.endpoints.nsqd_tcp_addresses, ("a:1", "[::1]:2"))
        self.assertEqual((o.max_messages_per_batch, o.max_in_flight), (50, 7))
        self.assertIn(b'"msg_timeout": 1500', o.endpoints.connect.identify_body())

    def assertOptionError(self, options: dict[str, str], text: str) -> None:
        e = self.assertRaises(NSQOptionError, ReaderOptions.parse, options)
        self.assertIn(text, str(e))

    def test_errors(self) -> None:
        """Missing and bad options fail with a message naming the option."""
        no_topic = {k: v for k, v in BASE.items() if k != "topic"}
        self.assertOptionError(no_topic, "option topic is required")
        no_channel = {k: v for k, v in BASE.items() if k != "channel"}
        self.assertOptionError(no_channel, "option channel is required")
        self.assertOptionError({**BASE, "topic": "bad topic"}, "option topic: 'bad topic' is not a valid")
        self.assertOptionError({**BASE, "channel": "x" * 65}, "option channel:")
        self.assertOptionError({"topic": "t", "channel": "c"}, "set exactly one of the options")
        self.assertOptionError({**BASE, "lookupd_http_addresses": "h:4161"}, "set exactly one")
        self.assertOptionError({**BASE, "nsqd_tcp_addresses": "localhost"}, "invalid address 'localhost'")
        self.assertOptionError({**BASE, "nsqd_tcp_addresses": "h:99999"}, "invalid address")
        self.assertOptionError({**BASE, "max_in_flight": "lots"}, "option max_in_flight: 'lots' is not an integer")
        self.assertOptionError({**BASE, "max_in_flight": "0"}, "below the minimum 1")
        self.assertOptionError({**BASE, "msg_timeout_ms": "10"}, "option msg_timeout_ms: 10 is below")
        self.assertOptionError({**BASE, "tls": "maybe"}, "option tls: 'maybe' is not true or false")
        self.assertOptionError({**BASE, "tls_ca_file": "/ca.pem"}, "need tls=true")
        self.assertOptionError({**BASE, "tls": "true", "tls_cert_file": "/c.pem"}, "go together")

    def test_lookupd(self) -> None:
        """lookupd addresses may be host:port or URLs."""
        o = ReaderOptions.parse({"lookupd_http_addresses": "h:4161,http://g:4161/", "topic": "t",
                                 "channel": "c"})
        self.assertEqual(o.endpoints.lookupd_http_addresses, ("h:4161", "http://g:4161/"))
        self.assertEqual(lookupd_url("h:4161"), "http://h:4161")
        self.assertEqual(lookupd_url("https://g:4161/"), "https://g:4161")
        self.assertRaises(ValueError, lookupd_url, "http://nope")


class WriterOptionsTests(SynchronousTestCase):
    def test_topic_optional(self) -> None:
        """The writer's topic may come from a column instead; nsqd's size defaults apply."""
        o = WriterOptions.parse({"nsqd_tcp_addresses": "h:1"})
        self.assertEqual(o.topic, "")
        self.assertEqual((o.max_msg_size, o.max_body_size), (1048576, 5242880))

    def test_sizes(self) -> None:
        """max_body_size must hold at least one max_msg_size message."""
        e = self.assertRaises(NSQOptionError, WriterOptions.parse,
                              {"nsqd_tcp_addresses": "h:1", "max_msg_size": "100", "max_body_size": "100"})
        self.assertIn("must exceed max_msg_size", str(e))


class OffsetTests(SynchronousTestCase):
    def test_round_trip(self) -> None:
        """An offset survives JSON and yields its message ids per nsqd."""
        ids = np.array([b"0123456789abcdef", b"fedcba9876543210"], "S16")
        o = Offset(7, {"h:1": encode_ids(ids)})
        back = Offset.from_json(o.to_json())
        self.assertEqual(back, o)
        self.assertEqual(back.id_arrays()["h:1"].tolist(), sorted(ids.tolist()))
        self.assertEqual(back.count(), 2)
        self.assertEqual(Offset.from_json({"seq": 3}), Offset(3))
        self.assertEqual(Offset(3).to_json(), {"seq": 3, "ids": {}})  # no empty extra fields

    def test_unfinished_and_missed_round_trip(self) -> None:
        """The ids an offset lists as unfinished (skip on sight) and missed (never skip) survive JSON."""
        a = encode_ids(np.array([b"0000000000000001"], "S16"))
        b = encode_ids(np.array([b"0000000000000002"], "S16"))
        o = Offset(9, {"h:1": a}, unfinished={"h:2": a}, missed={"h:1": b})
        data = o.to_json()
        self.assertEqual(set(data), {"seq", "ids", "unfinished", "missed"})
        back = Offset.from_json(data)
        self.assertEqual(back, o)
        self.assertEqual(back.missed_arrays()["h:1"].tolist(), [b"0000000000000002"])
        self.assertEqual(back.unfinished_arrays()["h:2"].tolist(), [b"0000000000000001"])

    def test_older_form(self) -> None:
        """Offsets written by earlier versions (ids simply concatenated) still read."""
        o = Offset(7, {"h:1": "0123456789abcdef" + "fedcba9876543210"})
        self.assertEqual(o.id_arrays()["h:1"].tolist(), [b"0123456789abcdef", b"fedcba9876543210"])

    def test_bad(self) -> None:
        """Something that is not our offset is refused clearly."""
        for bad in ({}, {"seq": "x"}, [], None, {"seq": 1, "ids": 5}, {"seq": 1, "missed": 5}):
            self.assertRaises(ValueError, Offset.from_json, bad)
        for garbled in ("x:!!!", "z:AAAA", "0123"):
            self.assertRaises(ValueError, decode_ids, garbled)


class IdEncodingTests(SynchronousTestCase):
    def test_nsqd_ids_are_compact(self) -> None:
        """50,000 nsqd-style ids (hex, increasing) take a few bytes each at most, and come back sorted."""
        values = (np.uint64(0x0600000000000000) + np.arange(50000, dtype=np.uint64) * np.uint64(3)
                  + (np.arange(50000, dtype=np.uint64) // np.uint64(4096)) * np.uint64(1 << 22))
        ids = np.array([b"%016x" % v for v in values.tolist()], "S16")
        rng = np.random.default_rng(1)
        shuffled = ids[rng.permutation(len(ids))]
        text = encode_ids(shuffled)
        self.assertTrue(text.startswith("x:"))
        self.assertLess(len(text), 50000)
        self.assertEqual(decode_ids(text).tolist(), ids.tolist())

    def test_other_ids(self) -> None:
        """Ids that are not lowercase hex (another server's) round-trip too."""
        ids = np.array([b"ABCDEFGHIJKLMNOP", b"0123456789ABCDEF", b"zzzzzzzzzzzzzzzz"], "S16")
        text = encode_ids(ids)
        self.assertTrue(text.startswith("z:"))
        self.assertEqual(decode_ids(text).tolist(), sorted(ids.tolist()))
        self.assertEqual(encode_ids(ids[:0]), "")


class Conn:
    """Stands in for a connection: a block asks for its address, the consumer also FINs on it."""

    def __init__(self, address: str = "h:1") -> None:
        self.address = address
        self.closed = False
        self.sent: list[bytes] = []

    def send(self, data: bytes) -> None:
        self.sent.append(data)


def messages(n: int, size: int = 0) -> list[Message]:
    return [Message(b"%016x" % (1000 + i) + b"b%d-" % i + b"x" * (size or i % 50), 1_700_000_000_000_000_000 + i,
                    1 + i % 3) for i in range(n)]


class BlockTests(SynchronousTestCase):
    def test_scan_any_chunking(self) -> None:
        """Message frames are found and other frames returned whole however the bytes arrive."""
        for msgs in (messages(30), messages(40, size=20)):  # varied sizes; equal sizes (read as runs)
            stream = (frame(FRAME_TYPE_RESPONSE, b"_heartbeat_") + b"".join(m.frame() for m in msgs[:20])
                      + frame(FRAME_TYPE_ERROR, b"E_FIN_FAILED x") + b"".join(m.frame() for m in msgs[20:]))
            for size in (1, 7, 100, 4096, len(stream)):
                buf = bytearray()
                got: list[tuple[bytes, bytes, int, int]] = []
                others: list[tuple[int, bytes]] = []
                for i in range(0, len(stream), size):
                    buf += stream[i:i + size]
                    starts, more, used = scan_frames(buf)
                    if starts:
                        got.extend(Block.parse(Conn(), bytes(buf[:used]), starts, 0.0).rows())
                    others.extend(more)
                    del buf[:used]
                self.assertEqual(got, [(m.id, m.body, m.timestamp, m.attempts) for m in msgs])
                self.assertEqual(others, [(FRAME_TYPE_RESPONSE, b"_heartbeat_"),
                                          (FRAME_TYPE_ERROR, b"E_FIN_FAILED x")])
                self.assertEqual(buf, b"")

    def test_slice_select_and_commands(self) -> None:
        """Slices keep numbering; FIN/TOUCH/REQ for a block are the commands nsqd parses."""
        msgs = messages(10)
        data = b"".join(m.frame() for m in msgs)
        b = Block.parse(Conn(), data, scan_frames(data)[0], 5.0)
        b.first_seq = 100
        tail = b.slice(4, 10)
        self.assertEqual((tail.first_seq, tail.last_seq, len(tail)), (104, 109, 6))
        self.assertEqual([r[1] for r in tail.rows()], [m.body for m in msgs[4:]])
        odd = b.select(np.arange(10) % 2 == 1)
        self.assertEqual([r[0] for r in odd.rows()], [m.id for m in msgs[1::2]])
        self.assertEqual(commands(b"FIN", odd.ids), b"".join(b"FIN %s\n" % m.id for m in msgs[1::2]))
        self.assertEqual(commands(b"REQ", b.ids[:1], b" 0\n"), b"REQ %s 0\n" % msgs[0].id)
        parser = V2Parser(max_msg_size=1024, max_body_size=4096)
        parser.feed(b"  V2" + commands(b"TOUCH", b.ids))
        self.assertEqual([c.args[0] for c in iter(parser.next_command, None)],  # type: ignore[union-attr]
                         [m.id for m in msgs])

    def test_record_batch_matches_spark(self) -> None:
        """The Arrow rows the reader emits match what Spark expects for the schema."""
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType, TimestampType

        from nsqtw.spark.source import SCHEMA

        spark_schema = StructType([
            StructField("id", StringType()), StructField("body", BinaryType()),
            StructField("timestamp", TimestampType()), StructField("attempts", IntegerType()),
            StructField("topic", StringType()), StructField("channel", StringType()),
            StructField("nsqd_address", StringType())])
        # the DDL string the source declares is this schema...
        ddl = ",".join(":".join(part.strip().lower().split()) for part in SCHEMA.split(","))
        self.assertEqual(spark_schema.simpleString(), f"struct<{ddl}>")
        # ...and Spark's Arrow form of it is what read() produces
        expected = to_arrow_schema(spark_schema, timezone="UTC")
        self.assertTrue(ARROW_SCHEMA.equals(expected), (ARROW_SCHEMA, expected))
        msgs = [Message(b"0123456789abcdef" + b"x", 1_700_000_000_123_456_789, 3)] + messages(4)
        data = b"".join(m.frame() for m in msgs)
        b = Block.parse(Conn(), data, scan_frames(data)[0], 0.0)
        rb = to_record_batch([b.slice(0, 2), b.slice(2, 5)], "t", "c")
        rb.validate(full=True)
        self.assertTrue(rb.schema.equals(ARROW_SCHEMA))
        row = rb.to_pylist()[0]
        self.assertEqual(row["id"], "0123456789abcdef")
        self.assertEqual(row["body"], b"x")
        self.assertEqual(row["attempts"], 3)
        self.assertEqual(row["timestamp"].timestamp(), 1_700_000_000.123456)
        self.assertEqual((row["topic"], row["channel"], row["nsqd_address"]), ("t", "c", "h:1"))
        self.assertEqual(rb.column("body").to_pylist(), [m.body for m in msgs])
        self.assertEqual(to_record_batch([], "t", "c").num_rows, 0)


class MpubTests(SynchronousTestCase):
    def runs(self, bodies: list[bytes], max_msg_size: int, max_body_size: int) -> list[list[bytes]]:
        values = pa.array(bodies, pa.binary())
        return [values.slice(a, b - a).to_pylist() for a, b in mpub_chunks(values, max_msg_size, max_body_size)]

    def test_fits_body_size(self) -> None:
        """Every MPUB body stays within max_body_size and nsqd's parser accepts it."""
        bodies = [bytes([65 + i % 26]) * (1 + i % 40) for i in range(500)]
        values = pa.array(bodies, pa.binary()).slice(3)  # a slice, as Spark's batches may be
        got = [(a, b) for a, b in mpub_chunks(values, 64, 300)]
        self.assertGreater(len(got), 10)
        self.assertEqual([x for a, b in got for x in values.slice(a, b - a).to_pylist()], bodies[3:])
        for a, b in got:
            chunk = values.slice(a, b - a)
            body = mpub_body(chunk)
            self.assertEqual(encode_mpub(b"t", chunk.to_pylist()), b"MPUB t\n" + struct.pack(">i", len(body)) + body)
            self.assertLessEqual(len(body), 300)
            parser = V2Parser(max_msg_size=64, max_body_size=300)
            parser.feed(b"  V2MPUB t\n" + struct.pack(">i", len(body)) + body)
            self.assertEqual(parser.next_command().messages, chunk.to_pylist())  # type: ignore[union-attr]

    def test_exact_fit(self) -> None:
        """A chunk may fill max_body_size exactly: 4 + 2 * (4 + 10) = 32."""
        self.assertEqual([len(c) for c in self.runs([b"x" * 10] * 4, 10, 32)], [2, 2])

    def test_rejects(self) -> None:
        """Empty values and values over max_msg_size are refused before anything is sent."""
        e = self.assertRaises(ValueError, self.runs, [b"a", b""], 10, 100)
        self.assertIn("row 1: empty value", str(e))
        e = self.assertRaises(ValueError, self.runs, [b"a" * 11], 10, 100)
        self.assertIn("over max_msg_size (10)", str(e))

    def test_large_binary(self) -> None:
        """64-bit offsets (Spark's large variable-width types) work the same."""
        values = pa.array([b"ab", b"c"], pa.large_binary())
        self.assertEqual(mpub_body(values), encode_mpub(b"t", [b"ab", b"c"])[len(b"MPUB t\n") + 4:])


class SplitFramesTests(SynchronousTestCase):
    def test_any_chunking(self) -> None:
        """Frames come out whole however the bytes arrive."""
        msg = Message(b"0123456789abcdef" + b"body", 123, 2)
        stream = frame(FRAME_TYPE_RESPONSE, b"_heartbeat_") + msg.frame() + frame(FRAME_TYPE_RESPONSE, b"OK")
        for size in (1, 3, 7, len(stream)):
            buf = bytearray()
            out = []
            for i in range(0, len(stream), size):
                buf += stream[i:i + size]
                out.extend(split_frames(buf))
            self.assertEqual(out, [(FRAME_TYPE_RESPONSE, b"_heartbeat_"), (FRAME_TYPE_MESSAGE, msg.encode()),
                                   (FRAME_TYPE_RESPONSE, b"OK")])
            self.assertEqual(buf, b"")

    def test_bad_size(self) -> None:
        """A frame size too small to hold its type is an error, not a loop."""
        self.assertRaises(ValueError, split_frames, bytearray(struct.pack(">ii", 2, 0)))


class PartitionTests(SynchronousTestCase):
    def reader(self, blocks: list[Block], num_partitions: int) -> object:
        from nsqtw.spark.source import NSQStreamReader

        class Stub:
            def messages(self, start: Offset, end: Offset) -> list[Block]:
                return blocks

        r = NSQStreamReader(ReaderOptions.parse({**BASE, "num_partitions": str(num_partitions)}))
        r._consumer = Stub()  # type: ignore[assignment]
        return r

    def test_sized_to_parallelism(self) -> None:
        """A batch becomes num_partitions slices (none under 1000 rows) that read back to its rows."""
        msgs = messages(5000)
        data = b"".join(m.frame() for m in msgs)
        block = Block.parse(Conn(), data, scan_frames(data)[0], 0.0)
        start, end = Offset(0).to_json(), Offset(5000).to_json()
        for num_partitions, expected in ((3, 3), (8, 5), (1, 1)):
            r = self.reader([block.slice(0, 2000), block.slice(2000, 5000)], num_partitions)
            parts = r.partitions(start, end)  # type: ignore[attr-defined]
            self.assertEqual(len(parts), expected)
            rows = [row for p in parts for rb in r.read(p) for row in rb.column("body").to_pylist()]  # type: ignore[attr-defined]
            self.assertEqual(rows, [m.body for m in msgs])
        self.assertEqual(self.reader([], 4).partitions(start, end), [])  # type: ignore[attr-defined]


class PlanWaitTests(SynchronousTestCase):
    """When a plan waits for nsqd to refill the RDY slots its FINs freed.

    The consumer's condition wait is replaced by a clock step, so a wait
    shows as time passing and nothing here sleeps or opens a socket.
    """

    def setUp(self) -> None:
        from nsqtw.spark.consumer import Consumer

        self.now = 100.0
        self.waits: list[float] = []
        self.consumer = Consumer(ReaderOptions.parse(BASE), discover=lambda: set(), clock=lambda: self.now)
        self.consumer._cond.wait = self._wait  # type: ignore[method-assign]
        self.consumer._base = 0

    def _wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        self.now += timeout or 0.0
        return False

    def block(self, conn: Conn, first: int, n: int) -> Block:
        ids = np.array([b"%016x" % (first + i) for i in range(n)], "S16")
        return Block(conn, ids, np.arange(n, dtype=np.int64), np.ones(n, np.int32),
                     pa.array([b"m"] * n, pa.binary()), self.now, first)

    def batch_done(self, planned: Conn, waiting: Conn) -> Offset:
        """A committed batch of 10 on ``planned``; 5 more arrived on ``waiting`` while it ran."""
        c = self.consumer
        c._rdy_sent = {planned: 50, waiting: 50}  # type: ignore[dict-item]
        c._planned.append(self.block(planned, 1, 10))
        c._last_seq = 10
        c._pending.append(self.block(waiting, 100, 5))
        c._arrived[waiting] = c._last_arrival = self.now - 0.5  # type: ignore[index]
        return Offset(10)

    def test_messages_waiting_from_the_freed_nsqd_are_taken_at_once(self) -> None:
        """The FINed connection's nsqd already has messages here: the plan takes them without
        waiting for that connection's refill."""
        a1, a2 = Conn("a:1"), Conn("a:1")
        end = self.consumer.plan(self.batch_done(a1, a2), None)
        self.assertEqual(self.waits, [])
        self.assertEqual(end.seq, 15)
        self.assertEqual(len(a1.sent), 1)
        self.assertTrue(a1.sent[0].startswith(b"FIN "))

    def test_a_freed_nsqd_with_nothing_here_is_waited_for(self) -> None:
        """Another nsqd's messages are waiting, but the one whose messages were FINed has nothing
        here yet: the plan waits for its refill, so the batch takes from both."""
        b, a = Conn("b:1"), Conn("a:1")
        end = self.consumer.plan(self.batch_done(b, a), None)
        self.assertGreater(sum(self.waits), 0)
        self.assertEqual(end.seq, 15)

    def test_a_refill_that_came_ends_the_wait(self) -> None:
        """The freed nsqd delivering after the FIN is enough: no wait."""
        b, a = Conn("b:1"), Conn("a:1")
        start = self.batch_done(b, a)
        fin_at = self.now
        self.consumer._arrived[b] = fin_at + 0.001  # type: ignore[index]
        self.consumer.plan(start, None)
        self.assertEqual(self.waits, [])
