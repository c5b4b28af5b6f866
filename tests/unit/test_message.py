"""Message: its encodings, and what a queued one costs in memory."""

from __future__ import annotations

import struct
import sys

from twisted.trial.unittest import SynchronousTestCase

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
