"""Message: its encodings, and what a queued one costs in memory."""

from __future__ import annotations

import gc
import importlib
import inspect
import itertools
import os
import random
import shutil
import struct
import sys
import tempfile
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

from twisted.trial.unittest import SynchronousTestCase

from nsqtw import speedups
from nsqtw.core import message
from nsqtw.core.message import FRAME_TYPE_MESSAGE, Message, decode_message, decode_messages, frames
from tests.unit.test_protocol_v2 import Consumer, publish

MSG_ID = b"0123456789abcdef"


def _id_is_set(m: Message) -> bool:
    """Whether the ``id`` slot holds an object, asked without ``__getattr__``'s slicing."""
    try:
        Message.__dict__["id"].__get__(m, Message)
    except AttributeError:
        return False
    return True


class EncodingTests(SynchronousTestCase):
    def test_encode_decode_and_frame(self) -> None:
        """nsqd's record (timestamp, attempts, ID, body) and the MESSAGE frame around it."""
        m = Message(MSG_ID + b"body", 1_700_000_000_123_456_789, 3)
        record = m.encode()
        self.assertEqual(record, struct.pack(">qH", 1_700_000_000_123_456_789, 3) + MSG_ID + b"body")
        self.assertEqual(m.frame(), struct.pack(">ii", len(record) + 4, FRAME_TYPE_MESSAGE) + record)
        back = decode_message(record)
        self.assertEqual((back.id, back.body, back.timestamp, back.attempts),
                         (MSG_ID, b"body", 1_700_000_000_123_456_789, 3))

    def test_too_short_a_record_is_refused(self) -> None:
        with self.assertRaises(ValueError):
            decode_message(b"\x00" * 25)

    def test_frames_of_a_batch_are_each_frame_back_to_back(self) -> None:
        msgs = [Message(MSG_ID + b"x" * i, 1_000 + i, i) for i in range(5)]
        self.assertEqual(frames(msgs), [b"".join(
            struct.pack(">ii", 26 + i + 4, FRAME_TYPE_MESSAGE) + m.encode() for i, m in enumerate(msgs))])
        self.assertEqual(frames([]), [])

    def test_the_ids_of_frames_written_back_to_back_are_read_back_in_order(self) -> None:
        """Bodies of every size, one past a wire piece: a worker reads these IDs from a DELIVER."""
        ids = [b"%016d" % i for i in range(6)]
        bodies = [b"", b"x", b"y" * 200, b"z" * (message.WIRE_PIECE + 1), b"w" * 3, b"v"]
        msgs = [Message(i + b, 5, 1) for i, b in zip(ids, bodies, strict=True)]
        self.assertEqual(message.frame_ids(b"".join(frames(msgs))), ids)
        self.assertEqual(message.frame_ids(b""), [])

    def test_a_run_of_records_decodes_as_each_would(self) -> None:
        records = [Message(MSG_ID + b"b" * i, 7 + i, i).encode() for i in range(4)]
        bad: list[ValueError] = []
        got = decode_messages(records, bad.append)
        want = [decode_message(r) for r in records]
        self.assertEqual([(m.data, m.timestamp, m.attempts) for m in got],
                         [(m.data, m.timestamp, m.attempts) for m in want])
        self.assertEqual(bad, [])
        self.assertEqual(decode_messages([], bad.append), [])

    def test_a_bad_record_in_a_run_is_reported_and_skipped(self) -> None:
        """Only the short record goes: the good ones on either side of it are decoded in order."""
        good = [Message(MSG_ID + b"%d" % i, i).encode() for i in range(3)]
        bad: list[ValueError] = []
        got = decode_messages([good[0], b"\x00" * 25, good[1], b"", good[2]], bad.append)
        self.assertEqual([m.body for m in got], [b"0", b"1", b"2"])
        self.assertEqual([str(e) for e in bad], ["invalid message buffer size (25)", "invalid message buffer size (0)"])

    def test_copy_keeps_data_timestamp_and_delay(self) -> None:
        m = Message(MSG_ID + b"b", 5, 0, 2.5)
        c = m.copy()
        self.assertIs(c.data, m.data)
        self.assertEqual((c.timestamp, c.attempts, c.deadline), (5, 0, 2.5))


