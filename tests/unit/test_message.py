"""Message: its encodings, and what a queued one costs in memory."""

from __future__ import annotations

import gc
import importlib
import os
import random
import struct
import sys
from typing import Any

from twisted.trial.unittest import SynchronousTestCase

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
        self.assertEqual(frames(msgs), b"".join(
            struct.pack(">ii", 26 + i + 4, FRAME_TYPE_MESSAGE) + m.encode() for i, m in enumerate(msgs)))
        self.assertEqual(frames([]), b"")

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


class SpeedupsLoadTests(SynchronousTestCase):
    """nsqtw.speedups uses a build of the extension only if it has every function nsqtw uses."""

    def test_an_older_build_is_not_used(self) -> None:
        """A module lacking one of the functions (another install's older build, first on the
        path) is not used at all, and the start-up line says why."""
        from nsqtw import speedups

        self.patch(os, "environ", {k: v for k, v in os.environ.items() if k != "NSQTW_NO_SPEEDUPS"})
        fake = type(sys)("_nsqtw_old_speedups")
        fake.__file__ = "/elsewhere/_nsqtw_old_speedups.so"
        for name in speedups.FUNCTIONS:
            if name != "take_publish":
                setattr(fake, name, len)
        sys.modules[fake.__name__] = fake
        self.addCleanup(sys.modules.pop, fake.__name__)
        found, note = speedups._load(fake.__name__)
        self.assertIsNone(found)
        self.assertIn("/elsewhere/_nsqtw_old_speedups.so", note)
        self.assertIn("lacks take_publish", note)
        fake.take_publish = len
        self.assertEqual(speedups._load(fake.__name__), (fake, "compiled speed-ups: in use"))

    def test_every_function_used_is_listed(self) -> None:
        """FUNCTIONS names every ``COMPILED.<name>`` the package reads (so the check above is whole)."""
        import re
        from pathlib import Path

        from nsqtw import speedups

        root = Path(speedups.__file__).parent
        used = {m for path in root.rglob("*.py") for m in re.findall(r"COMPILED\.(\w+)", path.read_text())}
        self.assertEqual(used, set(speedups.FUNCTIONS))


