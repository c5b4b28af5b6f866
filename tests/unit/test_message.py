"""Message: its encodings, and what a queued one costs in memory."""

from __future__ import annotations

import struct
import sys

from twisted.trial.unittest import SynchronousTestCase

from nsqtw.core.message import FRAME_TYPE_MESSAGE, Message, decode_message
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