class BuildTests(SynchronousTestCase):
    """nsqtw.speedups: the compiled modules are all used or none is, and the start-up line says which."""

    def setUp(self) -> None:
        self.patch(os, "environ", {k: v for k, v in os.environ.items() if k != "NSQTW_NO_SPEEDUPS"})
        # not mktemp(): under pytest that would litter the working directory
        self.root = Path(tempfile.mkdtemp(prefix="nsqtw-build-"))
        self.addCleanup(shutil.rmtree, self.root, True)
        for name in speedups.MODULES:
            source = self.root.joinpath(*name.split(".")).with_suffix(".py")
            source.parent.mkdir(parents=True, exist_ok=True)
            source.write_text("")
            os.utime(source, (1000, 1000))

    def build(self, *names: str, at: int = 2000) -> None:
        for name in names:
            built = self.root.joinpath(*name.split(".")).with_name(name.rpartition(".")[2] + EXTENSION_SUFFIXES[0])
            built.write_bytes(b"")
            os.utime(built, (at, at))

    def test_a_whole_build_is_used(self) -> None:
        self.build(speedups.GROUP, *speedups.MODULES)
        used, note = speedups._choose(speedups.MODULES, str(self.root))
        self.assertTrue(used)
        self.assertEqual(note, f"compiled speed-ups: in use (mypyc: {', '.join(speedups.MODULES)})")

    def test_a_partial_build_is_not_used(self) -> None:
        """Compiled code calls the other compiled modules directly: half a build would mix two kinds of Message."""
        self.build(speedups.GROUP, *speedups.MODULES[1:])
        self.assertEqual(speedups._choose(speedups.MODULES, str(self.root)),
                         (False, "compiled speed-ups: not built (install with mypy and a C compiler to build them), "
                                 "using the pure-Python path"))
        self.build(*speedups.MODULES)
        self.assertTrue(speedups._choose(speedups.MODULES, str(self.root))[0])
        os.remove(self.root / (speedups.GROUP + EXTENSION_SUFFIXES[0]))
        self.assertFalse(speedups._choose(speedups.MODULES, str(self.root))[0])

    def test_in_a_checkout_a_build_older_than_its_source_is_not_used(self) -> None:
        """An edit after ``setup.py build_ext --inplace`` would otherwise be shadowed by the old build."""
        self.build(speedups.GROUP, *speedups.MODULES, at=500)
        self.assertTrue(speedups._choose(speedups.MODULES, str(self.root))[0])  # installed: as the wheel made it
        (self.root / "setup.py").write_text("")
        used, note = speedups._choose(speedups.MODULES, str(self.root))
        self.assertFalse(used)
        self.assertIn(f"the build is older than {', '.join(speedups.MODULES)}", note)
        self.build(speedups.GROUP, at=2000)
        self.assertTrue(speedups._choose(speedups.MODULES, str(self.root))[0])

    def test_the_environment_can_turn_them_off(self) -> None:
        self.build(speedups.GROUP, *speedups.MODULES)
        os.environ["NSQTW_NO_SPEEDUPS"] = "1"
        self.assertEqual(speedups._choose(speedups.MODULES, str(self.root)),
                         (False, "compiled speed-ups: off (NSQTW_NO_SPEEDUPS is set), using the pure-Python path"))

    def test_unused_builds_are_passed_over_for_the_source(self) -> None:
        """The finder install() puts first finds each listed module's ``.py`` although a build sits beside it."""
        self.build(speedups.GROUP, *speedups.MODULES)
        finder = speedups._PureFinder(speedups.MODULES)
        name = speedups.MODULES[0]
        package = str(self.root.joinpath(*name.split(".")[:-1]))
        spec = finder.find_spec(name, [package])
        assert spec is not None
        self.assertEqual(spec.origin, str(self.root.joinpath(*name.split(".")).with_suffix(".py")))
        self.assertIsNone(finder.find_spec("nsqtw.core.topic", [package]))

    def test_the_modules_in_use_are_the_build_the_start_up_line_names(self) -> None:
        """Every listed module is the compiled build when NOTE says "in use", and its ``.py`` otherwise."""
        for name in speedups.MODULES:
            module = importlib.import_module(name)
            assert module.__file__ is not None
            self.assertEqual(module.__file__.endswith(".py"), not speedups.IN_USE, (module.__file__, speedups.NOTE))
        self.assertEqual(message.SPEEDUPS, speedups.IN_USE)
        self.assertEqual(speedups.NOTE.startswith("compiled speed-ups: in use"), speedups.IN_USE)