class SpeedupsTests(SynchronousTestCase):
    """The compiled _nsqtw_speedups (where setup.py could build it) and message.py's own
    definitions give the same frames and messages; each implementation in use is checked."""

    def implementations(self) -> list[tuple[str, Any, Any]]:
        impls = [("pure", message.PURE["frames"], message.PURE["decode_run"])]
        if message.SPEEDUPS:
            impls.append(("compiled", message.frames, message._decode_run))
        return impls

    def flight_implementations(self) -> list[tuple[str, Any, Any]]:
        impls = [("pure", message.PURE["message_ids"], message.PURE["start_flight"])]
        if message.SPEEDUPS:
            impls.append(("compiled", message.message_ids, message.start_flight))
        return impls

    def test_a_batch_put_in_flight_agrees(self) -> None:
        """IDs sliced from the data; attempts counted with nsqd's uint16 wrap; client and
        deadline set on every message; the same in both implementations."""
        client = object()
        for name, message_ids, start_flight in self.flight_implementations():
            with self.subTest(name):
                msgs = [Message(b"%016d" % i + b"body%d" % i, i, a) for i, a in enumerate([0, 1, 0xFFFE, 0xFFFF, 7])]
                ids = message_ids(msgs)
                self.assertEqual(ids, [b"%016d" % i for i in range(5)])
                self.assertFalse(any(_id_is_set(m) for m in msgs))
                start_flight(msgs, ids, client, 12.5)
                self.assertEqual([(m.id, m.attempts, m.client, m.deadline) for m in msgs],
                                 [(i, a, client, 12.5) for i, a in zip(ids, [1, 2, 0xFFFF, 0, 8], strict=True)])
                self.assertTrue(all(m.id is i for m, i in zip(msgs, ids, strict=True)))
                self.assertEqual(message_ids([]), [])
                start_flight([], [], client, 1.0)

    def test_a_bad_batch_is_refused(self) -> None:
        for name, message_ids, start_flight in self.flight_implementations():
            with self.subTest(name):
                short = Message(b"short", 1)
                with self.assertRaises((ValueError, TypeError)):
                    start_flight([Message(MSG_ID, 1)], [], None, 1.0)
                if name == "compiled":  # checked before any message is changed
                    ok = Message(MSG_ID, 1, 3)
                    with self.assertRaises(ValueError):
                        start_flight([ok, short], [MSG_ID, b"short"], None, 1.0)
                    self.assertEqual((ok.attempts, ok.client), (3, None))
                    with self.assertRaises(ValueError):
                        message_ids([ok, short])

    def end_flight_implementations(self) -> list[tuple[str, Any]]:
        impls = [("pure", message.PURE["end_flight"])]
        if message.SPEEDUPS:
            impls.append(("compiled", message.end_flight))
        return impls

    def test_a_run_of_fins_agrees(self) -> None:
        """Owned messages leave both dicts, their client cleared and timestamps collected;
        an unknown ID, a repeated one and another client's are refused with nsqd's
        reasons and change nothing; the same in both implementations."""
        me, other = object(), object()
        for name, end_flight in self.end_flight_implementations():
            with self.subTest(name):
                msgs = [Message(b"%016d" % i + b"body", 100 + i) for i in range(5)]
                ids = message.message_ids(msgs)
                message.start_flight(msgs[:4], ids[:4], me, 1.0)
                message.start_flight(msgs[4:], ids[4:], other, 1.0)
                live = dict(zip(ids, msgs, strict=True))
                owned = dict.fromkeys(ids[:3], 0.5)  # the 4th is not in the index: still finished
                timestamps: list[int] = []
                run = [ids[0], ids[3], b"x" * 16, ids[0], ids[4], ids[2]]
                failed = end_flight(live, owned, me, run, timestamps)
                self.assertEqual(failed, [(b"x" * 16, "ID not in flight"), (ids[0], "ID not in flight"),
                                          (ids[4], "client does not own message")])
                self.assertEqual(timestamps, [100, 103, 102])
                self.assertEqual(list(live), [ids[1], ids[4]])
                self.assertEqual(list(owned), [ids[1]])
                self.assertEqual([m.client for m in msgs], [None, me, None, None, other])
                self.assertEqual(end_flight(live, owned, other, [ids[4]], None), [])
                self.assertEqual((list(live), msgs[4].client), ([ids[1]], None))
                self.assertEqual(end_flight(live, owned, me, [], []), [])

    def test_fresh_records_agree(self) -> None:
        """Records made straight from ID values and bodies are what building each Message and
        encoding it gives (header with attempts 0, 16 hex digits, body), from a range or a
        list of values, in both implementations; values and bodies must pair up."""
        impls = [("pure", message.PURE["encode_new"])]
        if message.SPEEDUPS:
            impls.append(("compiled", message.encode_new))
        bodies = [b"", b"x", b"\x00" * 300, b"body"]
        for name, encode_new in impls:
            for timestamp in (0, -1, 1795341386123456789):
                for values in (range(7, 11), [0, 2**64 - 1, 0xABCDEF, 1 << 63]):
                    with self.subTest(name, timestamp=timestamp, values=values):
                        expected = [Message(b"%016x%b" % (v, b), timestamp).encode()
                                    for v, b in zip(values, bodies, strict=True)]
                        self.assertEqual(encode_new(timestamp, values, bodies), expected)
                        self.assertEqual([message.decode_message(r).body for r in expected], bodies)
            with self.subTest(name, case="unpaired"):
                self.assertEqual(encode_new(5, (), []), [])
                self.assertRaises(ValueError, encode_new, 5, (1, 2), [b"a"])
                self.assertRaises(ValueError, encode_new, 5, (1,), [b"a", b"b"])

    def test_the_module_uses_the_compiled_ones_when_built(self) -> None:
        try:
            importlib.import_module("_nsqtw_speedups")
        except ImportError:
            built = False
        else:
            built = not os.environ.get("NSQTW_NO_SPEEDUPS")
        self.assertEqual(message.SPEEDUPS, built)
        self.assertEqual(message.frames is message.PURE["frames"], not built)

    def test_frames_agree(self) -> None:
        rng = random.Random(3)
        msgs = [Message(bytes(rng.getrandbits(8) for _ in range(16 + rng.randrange(300))),
                        rng.choice([0, 1, -1, 2**63 - 1, -2**63, rng.getrandbits(62)]),
                        rng.choice([0, 1, 0xFFFF, rng.randrange(0x10000)])) for _ in range(200)]
        want = b"".join(struct.pack(">iiqH", 14 + len(m.data), FRAME_TYPE_MESSAGE, m.timestamp, m.attempts) + m.data
                        for m in msgs)
        for name, frames_, _ in self.implementations():
            with self.subTest(name):
                self.assertEqual(frames_(msgs), want)
                self.assertEqual(frames_([]), b"")
                self.assertEqual(frames_(msgs[:1]), msgs[0].frame())

    def test_frames_refuse_what_struct_refuses(self) -> None:
        for name, frames_, _ in self.implementations():
            for bad in (Message(MSG_ID, 1, 0x10000), Message(MSG_ID, 2**63, 0), Message(MSG_ID, 1, -1)):
                with self.subTest(name, bad=bad), self.assertRaises((struct.error, OverflowError)):
                    frames_([Message(MSG_ID, 1, 1), bad])

    def test_decoded_runs_agree(self) -> None:
        rng = random.Random(5)
        records = [struct.pack(">qH", rng.getrandbits(63) * rng.choice([1, -1]), rng.randrange(0x10000))
                   + bytes(rng.getrandbits(8) for _ in range(16 + rng.randrange(100))) for _ in range(200)]
        records.append(struct.pack(">qH", 7, 1) + MSG_ID)  # the shortest valid record: an empty body
        for name, _, decode_run in self.implementations():
            with self.subTest(name):
                got = decode_run(records)
                self.assertEqual([(type(m), m.data, m.timestamp, m.attempts, m.client, m.deadline) for m in got],
                                 [(Message, r[10:], *struct.unpack(">qH", r[:10]), None, 0.0) for r in records])
                self.assertFalse(any(_id_is_set(m) for m in got))
                self.assertEqual(got[0].id, records[0][10:26])
                self.assertEqual(decode_run([]), [])
                self.assertIsNone(decode_run(records[:3] + [b"\x00" * 25] + records[3:]))

    def test_decoded_messages_are_ordinary_messages(self) -> None:
        """Copied, framed, collected: nothing tells a compiled-decoded message from another."""
        for name, _, decode_run in self.implementations():
            with self.subTest(name):
                (m,) = decode_run([Message(MSG_ID + b"body", 9, 2).encode()])
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
        """Seven or eight slots would take 96 bytes with the collector's header, six take 80."""
        self.assertEqual(len(Message.__slots__), 6)
        if sys.implementation.name == "cpython" and sys.maxsize > 2**32:
            self.assertEqual(sys.getsizeof(Message(MSG_ID, 0)), 80)

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
