"""The Spark connector's pure logic: options, offsets, MPUB chunking, frames, Arrow rows."""

from __future__ import annotations

import struct

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.core.message import FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, Message, frame
from nsqtw.protocol.wire import V2Parser, encode_mpub, split_frames
from nsqtw.spark.consumer import Offset
from nsqtw.spark.options import NSQOptionError, ReaderOptions, WriterOptions, lookupd_url
from nsqtw.spark.producer import NSQWriteError, chunks

BASE = {"nsqd_tcp_addresses": "127.0.0.1:4150", "topic": "events", "channel": "spark"}


class ReaderOptionsTests(SynchronousTestCase):
    def test_defaults(self) -> None:
        """Only the address, topic and channel are needed; the rest has defaults."""
        o = ReaderOptions.parse(BASE)
        self.assertEqual(o.endpoints.nsqd_tcp_addresses, ("127.0.0.1:4150",))
        self.assertEqual((o.topic, o.channel), ("events", "spark"))
        self.assertIsNone(o.max_messages_per_batch)
        self.assertEqual(o.max_in_flight, 1000)
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
        """An offset survives JSON and yields its (address, id) pairs."""
        o = Offset(7, {"h:1": "0123456789abcdef" + "fedcba9876543210"})
        back = Offset.from_json(o.to_json())
        self.assertEqual(back, o)
        self.assertEqual(back.id_set(), {("h:1", b"0123456789abcdef"), ("h:1", b"fedcba9876543210")})
        self.assertEqual(Offset.from_json({"seq": 3}), Offset(3))

    def test_bad(self) -> None:
        """Something that is not our offset is refused clearly."""
        for bad in ({}, {"seq": "x"}, [], None, {"seq": 1, "ids": 5}):
            self.assertRaises(ValueError, Offset.from_json, bad)


class ChunkTests(SynchronousTestCase):
    def test_fits_body_size(self) -> None:
        """Every MPUB body stays within max_body_size and nsqd's parser accepts it."""
        bodies = [bytes([65 + i % 26]) * (1 + i % 40) for i in range(500)]
        got = list(chunks(bodies, max_msg_size=64, max_body_size=300))
        self.assertEqual([b for c in got for b in c], bodies)
        self.assertGreater(len(got), 10)
        for c in got:
            cmd = encode_mpub(b"t", c)
            body_size = struct.unpack(">i", cmd[len(b"MPUB t\n"):len(b"MPUB t\n") + 4])[0]
            self.assertLessEqual(body_size, 300)
            parser = V2Parser(max_msg_size=64, max_body_size=300)
            parser.feed(b"  V2" + cmd)
            self.assertEqual(parser.next_command().messages, c)  # type: ignore[union-attr]

    def test_exact_fit(self) -> None:
        """A chunk may fill max_body_size exactly: 4 + 2 * (4 + 10) = 32."""
        self.assertEqual([len(c) for c in chunks([b"x" * 10] * 4, 10, 32)], [2, 2])

    def test_rejects(self) -> None:
        """Empty bodies and bodies over max_msg_size are refused before anything is sent."""
        e = self.assertRaises(NSQWriteError, list, chunks([b"a", b""], 10, 100))
        self.assertIn("row 1: empty value", str(e))
        e = self.assertRaises(NSQWriteError, list, chunks([b"a" * 11], 10, 100))
        self.assertIn("over max_msg_size (10)", str(e))


class SplitFramesTests(SynchronousTestCase):
    def test_any_chunking(self) -> None:
        """Frames come out whole however the bytes arrive."""
        msg = Message(b"0123456789abcdef", b"body", 123, 2)
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


class ArrowTests(SynchronousTestCase):
    def test_record_batch_matches_spark(self) -> None:
        """The Arrow rows the reader emits match what Spark expects for the schema."""
        from pyspark.sql.pandas.types import to_arrow_schema
        from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType, TimestampType

        from nsqtw.spark.source import ARROW_SCHEMA, SCHEMA, NSQPartition, to_record_batch

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
        p = NSQPartition("h:1", ["0123456789abcdef"], [b"x"], [1_700_000_000_123_456_789], [3])
        rb = to_record_batch(p, "t", "c")
        row = rb.to_pylist()[0]
        self.assertEqual(row["body"], b"x")
        self.assertEqual(row["attempts"], 3)
        self.assertEqual(row["timestamp"].timestamp(), 1_700_000_000.123456)
        self.assertEqual((row["topic"], row["channel"], row["nsqd_address"]), ("t", "c", "h:1"))