class BatchTests(SynchronousTestCase):
    """The batch functions of the build in use (compiled or pure: .ci/run runs this module against
    both) give the frames, records and flight changes nsqd's formats and rules ask for."""

    def test_a_batch_put_in_flight(self) -> None:
        """IDs sliced from the data; attempts counted with nsqd's uint16 wrap; client and
        deadline set on every message."""
        client = object()
        msgs = [Message(b"%016d" % i + b"body%d" % i, i, a) for i, a in enumerate([0, 1, 0xFFFE, 0xFFFF, 7])]
        ids = message.message_ids(msgs)
        self.assertEqual(ids, [b"%016d" % i for i in range(5)])
        self.assertFalse(any(_id_is_set(m) for m in msgs))
        message.start_flight(msgs, ids, client, 12.5)
        self.assertEqual([(m.id, m.attempts, m.client, m.deadline) for m in msgs],
                         [(i, a, client, 12.5) for i, a in zip(ids, [1, 2, 0xFFFF, 0, 8], strict=True)])
        self.assertTrue(all(m.id is i for m, i in zip(msgs, ids, strict=True)))
        self.assertEqual(message.message_ids([]), [])
        message.start_flight([], [], client, 1.0)

    def test_a_bad_batch_is_refused(self) -> None:
        with self.assertRaises(ValueError):
            message.start_flight([Message(MSG_ID, 1)], [], None, 1.0)

    def test_a_run_of_fins(self) -> None:
        """Owned messages leave ``live``, their client cleared and timestamps collected; an
        unknown ID, a repeated one and another client's are refused with nsqd's reasons and
        change nothing."""
        me, other = object(), object()
        msgs = [Message(b"%016d" % i + b"body", 100 + i) for i in range(5)]
        ids = message.message_ids(msgs)
        message.start_flight(msgs[:4], ids[:4], me, 1.0)
        message.start_flight(msgs[4:], ids[4:], other, 1.0)
        live = dict(zip(ids, msgs, strict=True))
        timestamps: list[int] = []
        run = [ids[0], ids[3], b"x" * 16, ids[0], ids[4], ids[2]]
        failed = message.end_flight(live, me, run, timestamps)
        self.assertEqual(failed, [(b"x" * 16, "ID not in flight"), (ids[0], "ID not in flight"),
                                  (ids[4], "client does not own message")])
        self.assertEqual(timestamps, [100, 103, 102])
        self.assertEqual(list(live), [ids[1], ids[4]])
        self.assertEqual([m.client for m in msgs], [None, me, None, None, other])
        self.assertEqual(message.end_flight(live, other, [ids[4]], None), [])
        self.assertEqual((list(live), msgs[4].client), ([ids[1]], None))
        self.assertEqual(message.end_flight(live, me, [], []), [])

    def test_fresh_records(self) -> None:
        """Records made straight from ID values and bodies are what building each Message and
        encoding it gives (header with attempts 0, 16 hex digits, body), from a range or a
        list of values; values and bodies must pair up, and an ID value must fit 64 bits.
        The ranges include ones within one millisecond's 4096 IDs (their shared digits are
        formatted once), ones that cross into the next, the top of 64 bits and a step."""
        bodies = [b"", b"x", b"\x00" * 300, b"body"]
        for timestamp in (0, -1, 1795341386123456789):
            for values in (range(7, 11), [0, 2**64 - 1, 0xABCDEF, 1 << 63], range(4092, 4096),
                           range(4094, 4098), range(0x0B1E5A3F00000FFE, 0x0B1E5A3F00001002),
                           range(2**64 - 4, 2**64), range(10, 18, 2)):
                with self.subTest(timestamp=timestamp, values=values):
                    expected = [Message(b"%016x%b" % (v, b), timestamp).encode()
                                for v, b in zip(values, bodies, strict=True)]
                    self.assertEqual(message.encode_new(timestamp, values, bodies), expected)
                    self.assertEqual([message.decode_message(r).body for r in expected], bodies)
        for values in (range(5, 6), [2**64 - 1], [0]):  # one message: a PUB's batch
            with self.subTest(values=values):
                self.assertEqual(message.encode_new(7, values, [b"x"]),
                                 [Message(b"%016x%b" % (values[0], b"x"), 7).encode()])
        self.assertEqual(message.encode_new(5, [], []), [])
        self.assertRaises(ValueError, message.encode_new, 5, (1, 2), [b"a"])
        self.assertRaises(ValueError, message.encode_new, 5, (1,), [b"a", b"b"])
        for value in (-1, 2**64):
            with self.subTest(value=value), self.assertRaises(OverflowError):
                message.encode_new(5, [value], [b"a"])

    def test_frames(self) -> None:
        """Each message's frame as ``struct`` packs it, back to back."""
        rng = random.Random(3)
        msgs = [Message(bytes(rng.getrandbits(8) for _ in range(16 + rng.randrange(300))),
                        rng.choice([0, 1, -1, 2**63 - 1, -2**63, rng.getrandbits(62)]),
                        rng.choice([0, 1, 0xFFFF, rng.randrange(0x10000)])) for _ in range(200)]
        want = b"".join(struct.pack(">iiqH", 14 + len(m.data), FRAME_TYPE_MESSAGE, m.timestamp, m.attempts) + m.data
                        for m in msgs)
        self.assertEqual(b"".join(frames(msgs)), want)
        self.assertEqual(frames([]), [])
        self.assertEqual(frames(msgs[:1]), [msgs[0].frame()])

    def test_frames_come_in_pieces_of_whole_frames(self) -> None:
        """A big batch is cut into pieces of about WIRE_PIECE bytes, each ending with a whole frame."""
        msgs = [Message(MSG_ID + bytes([i % 251]) * (100 + i * 7 % 900), i, 1) for i in range(500)]
        pieces = frames(msgs)
        self.assertGreater(len(pieces), 10)
        self.assertEqual(b"".join(pieces), b"".join(m.frame() for m in msgs))
        for piece in pieces[:-1]:
            self.assertGreaterEqual(len(piece), message.WIRE_PIECE)
            self.assertLess(len(piece), message.WIRE_PIECE + 18 + 16 + 1000)
        ends = set(itertools.accumulate(len(m.frame()) for m in msgs))
        self.assertTrue(set(itertools.accumulate(map(len, pieces))) <= ends, "a frame was split")
        big = Message(MSG_ID + b"x" * (3 * message.WIRE_PIECE), 1, 1)
        self.assertEqual(frames([big]), [big.frame()])
        small = msgs[:3]
        mixed = frames([*small, big, *small])
        self.assertEqual(mixed, [b"".join(m.frame() for m in [*small, big]), b"".join(m.frame() for m in small)])
        self.assertEqual(frames(small), [b"".join(m.frame() for m in small)], "nothing left over between calls")

    def test_frames_refuse_what_struct_refuses(self) -> None:
        """Numbers out of their fields' range raise (an error of struct's, or OverflowError or ValueError)."""
        for bad in (Message(MSG_ID, 1, 0x10000), Message(MSG_ID, 2**63, 0), Message(MSG_ID, 1, -1),
                    Message(MSG_ID, -2**63 - 1, 0)):
            with self.subTest(bad=bad), self.assertRaises((struct.error, OverflowError, ValueError)):
                frames([Message(MSG_ID, 1, 1), bad])

    def test_decoded_runs(self) -> None:
        """Each record as ``struct`` reads it, the ID left unsliced; None for a run with a short record."""
        rng = random.Random(5)
        records = [struct.pack(">qH", rng.getrandbits(63) * rng.choice([1, -1]), rng.randrange(0x10000))
                   + bytes(rng.getrandbits(8) for _ in range(16 + rng.randrange(100))) for _ in range(200)]
        records.append(struct.pack(">qH", 7, 1) + MSG_ID)  # the shortest valid record: an empty body
        records.append(struct.pack(">qH", -2**63, 0xFFFF) + MSG_ID)  # the extremes
        got = message._decode_run(records)
        assert got is not None
        self.assertEqual([(type(m), m.data, m.timestamp, m.attempts, m.client, m.deadline) for m in got],
                         [(Message, r[10:], *struct.unpack(">qH", r[:10]), None, 0.0) for r in records])
        self.assertFalse(any(_id_is_set(m) for m in got))
        self.assertEqual(got[0].id, records[0][10:26])
        self.assertEqual(message._decode_run([]), [])
        self.assertIsNone(message._decode_run(records[:3] + [b"\x00" * 25] + records[3:]))

    def test_decoded_messages_are_ordinary_messages(self) -> None:
        """Copied, framed, collected: nothing tells a decoded message from another."""
        (m,) = decode_messages([Message(MSG_ID + b"body", 9, 2).encode()], self.fail)
        self.assertEqual(m.copy().encode(), m.encode())
        m.client = m  # a cycle the collector must be able to see through the slots
        self.assertIn(m, gc.get_referents(m))
        m.client = None
        self.assertEqual(sys.getsizeof(m), sys.getsizeof(Message(MSG_ID, 0)))


class MemoryTests(SynchronousTestCase):
    """docs/performance.md, "Memory": a held message is one small object and one bytes object."""

    def test_the_id_is_sliced_only_when_asked_for(self) -> None:
        m = Message(MSG_ID + b"body", 1)
        self.assertFalse(_id_is_set(m))
        self.assertEqual(m.id, MSG_ID)
        self.assertTrue(_id_is_set(m))
        self.assertIs(m.id, m.id)  # cached once sliced
        with self.assertRaises(AttributeError):
            m.nothing  # noqa: B018 -- other missing names still raise

    def test_six_slots(self) -> None:
        """Seven or eight slots would take 96 bytes with the collector's header, six take 80; the
        compiled class (a native class, its fields in place of the slots) has a pointer more, 88."""
        fields = {k for k, v in vars(Message).items() if inspect.isdatadescriptor(v)} - {"body"}  # (a property)
        self.assertEqual(fields, {"data", "id", "timestamp", "attempts", "client", "deadline"})
        if not speedups.IN_USE:
            self.assertEqual(len(Message.__slots__), 6)
        if sys.implementation.name == "cpython" and sys.maxsize > 2**32:
            self.assertEqual(sys.getsizeof(Message(MSG_ID, 0)), 88 if speedups.IN_USE else 80)

    def test_queued_messages_hold_no_id_object_until_handed_out(self) -> None:
        """Published messages wait in the channel's memory without an ID object; the channel
        slices it as it puts them in flight, and the consumer gets the right IDs."""
        from tests.helpers import make_nsqd

        nsqd, clock = make_nsqd()
        consumer = Consumer(nsqd, clock, "t", "c", rdy=0)
        publish(nsqd, clock, "t", b"a", b"b", b"c")
        queued = list(nsqd.topics["t"].channels["c"].memory)
        self.assertEqual(len(queued), 3)
        self.assertFalse(any(_id_is_set(m) for m in queued))
        consumer.send(b"RDY 3\n")
        got = consumer.messages()
        self.assertEqual([body for _, _, body in got], [b"a", b"b", b"c"])
        self.assertEqual([msg_id for _, msg_id, _ in got], [m.data[:16] for m in queued])
        self.assertTrue(all(_id_is_set(m) for m in queued))
        for _, msg_id, _ in got:
            consumer.fin(msg_id)
        self.assertEqual(len(nsqd.topics["t"].channels["c"].in_flight), 0)
